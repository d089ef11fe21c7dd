//! The chunk-parallel form (docs/math.md §5, gated §6), every chunk at once. Per chunk, with
//! `W^γ = D ⊙ (Q Kᵀ)` and the rows `A_u = (S_u q_u)ᵀ` of the inclusive key moment at
//! each token,
//!
//! ```text
//! A   = diag(a) Q Sᵀ + W^γ K
//! O   = diag(a²) Q Z + ((Q Aᵀ) ⊙ D²) V
//! Z  ← ρ² Z + Aᵀ diag(e²) V
//! S  ← ρ S + Kᵀ diag(e) K
//! ```
//!
//! `S` and `Z` at the start of every chunk come from scans over the chunks' updates (`S`
//! first: `A` needs it, and `Z`'s update needs `A`).
//!
//! (`Q Sᵀ` has rows `(S q_u)ᵀ`: `S` is symmetric when built from keys, and the
//! transpose keeps the forms equal for any initial state.)
//!
//! `(Q Aᵀ) ⊙ D²` equals docs/math.md's `(diag(a) Q S Qᵀ + W^γ Wᵀ) ⊙ D` without its C³ product
//! `W^γ Wᵀ`, and `Aᵀ diag(e²) V` its carry update (both checked in `generate.py`).

use burn::prelude::*;

use super::State;
use crate::hla::{HlaInput, chunks::Chunked};

/// `chunk` tokens per chunk (the last chunk is padded). `input`: see [`HlaInput`];
/// returns `o [batch, heads, time, dv]` and the final state. The composed form: the one
/// place this order's chunk equations are written, the test oracle of the CPU and GPU
/// kernels ([`super::cpu`], [`super::gpu`]), which [`crate::hla::forward`] runs instead
/// where they apply.
pub fn chunked(input: &HlaInput, state: State, chunk: usize) -> (Tensor<4>, State) {
    let Chunked {
        chunks,
        decay,
        q,
        k,
        v,
    } = Chunked::new(input, chunk);
    let kt = k.clone().transpose();

    let ds = kt.clone().matmul(decay.until_end(k.clone(), 1.0));
    let (s_start, s) = chunks.scan(state.s, ds, &decay, 1.0);
    let w_gamma = decay.mask(q.clone().matmul(kt), 1);
    let a = decay.since_start(q.clone().matmul(s_start.transpose()), 1.0) + w_gamma.matmul(k);

    let dz = a
        .clone()
        .transpose()
        .matmul(decay.until_end(v.clone(), 2.0));
    let (z_start, z) = chunks.scan(state.z, dz, &decay, 2.0);
    let qa = decay.mask(q.clone().matmul(a.transpose()), 2);
    let o = decay.since_start(q.matmul(z_start), 2.0) + qa.matmul(v);
    (chunks.merge(o), State { s, z })
}
