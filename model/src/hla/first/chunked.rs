//! The chunk-parallel form, every chunk at once. Per chunk:
//!
//! ```text
//! O   = diag(a) Q S + ((Q Kᵀ) ⊙ D) V
//! S  ← ρ S + Kᵀ diag(e) V
//! ```
//!
//! with `S` at the start of every chunk from a scan over the chunks' updates. On a GPU
//! device the node's forward pass computes the scores and `O` with one kernel
//! (`crate::hla::chunks::fused`).

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
    /// `S` at the start of every chunk.
    pub(crate) s_start: Tensor<5>,
    /// `M = (Q Kᵀ) ⊙ D`.
    pub(crate) scores: Tensor<5>,
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
    let [s0] = state_or_zeros(state.map(|s| s.tensors()));
    let kt = k.clone().transpose();

    let (s_start, s) = chunks.pass(s0, (&k, &v), &decay, 1);
    let fused = fused_output([&q, &k, &v, &s_start], &decay, 1, (true, false));
    let (scores, o) = match fused {
        Some((scores, o)) => (scores.expect("the scores, asked for"), o),
        None => {
            let scores = decay.mask(q.clone().matmul(kt), 1);
            let o = decay.since_start(q.matmul(s_start.clone()), 1.0) + scores.clone().matmul(v);
            (scores, o)
        }
    };
    Products {
        o: chunks.merge(o),
        state: State { s },
        s_start,
        scores,
    }
}
