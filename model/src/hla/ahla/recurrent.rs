//! The serial recurrence (spec §7, Algorithm 2 with per-token gates):
//! `P_t = g_t P_{t−1} + k_t v_tᵀ`, `E_t = g_t E_{t−1} + k_t (q_tᵀ P_t)`, `o_t = q_tᵀ E_t`.

use burn::prelude::*;

use super::State;
#[cfg(any(feature = "ndarray", feature = "flex"))]
use crate::fused::simd::{exp, multiversion};
#[cfg(any(feature = "ndarray", feature = "flex"))]
use crate::hla::fused::{Head, vec_mat};
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

#[cfg(any(feature = "ndarray", feature = "flex"))]
multiversion! {
    /// The same recurrence fused on CPU devices, one sequence and head, token by token in
    /// place: `state` `[P | E (d × dv)]` (the initial state on entry, the final one on
    /// return) and every token's output into `o [time, dv]` (no gradient).
    pub(crate) fn fused_head(x: &Head, d: usize, dv: usize, state: &mut [f32], o: &mut [f32]) {
        let (p, e) = state.split_at_mut(d * dv);
        let mut q_p = vec![0.0; dv];
        for (t, o) in o.chunks_exact_mut(dv).enumerate() {
            let (q, k, v) = x.chunk((t, 1), d, dv);
            let g = exp(x.log_g[t]);
            for (p, &k) in p.chunks_exact_mut(dv).zip(k) {
                p.iter_mut().zip(v).for_each(|(p, &v)| *p = g * *p + k * v);
            }
            vec_mat(q, p, &mut q_p);
            for (e, &k) in e.chunks_exact_mut(dv).zip(k) {
                e.iter_mut().zip(&q_p).for_each(|(e, &qp)| *e = g * *e + k * qp);
            }
            vec_mat(q, e, o);
        }
    }
}
