//! This order's node ([`crate::hla::node`]): the forward pass is the composed form's
//! [`products`]; the backward pass, with `∂S`, `∂Z` the gradients of the state after a
//! chunk, `G = (∂O Vᵀ) ⊙ D²` and `H = (∂A Kᵀ) ⊙ D`, is per chunk
//!
//! ```text
//! ∂V = Pᵀ ∂O + diag(e²) A ∂Z
//! ∂A = Gᵀ Q + diag(e²) V ∂Zᵀ
//! ∂Q = diag(a²) ∂O Zᵀ + G A + diag(a) ∂A S + H K
//! ∂K = Wᵀ ∂A + Hᵀ Q + diag(e) K (∂S + ∂Sᵀ)
//! ∂S ← ρ ∂S + (diag(a) ∂A)ᵀ Q,  ∂Z ← ρ² ∂Z + Qᵀ diag(a²) ∂O
//! ```
//!
//! (`S`, `Z` in a chunk's equations are its start states), every chunk at once in the
//! order the equations allow: `∂Z` after every chunk by a scan back over the chunks (its
//! update needs only `∂O`), then `G`, `∂A`, `∂V`, then `∂S` by a second scan back, then
//! `H`, `∂Q`, `∂K`. The log gates, when they need a gradient, get it from each decay
//! factor `f` as `f ⊙ ∂f` ([`DecayGrad`]), as in the CPU kernel ([`super::cpu`]).

use burn::prelude::*;

use super::State;
use super::chunked::{Products, products};
use crate::hla::HlaInput;
use crate::hla::chunks::Chunked;
use crate::hla::decay::{Decay, DecayGrad};
use crate::hla::node::{Cotangent, NodeForward, NodeGrads, NodeKernels};

/// This order's node, for [`crate::hla::node`].
pub(crate) const NODE: NodeKernels = NodeKernels {
    forward,
    backward,
    state_parts: super::state_parts,
};

/// Saves `[S starts, Z starts, W, A, P]`.
fn forward(input: &HlaInput, state: Vec<Tensor<4>>, chunk: usize) -> NodeForward {
    let Products {
        o,
        state,
        s_start,
        z_start,
        w,
        a,
        p,
        ..
    } = products(input, State::from_tensors(state), chunk);
    NodeForward {
        o,
        state: state.tensors(),
        saved: vec![s_start, z_start, w, a, p],
    }
}

/// In the order of the module's header, each tensor used up where it is last needed
/// (the backward pass's working set, like autodiff's, stays a few chunk-sized tensors),
/// and the gates' gradient gathered as its factors come.
fn backward(
    input: &HlaInput,
    saved: Vec<Tensor<5>>,
    grad: Cotangent,
    chunk: usize,
    gates: bool,
) -> NodeGrads {
    let Chunked {
        chunks,
        decay,
        q,
        k,
        v,
    } = Chunked::new(input, chunk);
    let [s_start, z_start, w, a, p] =
        <[_; 5]>::try_from(saved).unwrap_or_else(|_| unreachable!("saved by forward"));
    let [ds_last, dz_last] =
        <[_; 2]>::try_from(grad.state).unwrap_or_else(|_| unreachable!("the gradients of S and Z"));
    let g = chunks.split(grad.o);
    let mut gate = gates.then(DecayGrad::new);

    // ∂Z after every chunk; ∂Q's term through Z.
    let a2g = decay.since_start(g.clone(), 2.0);
    let dz_updates = q.clone().transpose().matmul(a2g.clone());
    let (dz, dz0) = chunks.scan_back(dz_last, dz_updates, &decay, 2.0);
    if let Some(gate) = &mut gate {
        gate.since_start(2.0, rows(a2g.clone(), q.clone().matmul(z_start.clone())));
        gate.whole(2.0, decay.whole(whole(dz.clone(), z_start.clone()), 2.0));
    }
    let dq = a2g.matmul(z_start.transpose());

    // G, ∂V, ∂A; ∂Q's term through A.
    let gm = masked(
        &decay,
        g.clone().matmul(v.clone().transpose()),
        2,
        &p,
        &mut gate,
    );
    let ea_dz = decay.until_end(a.clone(), 2.0).matmul(dz.clone());
    if let Some(gate) = &mut gate {
        gate.until_end(2.0, rows(ea_dz.clone(), v.clone()));
    }
    let dv = p.transpose().matmul(g) + ea_dz;
    let da =
        gm.clone().transpose().matmul(q.clone()) + decay.until_end(v, 2.0).matmul(dz.transpose());
    let dq = dq + gm.matmul(a);

    // ∂S after every chunk; ∂Q's term through S.
    let ada = decay.since_start(da.clone(), 1.0);
    let ds_updates = ada.clone().transpose().matmul(q.clone());
    let (ds, ds0) = chunks.scan_back(ds_last, ds_updates, &decay, 1.0);
    if let Some(gate) = &mut gate {
        let qs = q.clone().matmul(s_start.clone().transpose());
        gate.since_start(1.0, rows(ada.clone(), qs));
        gate.whole(1.0, decay.whole(whole(ds.clone(), s_start.clone()), 1.0));
    }
    let dq = dq + ada.matmul(s_start);

    // H, ∂K; ∂Q's term through W.
    let hm = masked(
        &decay,
        da.clone().matmul(k.clone().transpose()),
        1,
        &w,
        &mut gate,
    );
    let dk = w.transpose().matmul(da) + hm.clone().transpose().matmul(q);
    let dq = dq + hm.matmul(k.clone());
    let ek_sym = decay
        .until_end(k.clone(), 1.0)
        .matmul(ds.clone() + ds.transpose());
    if let Some(gate) = &mut gate {
        // k_τᵀ ∂S k_τ, half of k_τᵀ (∂S + ∂Sᵀ) k_τ.
        gate.until_end(1.0, rows(ek_sym.clone(), k) * 0.5);
    }
    let dk = dk + ek_sym;

    NodeGrads {
        q: chunks.merge(dq),
        k: chunks.merge(dk),
        v: chunks.merge(dv),
        log_g: gate.map(|gate| chunks.merge(gate.into_log_gates()).squeeze_dim(3)),
        state: vec![ds0, dz0],
    }
}

/// `∂X ⊙ D^p` for the gradient `∂X` of a product that the forward pass masked into
/// `masked = X ⊙ D^p`; gathers the mask's part of the gates' gradient, `∂X ⊙ masked`.
fn masked(
    decay: &Decay<5>,
    dx: Tensor<5>,
    p: u32,
    masked: &Tensor<5>,
    gate: &mut Option<DecayGrad<5>>,
) -> Tensor<5> {
    match gate {
        Some(gate) => {
            gate.mask(f64::from(p), dx.clone() * masked.clone());
            decay.mask(dx, p)
        }
        None => decay.mask(dx, p),
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
