//! The chunk-parallel form of D1 (docs/math.md §8, gated by product decay), every chunk at once.
//! Per chunk, with `W^γ = D ⊙ (Q Kᵀ)` and the inclusive per-token rows
//! `A_u = (S_u q_u)ᵀ`, `B_u = q_uᵀ P_u`:
//!
//! ```text
//! A   = diag(a) Q Sᵀ + W^γ K
//! B   = diag(a) Q P + W^γ V
//! O   = diag(a³) Q Y + ((Q Aᵀ) ⊙ D³) B
//! Y  ← ρ³ Y + Aᵀ diag(e³) B
//! S  ← ρ S + Kᵀ diag(e) K ;  P ← ρ P + Kᵀ diag(e) V
//! ```
//!
//! `S`, `P` and `Y` at the start of every chunk come from scans over the chunks' updates
//! (`S` and `P` first: `Y`'s update needs `A` and `B`).
//!
//! (`Q Sᵀ` has rows `(S q_u)ᵀ`: `S` is symmetric when built from keys, and the
//! transpose keeps the forms equal for any initial state.)
//!
//! On a GPU device the node's forward pass computes `(W^γ, B)`, `A` and `(T, O)` with one
//! kernel each (`crate::hla::chunks::fused`: `A` and `B` share the form of an output).
//!
//! Without decay this is docs/math.md's `O_c = Q_c Y + (T ⊙ L) B`, `Y += Aᵀ B`, with
//! `T ⊙ L = (Q Aᵀ) ⊙ L` computed without the C³ product `W Wᵀ`.

use burn::prelude::*;

use super::State;
use crate::hla::HlaInput;
use crate::hla::chunks::{Chunked, fused_output, state_or_zeros};

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
    /// `S`, `P` and `Y` at the start of every chunk.
    pub(crate) s_start: Tensor<5>,
    pub(crate) p_start: Tensor<5>,
    pub(crate) y_start: Tensor<5>,
    /// `W^γ = D ⊙ (Q Kᵀ)`, `A`, `B` and `T = (Q Aᵀ) ⊙ D³`.
    pub(crate) w: Tensor<5>,
    pub(crate) a: Tensor<5>,
    pub(crate) b: Tensor<5>,
    pub(crate) t: Tensor<5>,
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
    let [s0, p0, y0] = state_or_zeros(state.map(|s| s.tensors()));
    let kt = k.clone().transpose();

    let (s_start, s) = chunks.pass(s0, (&k, &k), &decay, 1);
    let (p_start, p) = chunks.pass(p0, (&k, &v), &decay, 1);
    let fused = fused_output([&q, &k, &v, &p_start], &decay, 1, (true, false));
    let fused = fused.and_then(|(w, b)| {
        // A reads Sᵀ: the kernel takes S where it lies.
        let (_, a) = fused_output([&q, &k, &k, &s_start], &decay, 1, (false, true))?;
        Some((w.expect("the scores, asked for"), a, b))
    });
    let (w, a, b) = fused.unwrap_or_else(|| {
        let w = decay.mask(q.clone().matmul(kt), 1);
        let s_t = s_start.clone().transpose();
        let a = decay.since_start(q.clone().matmul(s_t), 1.0) + w.clone().matmul(k.clone());
        let b = decay.since_start(q.clone().matmul(p_start.clone()), 1.0) + w.clone().matmul(v);
        (w, a, b)
    });

    let (y_start, y) = chunks.pass(y0, (&a, &b), &decay, 3);
    let fused = fused_output([&q, &a, &b, &y_start], &decay, 3, (true, false));
    let (t, o) = match fused {
        Some((t, o)) => (t.expect("the scores, asked for"), o),
        None => {
            let t = decay.mask(q.clone().matmul(a.clone().transpose()), 3);
            let o = decay.since_start(q.matmul(y_start.clone()), 3.0) + t.clone().matmul(b.clone());
            (t, o)
        }
    };
    Products {
        o: chunks.merge(o),
        state: State { s, p, y },
        s_start,
        p_start,
        y_start,
        w,
        a,
        b,
        t,
    }
}
