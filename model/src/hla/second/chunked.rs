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
//! first: `A` needs it, and `Z`'s update needs `A`). On a GPU device the node's forward
//! pass computes `(W, A, ΔZ)` and `(P, O)` with one kernel each ([`super::fused`],
//! `crate::hla::chunks::fused`).
//!
//! (`Q Sᵀ` has rows `(S q_u)ᵀ`: `S` is symmetric when built from keys, and the
//! transpose keeps the forms equal for any initial state.)
//!
//! `(Q Aᵀ) ⊙ D²` equals docs/math.md's `(diag(a) Q S Qᵀ + W^γ Wᵀ) ⊙ D` without its C³ product
//! `W^γ Wᵀ`, and `Aᵀ diag(e²) V` its carry update (both checked in `generate.py`).

use burn::prelude::*;

use super::State;
use crate::hla::HlaInput;
use crate::hla::chunks::{Chunked, fused_output, state_or_zeros};
use crate::hla::decay::Decay;

/// `chunk` tokens per chunk (the last chunk is padded). `input`: see [`HlaInput`];
/// returns `o [batch, heads, time, dv]` and the final state. The composed form: the one
/// place this order's chunk equations are written ([`products`]), the test oracle of the
/// CPU and GPU kernels ([`super::cpu`], [`super::gpu`]) and of the node ([`super::node`]),
/// which [`crate::hla::forward`] runs instead where they apply.
pub fn chunked(input: &HlaInput, state: State, chunk: usize) -> (Tensor<4>, State) {
    let products = products(Chunked::new(input, chunk), Some(state));
    (products.o, products.state)
}

/// The forward pass, with the products in chunks (`[b, h, chunks, chunk, n]`) that the
/// node's backward pass reuses.
pub(crate) struct Products {
    /// `S` and `Z` at the start of every chunk.
    pub(crate) s_start: Tensor<5>,
    pub(crate) z_start: Tensor<5>,
    /// `W^γ = D ⊙ (Q Kᵀ)`, `A` and `P = (Q Aᵀ) ⊙ D²`.
    pub(crate) w: Tensor<5>,
    pub(crate) a: Tensor<5>,
    pub(crate) p: Tensor<5>,
    /// `o [b, h, time, dv]` and the final state.
    pub(crate) o: Tensor<4>,
    pub(crate) state: State,
}

/// The chunk equations of the module's header over the input in chunks `x`, from `state`
/// (zeros when `None`).
pub(crate) fn products(x: Chunked, state: Option<State>) -> Products {
    let Chunked {
        chunks,
        decay,
        q,
        k,
        v,
    } = x;
    let [s0, z0] = state_or_zeros(state.map(|s| s.tensors()));
    let kt = k.clone().transpose();

    let (s_start, s) = chunks.pass(s0, (&k, &k), &decay, 1);
    let (w, a) = fused_moments(&q, &k, &s_start, &decay).unwrap_or_else(|| {
        let w = decay.mask(q.clone().matmul(kt), 1);
        let a = decay.since_start(q.clone().matmul(s_start.clone().transpose()), 1.0)
            + w.clone().matmul(k.clone());
        (w, a)
    });

    let (z_start, z) = chunks.pass(z0, (&a, &v), &decay, 2);
    let fused = fused_output([&q, &a, &v, &z_start], &decay, 2, (true, false));
    let (p, o) = fused
        .map(|(p, o)| (p.expect("the scores, asked for"), o))
        .unwrap_or_else(|| {
            let p = decay.mask(q.clone().matmul(a.clone().transpose()), 2);
            let o = decay.since_start(q.clone().matmul(z_start.clone()), 2.0) + p.clone().matmul(v);
            (p, o)
        });
    Products {
        o: chunks.merge(o),
        state: State { s, z },
        s_start,
        z_start,
        w,
        a,
        p,
    }
}

/// `(W, A)` by the GPU kernel ([`super::fused`]) where it applies (the node's forward
/// pass on a GPU device); `None` elsewhere.
fn fused_moments(
    q: &Tensor<5>,
    k: &Tensor<5>,
    s_start: &Tensor<5>,
    decay: &Decay<5>,
) -> Option<(Tensor<5>, Tensor<5>)> {
    #[cfg(gpu_kernels)]
    return super::fused::moments(q, k, s_start, decay);
    #[cfg(not(gpu_kernels))]
    {
        let _ = (q, k, s_start, decay);
        None
    }
}
