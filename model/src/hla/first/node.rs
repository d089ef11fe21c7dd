//! This order's node ([`crate::hla::node`]): the forward pass is the composed form's
//! [`products`]; the backward pass, with `∂S` the gradient of the state after a chunk and
//! `G = (∂O Vᵀ) ⊙ D`, is per chunk
//!
//! ```text
//! ∂Q = diag(a) ∂O Sᵀ + G K,  ∂K = Gᵀ Q + diag(e) V ∂Sᵀ,  ∂V = Mᵀ ∂O + diag(e) K ∂S
//! ∂S ← ρ ∂S + (diag(a) Q)ᵀ ∂O
//! ```
//!
//! (`S` in a chunk's equations is its start state), every chunk at once: `∂S` after every
//! chunk by a scan back over the chunks (its update needs only `∂O`), then the rest. The
//! log gates, when they need a gradient, get it from each decay factor `f` as `f ⊙ ∂f`, as
//! in the CPU kernel ([`super::cpu`]).

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

/// Saves `[S starts, M]`.
fn forward(x: Chunked, state: Option<Vec<Tensor<4>>>) -> NodeForward {
    let Products {
        o,
        state,
        s_start,
        scores,
    } = products(x, state.map(State::from_tensors));
    NodeForward {
        o,
        state: state.tensors(),
        saved: vec![s_start, scores],
    }
}

/// In the order of the module's header, each tensor used up where it is last needed, and
/// the gates' gradient gathered as its factors come.
fn backward(x: Chunked, saved: Vec<Tensor<5>>, grad: Cotangent, gates: bool) -> NodeGrads {
    let (mut pass, [q, k, v, g]) = Backward::new(x, grad.o, gates);
    let [s_start, scores] = parts(saved);
    let [ds_last] = state_or_zeros(grad.state);

    // ∂S after every chunk; ∂Q's term through S.
    let s = pass.read(&q, g.clone(), (s_start, ds_last), 1, false);

    // G; ∂V, ∂K, ∂Q's term G K.
    let [dv, dk] = pass.moment_product(&q, g, (k, v, scores), (s.after, 1), None);
    pass.finish([dk, dv], vec![s.first])
}
