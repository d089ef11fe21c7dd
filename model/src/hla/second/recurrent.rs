//! The serial recurrence, Z-form (spec §3, gated §6):
//! `S_t = g_t S_{t−1} + k_t k_tᵀ`, `Z_t = g_t² Z_{t−1} + (S_t q_t) v_tᵀ`, `o_t = q_tᵀ Z_t`.

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
    let s = g.whole(state.s, 1.0) + k.clone().swap_dims(2, 3).matmul(k);
    let s_q = s.clone().matmul(q.clone().swap_dims(2, 3));
    let z = g.whole(state.z, 2.0) + s_q.matmul(v);
    (q.matmul(z.clone()), State { s, z })
}

#[cfg(any(feature = "ndarray", feature = "flex"))]
multiversion! {
    /// The same recurrence fused on CPU devices, one sequence and head, token by token in
    /// place: `state` `[S (d × d) | Z (d × dv)]` (the initial state on entry, the final one on
    /// return) and every token's output into `o [time, dv]` (no gradient).
    pub(crate) fn fused_head(x: &Head, d: usize, dv: usize, state: &mut [f32], o: &mut [f32]) {
        let (s, z) = state.split_at_mut(d * d);
        let mut s_q = vec![0.0; d];
        for (t, o) in o.chunks_exact_mut(dv).enumerate() {
            let (q, k, v) = x.chunk((t, 1), d, dv);
            let g = exp(x.log_g[t]);
            for (s, &ki) in s.chunks_exact_mut(d).zip(k) {
                s.iter_mut().zip(k).for_each(|(s, &kj)| *s = g * *s + ki * kj);
            }
            mat_vec(s, q, &mut s_q);
            for (z, &sq) in z.chunks_exact_mut(dv).zip(&s_q) {
                z.iter_mut().zip(v).for_each(|(z, &v)| *z = g * g * *z + sq * v);
            }
            vec_mat(q, z, o);
        }
    }
}
