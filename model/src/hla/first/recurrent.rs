//! The serial recurrence: `S_t = g_t S_{t−1} + k_t v_tᵀ`, `o_t = q_tᵀ S_t`.

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
    let s = g.whole(state.s, 1.0) + k.swap_dims(2, 3).matmul(v);
    (q.matmul(s.clone()), State { s })
}
