//! What every order's backward pass shares: its inputs in chunks, the one step every state
//! takes (a state read by a row product gets its gradient by a scan back over the chunks),
//! the masked products, and `∂Q` and the gates' gradient gathered along the way (on a GPU
//! device each kernel adds its term of `∂Q` to the terms before it and gathers its parts
//! of the gates' gradient: no sums of their own).

use burn::prelude::*;

use super::NodeGrads;
use crate::hla::chunks::{Chunked, Chunks};
use crate::hla::decay::{Decay, DecayGrad};

/// A backward pass in progress: the chunk layout and decay of its input, `∂Q` so far, a
/// state's read whose term of `∂Q` the next product adds, and the gates' gradient so far
/// (when they need one).
pub(crate) struct Backward {
    chunks: Chunks,
    decay: Decay<5>,
    dq: Option<Tensor<5>>,
    pending: Option<Pending>,
    gate: Option<DecayGrad<5>>,
}

/// A read's term of `∂Q`, `diag(a^p) ∂Y Xᵀ` (`… X` when `transposed`), and its parts of
/// the gates' gradient (from `a^p` and `ρ^p`), left to the product that takes the same `∂Y`
/// next (on a GPU device its kernel adds them).
struct Pending {
    x_start: Tensor<5>,
    p: u32,
    transposed: bool,
}

/// What [`Backward::read`] gives: the state's gradient after every chunk `[b, h, chunks,
/// rows, cols]`, and at the start `[b, h, rows, cols]`.
pub(crate) struct Read {
    pub(crate) after: Tensor<5>,
    pub(crate) first: Tensor<4>,
}

impl Backward {
    /// For the input in chunks `x`, with the output's gradient `o`: the pass, and `[q, k,
    /// v, ∂o]` in chunks.
    pub(crate) fn new(x: Chunked, o: Tensor<4>, gates: bool) -> (Self, [Tensor<5>; 4]) {
        let Chunked {
            chunks,
            decay,
            q,
            k,
            v,
        } = x;
        let g = chunks.split(o);
        let gate = gates.then(DecayGrad::new);
        (
            Self {
                chunks,
                decay,
                dq: None,
                pending: None,
                gate,
            },
            [q, k, v, g],
        )
    }

    /// A state `X` read as `Y = diag(a^p) Q X` (`Y = diag(a^p) Q Xᵀ` when `transposed`),
    /// given `X` at every chunk's start, `∂Y`, and `X`'s gradient after the last chunk
    /// (zeros when `None`):
    /// `X`'s gradient by a scan back over its updates `Qᵀ diag(a^p) ∂Y` (their transpose);
    /// gathers `∂Q`'s term `diag(a^p) ∂Y Xᵀ` (`… X`) and the gates' parts from `a^p` and
    /// `ρ^p`. On a GPU device the updates and the scan back are one kernel
    /// (`crate::hla::chunks::fused::pass`); `∂Q`'s term and the gates' parts are left to the
    /// next product, which must take the same `∂Y` and `X`'s gradient after every chunk
    /// (every order's backward pass reads a state, then runs the product of the same
    /// gradient and state).
    pub(crate) fn read(
        &mut self,
        q: &Tensor<5>,
        dy: Tensor<5>,
        (x_start, x_last): (Tensor<5>, Option<Tensor<4>>),
        p: u32,
        transposed: bool,
    ) -> Read {
        debug_assert!(self.pending.is_none(), "a read's term left unadded");
        let pending = Pending {
            x_start,
            p,
            transposed,
        };
        #[cfg(gpu_kernels)]
        {
            // The updates' transpose is ∂Yᵀ diag(a^p) Q: the pass takes K = ∂Y, U = Q.
            let ku = match transposed {
                false => [q, &dy],
                true => [&dy, q],
            };
            let decay = (&self.decay, p);
            let back = crate::hla::chunks::fused::pass::pass_back(x_last.as_ref(), ku, decay);
            if let Some((after, first)) = back {
                self.pending = Some(pending);
                return Read { after, first };
            }
        }
        let ady = self.decay.since_start(dy, f64::from(p));
        let updates = match transposed {
            false => q.clone().transpose().matmul(ady.clone()),
            true => ady.clone().transpose().matmul(q.clone()),
        };
        let (after, first) = self.chunks.scan_back(x_last, updates, &self.decay, p);
        self.gather_whole(&after, &pending);
        self.add_read_term(q, ady, pending);
        Read { after, first }
    }

