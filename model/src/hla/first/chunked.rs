//! The chunk-parallel form. Per chunk:
//!
//! ```text
//! O   = diag(a) Q S + ((Q Kᵀ) ⊙ D) V
//! S  ← ρ S + Kᵀ diag(e) V
//! ```

use burn::prelude::*;

use super::State;
use crate::hla::{HlaInput, spans};

/// Chunk by chunk, `chunk` tokens at a time (the last chunk may be shorter).
/// `input`: see [`HlaInput`]; returns `o [batch, heads, time, dv]` and the final state.
pub fn chunked(input: &HlaInput, state: State, chunk: usize) -> (Tensor<4>, State) {
    // Within a chunk the form is the definition with the carried state.
    spans::scan(input, state, chunk, super::reference)
}
