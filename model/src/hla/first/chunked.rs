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
/// returns `o [batch, heads, time, dv]` and the final state. The composed form: the one
/// place this order's chunk equations are written, the test oracle of the CPU and GPU
/// kernels ([`super::cpu`], [`super::gpu`]), which [`crate::hla::forward`] runs instead
/// where they apply.
pub fn chunked(input: &HlaInput, state: State, chunk: usize) -> (Tensor<4>, State) {
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
