//! The chunk-parallel form of AHLA (docs/math.md §7, with `R_{≤t}`, gated), every chunk at once.
//! Per chunk, with `A^γ = D ⊙ (Q Kᵀ)` and the inclusive per-token rows `B_u = q_uᵀ P_u`:
//!
//! ```text
//! B   = diag(a) Q P + A^γ V
//! O   = diag(a) Q E + A^γ B
//! E  ← ρ E + Kᵀ diag(e) B
//! P  ← ρ P + Kᵀ diag(e) V
//! ```
//!
//! `P` and `E` at the start of every chunk come from scans over the chunks' updates (`P`
//! first: `B` needs it, and `E`'s update needs `B`).
//!
//! On a GPU device the node's forward pass computes `(A^γ, B)` and `O` with one kernel
//! each (`crate::hla::chunks::fused`).
//!
//! Without decay this is docs/math.md's `O_c = Q_c E + ((Q_c K_cᵀ) ⊙ L)(Q_c P) + ((A_c A_c) ⊙ L) V_c`,
//! with `(A_c A_c) V_c` computed as `A_c (A_c V_c)`: no C³ product.

use burn::prelude::*;

use super::State;
use crate::hla::HlaInput;
use crate::hla::chunks::{Chunked, fused_output, state_or_zeros};

/// `chunk` tokens per chunk (the last chunk is padded). `input`: see [`HlaInput`];
/// returns `o [batch, heads, time, dv]` and the final state. The composed form: the one
/// place this order's chunk equations are written ([`products`]), the test oracle of the
/// CPU and GPU kernels ([`super::cpu`], [`super::gpu`]) and of the node ([`super::node`]),
/// which [`crate::hla::forward`] runs instead where they apply.
pub fn chunked(input: &HlaInput, state: State, chunk: usize) -> (Tensor<4>, State) {
    let products = products(Chunked::new(input, chunk), Some(state));
    (products.o, products.state)
}

/// The forward pass, with the products in chunks (`[b, h, chunks, chunk, n]`) that the
/// node's backward pass reuses.
pub(crate) struct Products {
    /// `P` and `E` at the start of every chunk.
    pub(crate) p_start: Tensor<5>,
    pub(crate) e_start: Tensor<5>,
    /// `A^γ = D ⊙ (Q Kᵀ)` and `B`.
    pub(crate) a_gamma: Tensor<5>,
    pub(crate) b: Tensor<5>,
    /// `o [b, h, time, dv]` and the final state.
    pub(crate) o: Tensor<4>,
    pub(crate) state: State,
}

/// The chunk equations of the module's header over the input in chunks `x`, from `state`
/// (zeros when `None`).
pub(crate) fn products(x: Chunked, state: Option<State>) -> Products {
    let Chunked {
        chunks,
        decay,
        q,
        k,
        v,
    } = x;
    let [p0, e0] = state_or_zeros(state.map(|s| s.tensors()));
    let kt = k.clone().transpose();

    let (p_start, p) = chunks.pass(p0, (&k, &v), &decay, 1);
    let fused = fused_output([&q, &k, &v, &p_start], &decay, 1, (true, false));
    let (a_gamma, b) = match fused {
        Some((a_gamma, b)) => (a_gamma.expect("the scores, asked for"), b),
        None => {
            let a_gamma = decay.mask(q.clone().matmul(kt.clone()), 1);
            let b = decay.since_start(q.clone().matmul(p_start.clone()), 1.0)
                + a_gamma.clone().matmul(v);
            (a_gamma, b)
        }
    };

    let (e_start, e) = chunks.pass(e0, (&k, &b), &decay, 1);
    let o = match fused_output([&q, &k, &b, &e_start], &decay, 1, (false, false)) {
        Some((_, o)) => o,
        None => {
            decay.since_start(q.matmul(e_start.clone()), 1.0) + a_gamma.clone().matmul(b.clone())
        }
    };
    Products {
        o: chunks.merge(o),
        state: State { p, e },
        p_start,
        e_start,
        a_gamma,
        b,
    }
}
