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
use crate::hla::chunks::{Chunked, state_or_zeros};
use crate::hla::node::{Backward, Cotangent, NodeForward, NodeGrads, NodeKernels, parts};

/// This order's node, for [`crate::hla::node`].
pub(crate) const NODE: NodeKernels = NodeKernels {
    forward,
    backward,
    state_parts: super::state_parts,
};

/// Saves `[S starts, Z starts, W, A, P]`.
fn forward(x: Chunked, state: Option<Vec<Tensor<4>>>) -> NodeForward {
    let Products {
        o,
        state,
        s_start,
        z_start,
        w,
        a,
        p,
        ..
    } = products(x, state.map(State::from_tensors));
    NodeForward {
        o,
        state: state.tensors(),
        saved: vec![s_start, z_start, w, a, p],
    }
}

/// In the order of the module's header, each tensor used up where it is last needed
/// (the backward pass's working set, like autodiff's, stays a few chunk-sized tensors),
/// and the gates' gradient gathered as its factors come.
fn backward(x: Chunked, saved: Vec<Tensor<5>>, grad: Cotangent, gates: bool) -> NodeGrads {
    let (mut pass, [q, k, v, g]) = Backward::new(x, grad.o, gates);
    let [s_start, z_start, w, a, p] = parts(saved);
    let [ds_last, dz_last] = state_or_zeros(grad.state);

    // ∂Z after every chunk; ∂Q's term through Z.
    let z = pass.read(&q, g.clone(), (z_start, dz_last), 2, false);

    // G, ∂V, ∂A; ∂Q's term through A.
    let [dv, da] = pass.moment_product(&q, g, (a, v, p), (z.after, 2), None);

    // ∂S after every chunk (A reads Sᵀ); ∂Q's term through S.
    let s = pass.read(&q, da.clone(), (s_start, ds_last), 1, true);

    // H, ∂K; ∂Q's term through W (the moment product of A's W K).
    let dk = pass.key_product(&q, da, (k, w), (s.after, 1));
    pass.finish([dk, dv], vec![s.first, z.first])
}
