//! The quadratic definition (docs/math.md §7, gated): with `A = L ⊙ (Q Kᵀ)`,
//! `O = diag(a) (Q E₀ + A Q P₀) + ((A A) ⊙ D) V`,
//! which is `((A A) ⊙ L) V` without decay and initial state.

use burn::prelude::*;

use super::State;
use crate::hla::{HlaInput, decay::Decay};

/// Whole sequence at once. `input`: see [`HlaInput`]; returns `o [batch, heads, time, dv]`
/// and the state after the last token.
pub fn reference(input: &HlaInput, init: State) -> (Tensor<4>, State) {
    let HlaInput { q, k, v, log_g } = input.clone();
    let decay = Decay::over(log_g.as_ref());
    let qk = q.clone().matmul(k.clone().swap_dims(2, 3));
    let a = qk.clone().tril(0);
    let qp0 = q.clone().matmul(init.p.clone());
    let carried = q.matmul(init.e.clone()) + a.clone().matmul(qp0.clone());
    let o = decay.since_start(carried, 1.0) + decay.mask(a.clone().matmul(a), 1).matmul(v.clone());

    // The state after the sequence, from its definition:
    // P = ρ P₀ + Kᵀ diag(e) V,  E = ρ (E₀ + Kᵀ Q P₀) + Kᵀ diag(e) (A^γ V), A^γ = D ⊙ (Q Kᵀ).
    let kt = k.swap_dims(2, 3);
    let within = kt
        .clone()
        .matmul(decay.until_end(decay.mask(qk, 1).matmul(v.clone()), 1.0));
    let e = decay.whole(init.e + kt.clone().matmul(qp0), 1.0) + within;
    let p = decay.whole(init.p, 1.0) + kt.matmul(decay.until_end(v, 1.0));
    (o, State { p, e })
}
