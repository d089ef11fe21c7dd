//! The serial recurrence (docs/math.md §7, Algorithm 2 with per-token gates):
//! `P_t = g_t P_{t−1} + k_t v_tᵀ`, `E_t = g_t E_{t−1} + k_t (q_tᵀ P_t)`, `o_t = q_tᵀ E_t`.

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
    let kt = k.swap_dims(2, 3);
    let p = g.whole(state.p, 1.0) + kt.clone().matmul(v);
    let e = g.whole(state.e, 1.0) + kt.matmul(q.clone().matmul(p.clone()));
    (q.matmul(e.clone()), State { p, e })
}
