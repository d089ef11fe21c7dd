//! The CPU kernels of the chunk-parallel form of first order on CPU devices ([`crate::hla::cpu`]): per
//! sequence and head, chunk after chunk, the equations of [`super::chunked`]
//!
//! ```text
//! M = (Q Kᵀ) ⊙ D,  O = diag(a) Q S + M V,  S ← ρ S + Kᵀ diag(e) V
//! ```
//!
//! and backward, chunk after chunk from the last, with `∂S` the gradient of the state after
//! the chunk and `G = (∂O Vᵀ) ⊙ D`:
//!
//! ```text
//! ∂Q = diag(a) ∂O Sᵀ + G K,  ∂K = Gᵀ Q + diag(e) V ∂Sᵀ,  ∂V = Mᵀ ∂O + diag(e) K ∂S
//! ∂S ← ρ ∂S + (diag(a) Q)ᵀ ∂O
//! ```
//!
//! (`S` in a chunk's equations is its start state, saved by the forward pass.) The log
//! gates, when they need a gradient, get it from each factor: `a` from `∂O · (a Q S)` per
//! row, `e` from `(diag(e) K ∂S) · V`, `ρ` from `ρ ⟨∂S, S⟩` and `D` from `(∂O Vᵀ) ⊙ M`.

use crate::backend::gemm::{Layout, matmul};
use crate::backend::simd::{dot, exp, multiversion};
use crate::hla::cpu::{
    ChunkSizes, DecayGrads, Decays, Grads, HeadInput, HeadKernels, apply_mask, decayed_scores,
    hadamard, row_dots, scale, scale_rows, scaled_rows, vec_mat,
};

/// This order's CPU kernels, for [`crate::hla::cpu`]'s drivers.
pub(crate) const KERNELS: HeadKernels = HeadKernels {
    forward: forward_head,
    backward: backward_head,
    serial: serial_head,
    state_len: super::state_len,
};

multiversion! {
    /// One sequence and head forward: `o`, the final `S` (holding the initial state on
    /// entry) and every chunk's start state into `starts`.
    pub(crate) fn forward_head(n: &ChunkSizes, x: &HeadInput, s: &mut [f32], o: &mut [f32], starts: &mut [f32]) {
        let (d, dv) = (n.d, n.dv);
        let mut decays = Decays::new(1);
        for (span, saved) in n.spans().zip(starts.chunks_exact_mut(d * dv)) {
            saved.copy_from_slice(s);
            let (c0, c) = span;
            let (q, k, v) = x.chunk(span, d, dv);
            let decay = decays.of(&x.log_g[c0..c0 + c]).p(1);
            let m = decayed_scores(q, k, &decay.mask, c, d);
            let o = &mut o[c0 * dv..][..c * dv];
            matmul((c, dv, d), o, (q, Layout::rows(d)), (s, Layout::rows(dv)), false);
            let qs = o.to_vec();
            scale_rows(o, &qs, dv, &decay.a);
            matmul((c, dv, c), o, (&m, Layout::rows(c)), (v, Layout::rows(dv)), true);
            let ev = scaled_rows(v, dv, &decay.e);
            scale(s, decay.rho);
            matmul((d, dv, c), s, (k, Layout::transposed(d)), (&ev, Layout::rows(dv)), true);
        }
    }
}

multiversion! {
    /// One sequence and head backward, from `∂o` (`g`) and the saved chunk start states.
    pub(crate) fn backward_head(n: &ChunkSizes, x: &HeadInput, starts: &[f32], g: &[f32], out: &mut Grads) {
        let (d, dv) = (n.d, n.dv);
        let mut decays = Decays::new(1);
        let spans: Vec<_> = n.spans().zip(starts.chunks_exact(d * dv)).collect();
        for (span, s) in spans.into_iter().rev() {
            let (c0, c) = span;
            let (q, k, v) = x.chunk(span, d, dv);
            let decay = decays.of(&x.log_g[c0..c0 + c]).p(1);
            let ds = &mut *out.state;
            let m = decayed_scores(q, k, &decay.mask, c, d);
            let g = &g[c0 * dv..][..c * dv];
            // G = (∂O Vᵀ) ⊙ D, from ∂M = ∂O Vᵀ.
            let mut dm = vec![0.0; c * c];
            matmul((c, c, dv), &mut dm, (g, Layout::rows(dv)), (v, Layout::transposed(dv)), false);
            let mut gm = dm.clone();
            apply_mask(&mut gm, &decay.mask);
            // ∂Q = diag(a) ∂O Sᵀ + G K.
            let ag = scaled_rows(g, dv, &decay.a);
            let dqc = &mut out.q[c0 * d..][..c * d];
            matmul((c, d, dv), dqc, (&ag, Layout::rows(dv)), (s, Layout::transposed(dv)), false);
            matmul((c, d, c), dqc, (&gm, Layout::rows(c)), (k, Layout::rows(d)), true);
            // ∂K = Gᵀ Q + diag(e) V ∂Sᵀ.
            let ev = scaled_rows(v, dv, &decay.e);
            let dkc = &mut out.k[c0 * d..][..c * d];
            matmul((c, d, c), dkc, (&gm, Layout::transposed(c)), (q, Layout::rows(d)), false);
            matmul((c, d, dv), dkc, (&ev, Layout::rows(dv)), (ds, Layout::transposed(dv)), true);
            // ∂V = Mᵀ ∂O + diag(e) K ∂S.
            let ek = scaled_rows(k, d, &decay.e);
            let mut eks = vec![0.0; c * dv];
            matmul((c, dv, d), &mut eks, (&ek, Layout::rows(d)), (ds, Layout::rows(dv)), false);
            let dvc = &mut out.v[c0 * dv..][..c * dv];
            matmul((c, dv, c), dvc, (&m, Layout::transposed(c)), (g, Layout::rows(dv)), false);
            dvc.iter_mut().zip(&eks).for_each(|(dv, x)| *dv += x);
            if let Some(dg) = out.gates.as_deref_mut() {
                let mut grads = DecayGrads::new(c);
                let mut qs = vec![0.0; c * dv];
                matmul((c, dv, d), &mut qs, (q, Layout::rows(d)), (s, Layout::rows(dv)), false);
                grads.since_start(1, &row_dots(&ag, &qs, dv));
                grads.until_end(1, &row_dots(&eks, v, dv));
                grads.whole(1, decay.rho * dot(ds, s));
                grads.mask(1, &hadamard(&dm, &m));
                grads.finish(&mut dg[c0..c0 + c]);
            }
            // ∂S of the chunk's start state.
            let aq = scaled_rows(q, d, &decay.a);
            scale(ds, decay.rho);
            matmul((d, dv, c), ds, (&aq, Layout::transposed(d)), (g, Layout::rows(dv)), true);
        }
    }
}

multiversion! {
    /// The serial recurrence ([`super::chunked`]) on CPU devices, one sequence and head, token by token in
    /// place: `s` `S [d, dv]` (the initial state on entry, the final one on return) and
    /// every token's output into `o [time, dv]` (no gradient).
    pub(crate) fn serial_head(x: &HeadInput, d: usize, dv: usize, s: &mut [f32], o: &mut [f32]) {
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
