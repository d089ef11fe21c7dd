//! The serial recurrence, Z-form (docs/math.md §3, gated §6):
//! `S_t = g_t S_{t−1} + k_t k_tᵀ`, `Z_t = g_t² Z_{t−1} + (S_t q_t) v_tᵀ`, `o_t = q_tᵀ Z_t`.

use burn::prelude::*;

use super::State;
use crate::hla::{HlaInput, decay::Decay, spans};

/// Token by token. `input`: see [`HlaInput`]; returns `o [batch, heads, time, dv]` and the
/// state after the last token.
pub fn recurrent(input: &HlaInput, state: State) -> (Tensor<4>, State) {
    spans::scan(input, state, 1, step)
}

/// One token: `token` has `time = 1`; returns `o_t [batch, heads, 1, dv]`.
pub fn step(token: &HlaInput, state: State) -> (Tensor<4>, State) {
    let g = Decay::over(token.log_g.as_ref());
    let (q, k, v) = (token.q.clone(), token.k.clone(), token.v.clone());
    let s = g.whole(state.s, 1.0) + k.clone().swap_dims(2, 3).matmul(k);
    let s_q = s.clone().matmul(q.clone().swap_dims(2, 3));
    let z = g.whole(state.z, 2.0) + s_q.matmul(v);
    (q.matmul(z.clone()), State { s, z })
}
