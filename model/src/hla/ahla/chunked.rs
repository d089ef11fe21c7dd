//! The chunk-parallel form of AHLA (spec §7, with `R_{≤t}`, gated). Per chunk, with
//! `A^γ = D ⊙ (Q Kᵀ)` and the inclusive per-token rows `B_u = q_uᵀ P_u`:
//!
//! ```text
//! B   = diag(a) Q P + A^γ V
//! O   = diag(a) Q E + A^γ B
//! E  ← ρ E + Kᵀ diag(e) B
//! P  ← ρ P + Kᵀ diag(e) V
//! ```
//!
//! Without decay this is the spec's `O_c = Q_c E + ((Q_c K_cᵀ) ⊙ L)(Q_c P) + ((A_c A_c) ⊙ L) V_c`,
//! with `(A_c A_c) V_c` computed as `A_c (A_c V_c)`: no C³ product.

use burn::prelude::*;

use super::State;
use crate::hla::{HlaInput, decay::Decay, spans};

/// Chunk by chunk, `chunk` tokens at a time (the last chunk may be shorter).
/// `input`: see [`HlaInput`]; returns `o [batch, heads, time, dv]` and the final state.
pub fn chunked(input: &HlaInput, state: State, chunk: usize) -> (Tensor<4>, State) {
    spans::scan(input, state, chunk, chunk_step)
}

fn chunk_step(x: &HlaInput, state: State) -> (Tensor<4>, State) {
    let HlaInput { q, k, v, log_g } = x.clone();
    let decay = Decay::over(log_g.as_ref());
    let kt = k.swap_dims(2, 3);
    let a_gamma = decay.mask(q.clone().matmul(kt.clone()), 1.0);
    let b = decay.since_start(q.clone().matmul(state.p.clone()), 1.0)
        + a_gamma.clone().matmul(v.clone());
    let o = decay.since_start(q.matmul(state.e.clone()), 1.0) + a_gamma.matmul(b.clone());
    let e = decay.whole(state.e, 1.0) + kt.clone().matmul(decay.until_end(b, 1.0));
    let p = decay.whole(state.p, 1.0) + kt.matmul(decay.until_end(v, 1.0));
    (o, State { p, e })
}
