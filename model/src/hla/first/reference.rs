//! The quadratic definition: `O = diag(a) Q S₀ + ((Q Kᵀ) ⊙ D) V`.

use burn::prelude::*;

use super::State;
use crate::hla::{HlaInput, decay::Decay};

/// Whole sequence at once. `input`: see [`HlaInput`]; returns `o [batch, heads, time, dv]`
/// and the state after the last token.
pub fn reference(input: &HlaInput, init: State) -> (Tensor<4>, State) {
    let HlaInput { q, k, v, log_g } = input.clone();
    let decay = Decay::over(log_g.as_ref());
    let scores = decay.mask(q.clone().matmul(k.clone().swap_dims(2, 3)), 1);
    let o = decay.since_start(q.matmul(init.s.clone()), 1.0) + scores.matmul(v.clone());
    let s = decay.whole(init.s, 1.0) + k.swap_dims(2, 3).matmul(decay.until_end(v, 1.0));
    (o, State { s })
}