    /// A read's part of the gates' gradient from `ρ^p`, from `X`'s gradient after every
    /// chunk and `X` at its start.
    fn gather_whole(&mut self, after: &Tensor<5>, read: &Pending) {
        if let Some(gate) = &mut self.gate {
            let power = f64::from(read.p);
            let states = whole(after.clone(), read.x_start.clone());
            gate.whole(power, self.decay.whole(states, power));
        }
    }

    /// A read's term of `∂Q`, `diag(a^p) ∂Y Xᵀ` (`… X`), from `ady = diag(a^p) ∂Y`, and its
    /// part of the gates' gradient from `a^p`.
    fn add_read_term(&mut self, q: &Tensor<5>, ady: Tensor<5>, read: Pending) {
        let x = self::read(read.x_start, read.transposed);
        if let Some(gate) = &mut self.gate {
            let qx = q.clone().matmul(x.clone());
            gate.since_start(f64::from(read.p), rows(ady.clone(), qx));
        }
        self.add_dq(ady.matmul(x.transpose()));
    }

    /// Adds a term to `∂Q`.
    fn add_dq(&mut self, term: Tensor<5>) {
        self.dq = Some(match self.dq.take() {
            Some(dq) => dq + term,
            None => term,
        });
    }

    /// A product `Y = T U` with `T = (Q Aᵀ) ⊙ D^p`, with `A` entering the state `Y` reads,
    /// `X ← ρ^p X + Aᵀ diag(e^p) U`: from `∂Y`, `(A, U, T)` and `X`'s gradient after
    /// every chunk, `[∂U, ∂A + da]` (`da`: an earlier term of the same gradient, or none),
    /// and gathers `∂Q`'s term `G A` with `G = (∂Y Uᵀ) ⊙ D^p`. First order's output (`A =
    /// K`, `U = V`, `X = S`), hla2's (`A`, `V`, `Z`, p = 2), third order's output (`A`,
    /// `B`, `Y`, p = 3) and `W V` (`A = K`, `U = V`, `T = W`, `X = P`), AHLA's `A^γ B`
    /// (`A = K`, `U = B`, `T = A^γ`, `X = E`) and `A^γ V` (`U = V`, `X = P`); with
    /// [`Backward::key_product`], every masked product of the chunk equations. On a GPU
    /// device, one kernel ([`super::fused`]), which also adds the sums in and gathers the
    /// gates' parts.
    pub(crate) fn moment_product(
        &mut self,
        q: &Tensor<5>,
        g: Tensor<5>,
        (a, u, t): (Tensor<5>, Tensor<5>, Tensor<5>),
        (x_after, p): (Tensor<5>, u32),
        da: Option<Tensor<5>>,
    ) -> [Tensor<5>; 2] {
        let (du, da) = self.product(q, g, (a, u, t), (x_after, p), da, false);
        [du.expect("∂U, not tied to ∂A"), da]
    }

    /// [`Backward::moment_product`] of a key moment's `W K` (`A = U = K`, `T = W`): hla2's
    /// and third order's `A`, whose `∂K` is `∂U + ∂A`. Returns `∂K`.
    pub(crate) fn key_product(
        &mut self,
        q: &Tensor<5>,
        g: Tensor<5>,
        (k, w): (Tensor<5>, Tensor<5>),
        (x_after, p): (Tensor<5>, u32),
    ) -> Tensor<5> {
        self.product(q, g, (k.clone(), k, w), (x_after, p), None, true)
            .1
    }

