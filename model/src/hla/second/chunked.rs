//! The chunk-parallel form (spec §5, gated §6). Per chunk, with `W^γ = D ⊙ (Q Kᵀ)` and the
//! rows `A_u = (S_u q_u)ᵀ` of the inclusive key moment at each token,
//!
//! ```text
//! A   = diag(a) Q Sᵀ + W^γ K
//! O   = diag(a²) Q Z + ((Q Aᵀ) ⊙ D²) V
//! Z  ← ρ² Z + Aᵀ diag(e²) V
//! S  ← ρ S + Kᵀ diag(e) K
//! ```
//!
//! (`Q Sᵀ` has rows `(S q_u)ᵀ`: `S` is symmetric when built from keys, and the
//! transpose keeps the forms equal for any initial state.)
//!
//! `(Q Aᵀ) ⊙ D²` equals the spec's `(diag(a) Q S Qᵀ + W^γ Wᵀ) ⊙ D` without its C³ product
//! `W^γ Wᵀ`, and `Aᵀ diag(e²) V` its carry update (both checked in `generate.py`).

use burn::prelude::*;

use super::State;
use crate::hla::{HlaInput, decay::Decay, spans};

/// Chunk by chunk, `chunk` tokens at a time (the last chunk may be shorter).
/// `input`: see [`HlaInput`]; returns `o [batch, heads, time, dv]` and the final state.
pub fn chunked(input: &HlaInput, state: State, chunk: usize) -> (Tensor<4>, State) {
    spans::scan(input, state, chunk, chunk_step)
}

fn chunk_step(x: &HlaInput, state: State) -> (Tensor<4>, State) {
    let HlaInput { q, k, v, log_g } = x.clone();
    let decay = Decay::over(log_g.as_ref());
    let w_gamma = decay.mask(q.clone().matmul(k.clone().swap_dims(2, 3)), 1.0);
    let a = decay.since_start(q.clone().matmul(state.s.clone().swap_dims(2, 3)), 1.0)
        + w_gamma.matmul(k.clone());
    let qa = decay.mask(q.clone().matmul(a.clone().swap_dims(2, 3)), 2.0);
    let o = decay.since_start(q.matmul(state.z.clone()), 2.0) + qa.matmul(v.clone());
    let z = decay.whole(state.z, 2.0) + a.swap_dims(2, 3).matmul(decay.until_end(v, 2.0));
    let s = decay.whole(state.s, 1.0) + k.clone().swap_dims(2, 3).matmul(decay.until_end(k, 1.0));
    (o, State { s, z })
}
