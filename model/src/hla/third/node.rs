//! This order's node ([`crate::hla::node`]): the forward pass is the composed form's
//! [`products`]; the backward pass, with `∂S`, `∂P`, `∂Y` the gradients of the state after
//! a chunk, `G = (∂O Bᵀ) ⊙ D³` and `H = (∂A Kᵀ + ∂B Vᵀ) ⊙ D`, is per chunk
//!
//! ```text
//! ∂B = Tᵀ ∂O + diag(e³) A ∂Y,  ∂A = Gᵀ Q + diag(e³) B ∂Yᵀ
//! ∂Q = diag(a³) ∂O Yᵀ + G A + diag(a) (∂A S + ∂B Pᵀ) + H K
//! ∂K = Wᵀ ∂A + Hᵀ Q + diag(e) K (∂S + ∂Sᵀ) + diag(e) V ∂Pᵀ
//! ∂V = Wᵀ ∂B + diag(e) K ∂P
//! ∂Y ← ρ³ ∂Y + Qᵀ diag(a³) ∂O,  ∂S ← ρ ∂S + (diag(a) ∂A)ᵀ Q,  ∂P ← ρ ∂P + Qᵀ diag(a) ∂B
//! ```
//!
//! (`S`, `P`, `Y` in a chunk's equations are its start states), every chunk at once in the
//! order the equations allow: `∂Y` after every chunk by a scan back over the chunks (its
//! update needs only `∂O`), then `G`, `∂A`, `∂B`, then `∂S` by a second scan back and
//! `H`'s part through `A`, then `∂P` by a third and `H`'s part through `B` (each read
//! followed by the product of the same gradient, [`Backward::read`]). The log gates, when
//! they need a gradient, get it from each decay factor `f` as `f ⊙ ∂f`, as in the CPU
//! kernel ([`super::cpu`]).

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

/// Saves `[S, P and Y starts, W, A, B, T]`.
fn forward(x: Chunked, state: Option<Vec<Tensor<4>>>) -> NodeForward {
    let Products {
        o,
        state,
        s_start,
        p_start,
        y_start,
        w,
        a,
        b,
        t,
    } = products(x, state.map(State::from_tensors));
    NodeForward {
        o,
        state: state.tensors(),
        saved: vec![s_start, p_start, y_start, w, a, b, t],
    }
}

/// In the order of the module's header, each tensor used up where it is last needed, and
/// the gates' gradient gathered as its factors come.
fn backward(x: Chunked, saved: Vec<Tensor<5>>, grad: Cotangent, gates: bool) -> NodeGrads {
    let (mut pass, [q, k, v, g]) = Backward::new(x, grad.o, gates);
    let [s_start, p_start, y_start, w, a, b, t] = parts(saved);
    let [ds_last, dp_last, dy_last] = state_or_zeros(grad.state);

    // ∂Y after every chunk; ∂Q's term through Y.
    let y = pass.read(&q, g.clone(), (y_start, dy_last), 3, false);

    // G, ∂B, ∂A; ∂Q's term through A.
    let [db, da] = pass.moment_product(&q, g, (a, b, t), (y.after, 3), None);

    // ∂S after every chunk (A reads Sᵀ), ∂Q's term through S; then H's part ∂A Kᵀ, as
    // the moment product of A's W K.
    let s = pass.read(&q, da.clone(), (s_start, ds_last), 1, true);
    let dk = pass.key_product(&q, da, (k.clone(), w.clone()), (s.after, 1));

    // ∂P after every chunk, ∂Q's term through P; then H's part ∂B Vᵀ, as the moment
    // product of B's W V.
    let p = pass.read(&q, db.clone(), (p_start, dp_last), 1, false);
    let [dv, dk] = pass.moment_product(&q, db, (k, v, w), (p.after, 1), Some(dk));
    pass.finish([dk, dv], vec![s.first, p.first, y.first])
}
