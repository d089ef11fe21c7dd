//! The serial recurrence (spec §8 D1, gated by product decay):
//! `S_t = g_t S_{t−1} + k_t k_tᵀ`, `P_t = g_t P_{t−1} + k_t v_tᵀ`,
//! `Y_t = g_t³ Y_{t−1} + (S_t q_t)(q_tᵀ P_t)`, `o_t = q_tᵀ Y_t`.

use burn::prelude::*;

use super::State;
#[cfg(any(feature = "ndarray", feature = "flex"))]
use crate::fused::simd::{exp, multiversion};
#[cfg(any(feature = "ndarray", feature = "flex"))]
use crate::hla::fused::{Head, mat_vec, vec_mat};
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

#[cfg(any(feature = "ndarray", feature = "flex"))]
multiversion! {
    /// The same recurrence fused on CPU devices, one sequence and head, token by token in
    /// place: `state` `[S (d × d) | P | Y (d × dv)]` (the initial state on entry, the final
    /// one on return) and every token's output into `o [time, dv]` (no gradient).
    pub(crate) fn fused_head(x: &Head, d: usize, dv: usize, state: &mut [f32], o: &mut [f32]) {
        let (s, py) = state.split_at_mut(d * d);
        let (p, y) = py.split_at_mut(d * dv);
        let (mut s_q, mut q_p) = (vec![0.0; d], vec![0.0; dv]);
        for (t, o) in o.chunks_exact_mut(dv).enumerate() {
            let (q, k, v) = x.chunk((t, 1), d, dv);
            let g = exp(x.log_g[t]);
            for (s, &ki) in s.chunks_exact_mut(d).zip(k) {
                s.iter_mut().zip(k).for_each(|(s, &kj)| *s = g * *s + ki * kj);
            }
            for (p, &k) in p.chunks_exact_mut(dv).zip(k) {
                p.iter_mut().zip(v).for_each(|(p, &v)| *p = g * *p + k * v);
            }
            mat_vec(s, q, &mut s_q);
            vec_mat(q, p, &mut q_p);
            for (y, &sq) in y.chunks_exact_mut(dv).zip(&s_q) {
                y.iter_mut().zip(&q_p).for_each(|(y, &qp)| *y = g * g * g * *y + sq * qp);
            }
            vec_mat(q, y, o);
        }
    }
}
