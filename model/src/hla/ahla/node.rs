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
use crate::hla::HlaInput;
use crate::hla::node::{Backward, Cotangent, NodeForward, NodeGrads, NodeKernels, parts, rows};

/// This order's node, for [`crate::hla::node`].
pub(crate) const NODE: NodeKernels = NodeKernels {
    forward,
    backward,
    state_parts: super::state_parts,
};

/// Saves `[P starts, E starts, A, B]`.
fn forward(input: &HlaInput, state: Vec<Tensor<4>>, chunk: usize) -> NodeForward {
    let Products {
        o,
        state,
        p_start,
        e_start,
        a_gamma,
        b,
    } = products(input, State::from_tensors(state), chunk);
    NodeForward {
        o,
        state: state.tensors(),
        saved: vec![p_start, e_start, a_gamma, b],
    }
}

/// In the order of the module's header, each tensor used up where it is last needed, and
/// the gates' gradient gathered as its factors come.
fn backward(
    input: &HlaInput,
    saved: Vec<Tensor<5>>,
    grad: Cotangent,
    chunk: usize,
    gates: bool,
) -> NodeGrads {
    let (mut pass, [q, k, v, g]) = Backward::new(input, grad.o, chunk, gates);
    let [p_start, e_start, a_gamma, b] = parts(saved);
    let [dp_last, de_last] = parts(grad.state);

    // ∂E after every chunk, then ∂B; ∂Q's term through E.
    let e = pass.read(&q, g.clone(), (e_start, de_last), 1.0, false);
    let ek = pass.decay.until_end(k.clone(), 1.0);
    let ek_de = ek.clone().matmul(e.after.clone());
    if let Some(gate) = pass.gate() {
        gate.until_end(1.0, rows(ek_de.clone(), b.clone()));
    }
    let db = a_gamma.clone().transpose().matmul(g.clone()) + ek_de;

    // ∂P after every chunk; ∂Q's term through P.
    let p = pass.read(&q, db.clone(), (p_start, dp_last), 1.0, false);
    let ek_dp = ek.matmul(p.after.clone());
    if let Some(gate) = pass.gate() {
        gate.until_end(1.0, rows(ek_dp.clone(), v.clone()));
    }

    // H; ∂Q, ∂K, ∂V.
    let grad_a = g.matmul(b.clone().transpose()) + db.clone().matmul(v.clone().transpose());
    let hm = pass.masked(grad_a, 1, &a_gamma);
    let dq = e.dq + p.dq + hm.clone().matmul(k);
    let (eb, ev) = (pass.decay.until_end(b, 1.0), pass.decay.until_end(v, 1.0));
    let dk =
        hm.transpose().matmul(q) + eb.matmul(e.after.transpose()) + ev.matmul(p.after.transpose());
    let dv = a_gamma.transpose().matmul(db) + ek_dp;
    pass.finish([dq, dk, dv], vec![p.first, e.first])
}
