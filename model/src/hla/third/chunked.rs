//! The chunk-parallel form of D1 (spec §8, gated by product decay). Per chunk, with
//! `W^γ = D ⊙ (Q Kᵀ)` and the inclusive per-token rows `A_u = (S_u q_u)ᵀ`,
//! `B_u = q_uᵀ P_u`:
//!
//! ```text
//! A   = diag(a) Q Sᵀ + W^γ K
//! B   = diag(a) Q P + W^γ V
//! O   = diag(a³) Q Y + ((Q Aᵀ) ⊙ D³) B
//! Y  ← ρ³ Y + Aᵀ diag(e³) B
//! S  ← ρ S + Kᵀ diag(e) K ;  P ← ρ P + Kᵀ diag(e) V
//! ```
//!
//! (`Q Sᵀ` has rows `(S q_u)ᵀ`: `S` is symmetric when built from keys, and the
//! transpose keeps the forms equal for any initial state.)
//!
//! Without decay this is the spec's `O_c = Q_c Y + (T ⊙ L) B`, `Y += Aᵀ B`, with
//! `T ⊙ L = (Q Aᵀ) ⊙ L` computed without the C³ product `W Wᵀ`.

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
    let kt = k.clone().swap_dims(2, 3);
    let w_gamma = decay.mask(q.clone().matmul(kt.clone()), 1.0);
    let a = decay.since_start(q.clone().matmul(state.s.clone().swap_dims(2, 3)), 1.0)
        + w_gamma.clone().matmul(k.clone());
    let b = decay.since_start(q.clone().matmul(state.p.clone()), 1.0) + w_gamma.matmul(v.clone());
    let qa = decay.mask(q.clone().matmul(a.clone().swap_dims(2, 3)), 3.0);
    let o = decay.since_start(q.matmul(state.y.clone()), 3.0) + qa.matmul(b.clone());
    let y = decay.whole(state.y, 3.0) + a.swap_dims(2, 3).matmul(decay.until_end(b, 3.0));
    let s = decay.whole(state.s, 1.0) + kt.clone().matmul(decay.until_end(k, 1.0));
    let p = decay.whole(state.p, 1.0) + kt.matmul(decay.until_end(v, 1.0));
    (o, State { s, p, y })
}
