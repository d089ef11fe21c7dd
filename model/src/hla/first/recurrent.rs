//! The serial recurrence: `S_t = g_t S_{t−1} + k_t v_tᵀ`, `o_t = q_tᵀ S_t`.

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
    let s = g.whole(state.s, 1.0) + k.swap_dims(2, 3).matmul(v);
    (q.matmul(s.clone()), State { s })
}

#[cfg(any(feature = "ndarray", feature = "flex"))]
multiversion! {
    /// The same recurrence fused on CPU devices, one sequence and head, token by token in
    /// place: `s` `S [d, dv]` (the initial state on entry, the final one on return) and
    /// every token's output into `o [time, dv]` (no gradient).
    pub(crate) fn fused_head(x: &Head, d: usize, dv: usize, s: &mut [f32], o: &mut [f32]) {
        for (t, o) in o.chunks_exact_mut(dv).enumerate() {
            let (q, k, v) = x.chunk((t, 1), d, dv);
            let g = exp(x.log_g[t]);
            for (s, &k) in s.chunks_exact_mut(dv).zip(k) {
                s.iter_mut().zip(v).for_each(|(s, &v)| *s = g * *s + k * v);
            }
            vec_mat(q, s, o);
        }
    }
}
