//! The chunk-parallel form, every chunk at once. Per chunk:
//!
//! ```text
//! O   = diag(a) Q S + ((Q Kᵀ) ⊙ D) V
//! S  ← ρ S + Kᵀ diag(e) V
//! ```
//!
//! with `S` at the start of every chunk from a scan over the chunks' updates.

use burn::prelude::*;

use super::State;
use crate::hla::{HlaInput, chunks::Chunked};

/// `chunk` tokens per chunk (the last chunk is padded). `input`: see [`HlaInput`];
/// returns `o [batch, heads, time, dv]` and the final state. On CPU devices the fused form
/// ([`super::fused`]) computes the same numbers, on GPU devices the kernels of
/// [`super::cube`]; this composed one serves the others and is their test oracle,
/// [`chunked_composed`].
pub fn chunked(input: &HlaInput, state: State, chunk: usize) -> (Tensor<4>, State) {
    #[cfg(any(feature = "ndarray", feature = "flex"))]
    if crate::hla::fused::applies(input) {
        return crate::hla::fused::run(input, state, chunk);
    }
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    if crate::hla::cube::applies(input) {
        return crate::hla::cube::run(input, state, chunk);
    }
    chunked_composed(input, state, chunk)
}

/// The composed chunk-parallel form (see [`chunked`]).
pub fn chunked_composed(input: &HlaInput, state: State, chunk: usize) -> (Tensor<4>, State) {
    let Chunked {
        chunks,
        decay,
        q,
        k,
        v,
    } = Chunked::new(input, chunk);
    let kt = k.transpose();

    let ds = kt.clone().matmul(decay.until_end(v.clone(), 1.0));
    let (s_start, s) = chunks.scan(state.s, ds, &decay, 1.0);
    let scores = decay.mask(q.clone().matmul(kt), 1);
    let o = decay.since_start(q.matmul(s_start), 1.0) + scores.matmul(v);
    (chunks.merge(o), State { s })
}
