//! What every order's backward pass shares: its inputs in chunks, the one step every state
//! takes (a state read by a row product gets its gradient by a scan back over the chunks),
//! the masked products, and the gates' gradient gathered along the way.

use burn::prelude::*;

use super::NodeGrads;
use crate::hla::HlaInput;
use crate::hla::chunks::{Chunked, Chunks};
use crate::hla::decay::{Decay, DecayGrad};

/// A backward pass in progress: the chunk layout and decay of its input, and the gates'
/// gradient so far (when they need one).
pub(crate) struct Backward {
    chunks: Chunks,
    decay: Decay<5>,
    gate: Option<DecayGrad<5>>,
}

/// What [`Backward::read`] gives: `∂Q`'s term, the state's gradient after every chunk
/// `[b, h, chunks, rows, cols]`, and at the start `[b, h, rows, cols]`.
pub(crate) struct Read {
    pub(crate) dq: Tensor<5>,
    pub(crate) after: Tensor<5>,
    pub(crate) first: Tensor<4>,
}

impl Backward {
    /// For `input` in chunks of `chunk`, with the output's gradient `o`: the pass, and `[q,
    /// k, v, ∂o]` in chunks.
    pub(crate) fn new(
        input: &HlaInput,
        o: Tensor<4>,
        chunk: usize,
        gates: bool,
    ) -> (Self, [Tensor<5>; 4]) {
        let Chunked {
            chunks,
            decay,
            q,
            k,
            v,
        } = Chunked::new(input, chunk);
        let g = chunks.split(o);
        let gate = gates.then(DecayGrad::new);
        (
            Self {
                chunks,
                decay,
                gate,
            },
            [q, k, v, g],
        )
    }

    /// A state `X` read as `Y = diag(a^p) Q X` (`Y = diag(a^p) Q Xᵀ` when `transposed`),
    /// given `X` at every chunk's start, `∂Y`, and `X`'s gradient after the last chunk:
    /// `X`'s gradient by a scan back over its updates `Qᵀ diag(a^p) ∂Y` (their transpose),
    /// and `∂Q`'s term `diag(a^p) ∂Y Xᵀ` (`… X`); gathers the gates' parts from `a^p` and
    /// `ρ^p`. On a GPU device without the gates' gradient, the updates and `∂Q`'s term
    /// come from one kernel ([`super::fused`]).
    pub(crate) fn read(
        &mut self,
        q: &Tensor<5>,
        dy: Tensor<5>,
        (x_start, x_last): (Tensor<5>, Tensor<4>),
        p: u32,
        transposed: bool,
    ) -> Read {
        #[cfg(gpu_kernels)]
        if self.gate.is_none()
            && let Some((updates, dq)) =
                super::fused::state_read(q, &dy, &x_start, &self.decay, p, transposed)
        {
            let (after, first) = self.chunks.scan_back(x_last, updates, &self.decay, p);
            return Read { dq, after, first };
        }
        let power = f64::from(p);
        let ady = self.decay.since_start(dy, power);
        let updates = match transposed {
            false => q.clone().transpose().matmul(ady.clone()),
            true => ady.clone().transpose().matmul(q.clone()),
        };
        let (after, first) = self.chunks.scan_back(x_last, updates, &self.decay, p);
        let read = |x: Tensor<5>| match transposed {
            false => x,
            true => x.transpose(),
        };
        if let Some(gate) = &mut self.gate {
            let qx = q.clone().matmul(read(x_start.clone()));
            gate.since_start(power, rows(ady.clone(), qx));
            let states = whole(after.clone(), x_start.clone());
            gate.whole(power, self.decay.whole(states, power));
        }
        Read {
            dq: ady.matmul(read(x_start).transpose()),
            after,
            first,
        }
    }

    /// A product `Y = T U` with `T = (Q Aᵀ) ⊙ D^p`, with `A` entering the state `Y` reads,
    /// `X ← ρ^p X + Aᵀ diag(e^p) U`: from `∂Y`, `(A, U, T)` and `X`'s gradient after
    /// every chunk, `[∂U, ∂A, ∂Q's term G A]` with `G = (∂Y Uᵀ) ⊙ D^p`. First order's
    /// output (`A = K`, `U = V`, `X = S`), hla2's (`A`, `V`, `Z`, p = 2) and its `A`'s
    /// `W K` (`A = U = K`, `T = W`, `X = S`; `∂K` the sum of the first two), third order's
    /// output (`A`, `B`, `Y`, p = 3), its `W K` (as hla2's) and `W V` (`A = K`, `U = V`,
    /// `T = W`, `X = P`), AHLA's `A^γ B` (`A = K`, `U = B`, `T = A^γ`, `X = E`) and `A^γ V`
    /// (`U = V`, `X = P`): every masked product of the chunk equations. On a GPU device
    /// without the gates' gradient, one kernel ([`super::fused`]).
    pub(crate) fn moment_product(
        &mut self,
        q: &Tensor<5>,
        g: Tensor<5>,
        (a, u, t): (Tensor<5>, Tensor<5>, Tensor<5>),
        x_after: Tensor<5>,
        p: u32,
    ) -> [Tensor<5>; 3] {
        #[cfg(gpu_kernels)]
        if self.gate.is_none()
            && let Some(grads) =
                super::fused::moment_grads(q, &g, [&a, &u, &t], &x_after, &self.decay, p)
        {
            return grads;
        }
        let power = f64::from(p);
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
        let da = gm.clone().transpose().matmul(q.clone()) + eu.matmul(x_after.transpose());
        [du, da, gm.matmul(a)]
    }

    /// `∂X ⊙ D^p` for the gradient `∂X` of a product that the forward pass masked into
    /// `masked = X ⊙ D^p`; gathers the mask's part of the gates' gradient, `∂X ⊙ masked`.
    fn masked(&mut self, dx: Tensor<5>, p: u32, masked: &Tensor<5>) -> Tensor<5> {
        if let Some(gate) = &mut self.gate {
            gate.mask(f64::from(p), dx.clone() * masked.clone());
        }
        self.decay.mask(dx, p)
    }

    /// The gradients in the input's layout, from `[∂q, ∂k, ∂v]` in chunks and the initial
    /// state's.
    pub(crate) fn finish(self, [dq, dk, dv]: [Tensor<5>; 3], state: Vec<Tensor<4>>) -> NodeGrads {
        let chunks = self.chunks;
        NodeGrads {
            q: chunks.merge(dq),
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

/// `x_r · y_r` for the rows of `x` and `y`, `[.., rows, 1]`: with `x` a decay-scaled
/// factor `diag(f) X` and `y` the gradient of `X`'s product, this is `f ⊙ ∂f`.
fn rows(x: Tensor<5>, y: Tensor<5>) -> Tensor<5> {
    (x * y).sum_dim(4)
}

/// `⟨x, y⟩` per chunk, `[.., 1, 1]`.
fn whole(x: Tensor<5>, y: Tensor<5>) -> Tensor<5> {
    (x * y).sum_dim(4).sum_dim(3)
}
