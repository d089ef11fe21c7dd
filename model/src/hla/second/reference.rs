//! The quadratic definition (docs/math.md §3, §6): with `W = L ⊙ (Q Kᵀ)` and `W^γ = D ⊙ (Q Kᵀ)`,
//! `O = diag(a²) Q Z₀ + [(diag(a) Q S₀ Qᵀ + W^γ Wᵀ) ⊙ D] V`,
//! which is `((W Wᵀ) ⊙ L) V` without decay and initial state.

use burn::prelude::*;

use super::State;
use crate::hla::{HlaInput, decay::Decay};

/// Whole sequence at once. `input`: see [`HlaInput`]; returns `o [batch, heads, time, dv]`
/// and the state after the last token.
pub fn reference(input: &HlaInput, init: State) -> (Tensor<4>, State) {
    let HlaInput { q, k, v, log_g } = input.clone();
    let decay = Decay::over(log_g.as_ref());
    let qk = q.clone().matmul(k.clone().swap_dims(2, 3));
    let w = qk.clone().tril(0);
    let w_gamma = decay.mask(qk, 1);
    let qsq = q
        .clone()
        .matmul(init.s.clone())
        .matmul(q.clone().swap_dims(2, 3));
    let t = decay.since_start(qsq, 1.0) + w_gamma.matmul(w.clone().swap_dims(2, 3));
    let o = decay.since_start(q.clone().matmul(init.z.clone()), 2.0)
        + decay.mask(t, 1).matmul(v.clone());

    // The state after the sequence, from its definition:
    // S = ρ S₀ + Kᵀ diag(e) K,
    // Z = ρ² Z₀ + ρ S₀ Qᵀ diag(e) V + Kᵀ diag(e) ((K Qᵀ) ⊙ U) diag(e) V.
    let ev = decay.until_end(v, 1.0);
    let s = decay.whole(init.s.clone(), 1.0)
        + k.clone()
            .swap_dims(2, 3)
            .matmul(decay.until_end(k.clone(), 1.0));
    let carried = init.s.matmul(q.swap_dims(2, 3).matmul(ev.clone()));
    let within = k
        .swap_dims(2, 3)
        .matmul(decay.until_end(w.swap_dims(2, 3).matmul(ev), 1.0));
    let z = decay.whole(init.z, 2.0) + decay.whole(carried, 1.0) + within;
    (o, State { s, z })
}
