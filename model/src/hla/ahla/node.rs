//! This order's node ([`crate::hla::node`]): the forward pass is the composed form's
//! [`products`]; the backward pass, with `∂E`, `∂P` the gradients of the state after a
//! chunk, `∂B = Aᵀ ∂O + diag(e) K ∂E`, `G = ∂O Bᵀ + ∂B Vᵀ` (the gradient of `A`) and
//! `H = G ⊙ D`, is per chunk
//!
//! ```text
//! ∂Q = diag(a) (∂O Eᵀ + ∂B Pᵀ) + H K
//! ∂K = Hᵀ Q + diag(e) (B ∂Eᵀ + V ∂Pᵀ)
//! ∂V = Aᵀ ∂B + diag(e) K ∂P
//! ∂E ← ρ ∂E + Qᵀ diag(a) ∂O,  ∂P ← ρ ∂P + Qᵀ diag(a) ∂B
//! ```
//!
//! (`P`, `E` in a chunk's equations are its start states), every chunk at once in the
//! order the equations allow: `∂E` after every chunk by a scan back over the chunks (its
//! update needs only `∂O`), then `∂B`, then `∂P` by a second scan back, then the rest. The
//! log gates, when they need a gradient, get it from each decay factor `f` as `f ⊙ ∂f`,
//! as in the CPU kernel ([`super::cpu`]).

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

/// Saves `[P starts, E starts, A, B]`.
fn forward(x: Chunked, state: Option<Vec<Tensor<4>>>) -> NodeForward {
    let Products {
        o,
        state,
        p_start,
        e_start,
        a_gamma,
        b,
    } = products(x, state.map(State::from_tensors));
    NodeForward {
        o,
        state: state.tensors(),
        saved: vec![p_start, e_start, a_gamma, b],
    }
}

/// In the order of the module's header, each tensor used up where it is last needed, and
/// the gates' gradient gathered as its factors come.
fn backward(x: Chunked, saved: Vec<Tensor<5>>, grad: Cotangent, gates: bool) -> NodeGrads {
    let (mut pass, [q, k, v, g]) = Backward::new(x, grad.o, gates);
    let [p_start, e_start, a_gamma, b] = parts(saved);
    let [dp_last, de_last] = state_or_zeros(grad.state);

    // ∂E after every chunk; ∂Q's term through E.
    let e = pass.read(&q, g.clone(), (e_start, de_last), 1, false);

    // ∂B, with G's part from O = A B (the moment product of B's A^γ).
    let b_product = (k.clone(), b, a_gamma.clone());
    let [db, dk] = pass.moment_product(&q, g, b_product, (e.after, 1), None);

    // ∂P after every chunk; ∂Q's term through P.
    let p = pass.read(&q, db.clone(), (p_start, dp_last), 1, false);

    // ∂V, with G's part from B = A V (the moment product of V's A^γ).
    let [dv, dk] = pass.moment_product(&q, db, (k, v, a_gamma), (p.after, 1), Some(dk));
    pass.finish([dk, dv], vec![p.first, e.first])
}
