//! The cubic definition (docs/math.md §8 D1, gated by product decay): with `W = L ⊙ (Q Kᵀ)` and
//! `W^γ = D ⊙ (Q Kᵀ)`,
//! `O = diag(a³) Q Y₀ + [(diag(a) Q S₀ Qᵀ + W^γ Wᵀ) ⊙ D²] (diag(a) Q P₀ + W^γ V)`,
//! which is `((W Wᵀ) ⊙ L) W V` without decay and initial state.

use burn::prelude::*;

use super::State;
use crate::hla::{HlaInput, decay::Decay};

/// Whole sequence at once. `input`: see [`HlaInput`]; returns `o [batch, heads, time, dv]`
/// and the state after the last token.
pub fn reference(input: &HlaInput, init: State) -> (Tensor<4>, State) {
    let HlaInput { q, k, v, log_g } = input.clone();
    let decay = Decay::over(log_g.as_ref());
    let qt = q.clone().swap_dims(2, 3);
    let qk = q.clone().matmul(k.clone().swap_dims(2, 3));
    let w = qk.clone().tril(0);
    let w_gamma = decay.mask(qk, 1);
    let qsq = q.clone().matmul(init.s.clone()).matmul(qt.clone());
    let t = decay.since_start(qsq, 1.0) + w_gamma.clone().matmul(w.swap_dims(2, 3));
    // Rows q_uᵀ P_u: the value side seen by query u.
    let qp = decay.since_start(q.clone().matmul(init.p.clone()), 1.0)
        + w_gamma.clone().matmul(v.clone());
    let o = decay.since_start(q.clone().matmul(init.y.clone()), 3.0)
        + decay.mask(t, 2).matmul(qp.clone());

    // The state after the sequence, from its definition: S and P decay and sum;
    // Y = ρ³ Y₀ + Σ_u e_u³ (S_u q_u)(q_uᵀ P_u), with S_u q_u = a_u S₀ q_u + Σ_{i≤u} w(u,i) k_i (k_i·q_u).
    let kt = k.clone().swap_dims(2, 3);
    let s_q = decay.since_start(q.matmul(init.s.clone().swap_dims(2, 3)), 1.0)
        + w_gamma.matmul(k.clone());
    let s = decay.whole(init.s, 1.0) + kt.clone().matmul(decay.until_end(k, 1.0));
    let p = decay.whole(init.p, 1.0) + kt.matmul(decay.until_end(v, 1.0));
    let y = decay.whole(init.y, 3.0) + s_q.swap_dims(2, 3).matmul(decay.until_end(qp, 3.0));
    (o, State { s, p, y })
}