    /// What both products share: `(∂U, ∂A + da)`, or `(None, ∂U + ∂A + da)` when `tied`;
    /// adds the pending read's term of `∂Q` (its `∂Y` is `g`).
    fn product(
        &mut self,
        q: &Tensor<5>,
        g: Tensor<5>,
        (a, u, t): (Tensor<5>, Tensor<5>, Tensor<5>),
        (x_after, p): (Tensor<5>, u32),
        da: Option<Tensor<5>>,
        tied: bool,
    ) -> (Option<Tensor<5>>, Tensor<5>) {
        debug_assert!(self.pending.as_ref().is_none_or(|r| r.p == p));
        #[cfg(gpu_kernels)]
        {
            let adds = super::fused::Adds {
                dq: self.dq.as_ref(),
                da: da.as_ref(),
                tied,
                read: self.pending.as_ref().map(|r| (&r.x_start, r.transposed)),
                gates: self.gate.is_some(),
                log_g: self.gate.as_ref().and_then(DecayGrad::summed),
            };
            let grads =
                super::fused::moment_grads(q, &g, [&a, &u, &t], &x_after, (&self.decay, p), adds);
            if let Some(grads) = grads {
                self.dq = Some(grads.dq);
                self.pending = None;
                if let (Some(gate), Some(summed)) = (&mut self.gate, grads.log_g) {
                    gate.set_summed(summed);
                }
                return (grads.du, grads.da);
            }
        }
        let power = f64::from(p);
        if let Some(r) = self.pending.take() {
            self.gather_whole(&x_after, &r);
            let ady = self.decay.since_start(g.clone(), power);
            self.add_read_term(q, ady, r);
        }
        let gm = self.masked(g.clone().matmul(u.clone().transpose()), p, &t);
        let ea_dx = self
            .decay
            .until_end(a.clone(), power)
            .matmul(x_after.clone());
        if let Some(gate) = &mut self.gate {
            gate.until_end(power, rows(ea_dx.clone(), u.clone()));
        }
        let du = t.transpose().matmul(g) + ea_dx;
        let eu = self.decay.until_end(u, power);
        let term = gm.clone().transpose().matmul(q.clone()) + eu.matmul(x_after.transpose());
        self.add_dq(gm.matmul(a));
        let (du, term) = match tied {
            true => (None, du + term),
            false => (Some(du), term),
        };
        let da = match da {
            Some(da) => da + term,
            None => term,
        };
        (du, da)
    }

    /// `∂X ⊙ D^p` for the gradient `∂X` of a product that the forward pass masked into
    /// `masked = X ⊙ D^p`; gathers the mask's part of the gates' gradient, `∂X ⊙ masked`.
    fn masked(&mut self, dx: Tensor<5>, p: u32, masked: &Tensor<5>) -> Tensor<5> {
        if let Some(gate) = &mut self.gate {
            gate.mask(f64::from(p), dx.clone() * masked.clone());
        }
        self.decay.mask(dx, p)
    }

    /// The gradients in the input's layout, from `[∂k, ∂v]` in chunks, `∂q` gathered, and
    /// the initial state's.
    pub(crate) fn finish(self, [dk, dv]: [Tensor<5>; 2], state: Vec<Tensor<4>>) -> NodeGrads {
        let chunks = self.chunks;
        NodeGrads {
            q: chunks.merge(self.dq.expect("∂Q's terms, gathered")),
            k: chunks.merge(dk),
            v: chunks.merge(dv),
            log_g: self
                .gate
                .map(|gate| chunks.merge(gate.into_log_gates()).squeeze_dim(3)),
            state,
        }
    }
}

/// `parts` as an array of `N` (what a forward pass saved, or a state's tensors).
///
/// # Panics
///
/// If there are not `N`: the forward pass and the state layout say how many.
pub(crate) fn parts<T, const N: usize>(parts: Vec<T>) -> [T; N] {
    let len = parts.len();
    <[T; N]>::try_from(parts).unwrap_or_else(|_| unreachable!("{N} parts, got {len}"))
}

/// A state as a read takes it: `X`, or `Xᵀ` when `transposed`.
fn read(x: Tensor<5>, transposed: bool) -> Tensor<5> {
    match transposed {
        false => x,
        true => x.transpose(),
    }
}

/// `x_r · y_r` for the rows of `x` and `y`, `[.., rows, 1]`: with `x` a decay-scaled
/// factor `diag(f) X` and `y` the gradient of `X`'s product, this is `f ⊙ ∂f`.
fn rows(x: Tensor<5>, y: Tensor<5>) -> Tensor<5> {
    (x * y).sum_dim(4)
}

/// `⟨x, y⟩` per chunk, `[.., 1, 1]`.
fn whole(x: Tensor<5>, y: Tensor<5>) -> Tensor<5> {
    (x * y).sum_dim(4).sum_dim(3)
}
