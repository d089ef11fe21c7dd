//! The serial recurrence (docs/math.md §8 D1, gated by product decay):
//! `S_t = g_t S_{t−1} + k_t k_tᵀ`, `P_t = g_t P_{t−1} + k_t v_tᵀ`,
//! `Y_t = g_t³ Y_{t−1} + (S_t q_t)(q_tᵀ P_t)`, `o_t = q_tᵀ Y_t`.

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
    let kt = k.clone().swap_dims(2, 3);
    let s = g.whole(state.s, 1.0) + kt.clone().matmul(k);
    let p = g.whole(state.p, 1.0) + kt.matmul(v);
    let s_q = s.clone().matmul(q.clone().swap_dims(2, 3));
    let y = g.whole(state.y, 3.0) + s_q.matmul(q.clone().matmul(p.clone()));
    (q.matmul(y.clone()), State { s, p, y })
}
