//! The CPU kernels of the chunk-parallel form of AHLA on CPU devices ([`crate::hla::cpu`]): per
//! sequence and head, chunk after chunk, the equations of [`super::chunked`]
//!
//! ```text
//! A = D ⊙ (Q Kᵀ),  B = diag(a) Q P + A V,  O = diag(a) Q E + A B
//! E ← ρ E + Kᵀ diag(e) B,  P ← ρ P + Kᵀ diag(e) V
//! ```
//!
//! and backward, chunk after chunk from the last, with `∂E`, `∂P` the gradients of the
//! state after the chunk, `∂B = Aᵀ ∂O + diag(e) K ∂E`, `G = ∂O Bᵀ + ∂B Vᵀ` (the gradient
//! of `A`) and `H = G ⊙ D`:
//!
//! ```text
//! ∂Q = diag(a) (∂O Eᵀ + ∂B Pᵀ) + H K
//! ∂K = Hᵀ Q + diag(e) (B ∂Eᵀ + V ∂Pᵀ)
//! ∂V = Aᵀ ∂B + diag(e) K ∂P
//! ∂E ← ρ ∂E + Qᵀ diag(a) ∂O,  ∂P ← ρ ∂P + Qᵀ diag(a) ∂B
//! ```
//!
//! (`P`, `E` in a chunk's equations are its start states, saved by the forward pass.) The
//! log gates, when they need a gradient, get it from each factor `f` as `f ⊙ ∂f`: `a` from
//! `∂O · (a Q E) + ∂B · (a Q P)`, `e` from `(diag(e) K ∂E) · B + (diag(e) K ∂P) · V`, `ρ`
//! from `ρ (⟨∂E, E⟩ + ⟨∂P, P⟩)` and `D` from `G ⊙ A`.

use crate::backend::gemm::{Layout, matmul};
use crate::backend::simd::{dot, exp, multiversion};
use crate::hla::cpu::{
    ChunkSizes, DecayGrads, Decays, Grads, HeadInput, HeadKernels, Power, decayed_scores, hadamard,
    row_dots, scale, scale_rows, scaled_rows, state_rows, vec_mat,
};

/// `A = D ⊙ (Q Kᵀ)`, `Q P` and `B` of the chunk `(q, k, v)` from the start state `p`.
#[inline(always)]
fn products(
    (q, k, v): (&[f32], &[f32], &[f32]),
    p: &[f32],
    decay: &Power,
    (d, dv): (usize, usize),
) -> [Vec<f32>; 3] {
    let c = decay.a.len();
    let a = decayed_scores(q, k, &decay.mask, c, d);
    let [qp, b] = state_rows(q, (p, Layout::rows(dv)), (&a, v), &decay.a, (c, d, dv));
    [a, qp, b]
}

/// This order's CPU kernels, for [`crate::hla::cpu`]'s drivers.
pub(crate) const KERNELS: HeadKernels = HeadKernels {
    forward: forward_head,
    backward: backward_head,
    serial: serial_head,
    state_len: super::state_len,
};

multiversion! {
    /// One sequence and head forward: `o`, the final state `[P | E]` (holding the initial
    /// state on entry) and every chunk's start state into `starts`.
    pub(crate) fn forward_head(n: &ChunkSizes, x: &HeadInput, state: &mut [f32], o: &mut [f32], starts: &mut [f32]) {
        let (d, dv) = (n.d, n.dv);
        let mut decays = Decays::new(1);
        let (p, e) = state.split_at_mut(d * dv);
        for ((c0, c), saved) in n.spans().zip(starts.chunks_exact_mut(2 * d * dv)) {
            saved[..d * dv].copy_from_slice(p);
            saved[d * dv..].copy_from_slice(e);
            let chunk = x.chunk((c0, c), d, dv);
            let decay = decays.of(&x.log_g[c0..c0 + c]).p(1);
            let [a, _, b] = products(chunk, p, decay, (d, dv));
            let (q, k, v) = chunk;
            let o = &mut o[c0 * dv..][..c * dv];
            let mut qe = vec![0.0; c * dv];
            matmul((c, dv, d), &mut qe, (q, Layout::rows(d)), (&*e, Layout::rows(dv)), false);
            scale_rows(o, &qe, dv, &decay.a);
            matmul((c, dv, c), o, (&a, Layout::rows(c)), (&b, Layout::rows(dv)), true);
            let ek = scaled_rows(k, d, &decay.e);
            scale(e, decay.rho);
            matmul((d, dv, c), e, (&ek, Layout::transposed(d)), (&b, Layout::rows(dv)), true);
            scale(p, decay.rho);
            matmul((d, dv, c), p, (&ek, Layout::transposed(d)), (v, Layout::rows(dv)), true);
        }
    }
}

multiversion! {
    /// One sequence and head backward, from `∂o` (`g`) and the saved chunk start states.
    pub(crate) fn backward_head(n: &ChunkSizes, x: &HeadInput, starts: &[f32], g: &[f32], out: &mut Grads) {
        let (d, dv) = (n.d, n.dv);
        let mut decays = Decays::new(1);
        let spans: Vec<_> = n.spans().zip(starts.chunks_exact(2 * d * dv)).collect();
        for ((c0, c), saved) in spans.into_iter().rev() {
            let (p, e) = saved.split_at(d * dv);
            let chunk = x.chunk((c0, c), d, dv);
            let decay = decays.of(&x.log_g[c0..c0 + c]).p(1);
            let [a, qp, b] = products(chunk, p, decay, (d, dv));
            let (q, k, v) = chunk;
            let g = &g[c0 * dv..][..c * dv];
            let (dp, de) = out.state.split_at_mut(d * dv);
            let ek = scaled_rows(k, d, &decay.e);
            // ∂B = Aᵀ ∂O + diag(e) K ∂E.
            let mut ek_de = vec![0.0; c * dv];
            matmul((c, dv, d), &mut ek_de, (&ek, Layout::rows(d)), (&*de, Layout::rows(dv)), false);
            let mut db = ek_de.clone();
            matmul((c, dv, c), &mut db, (&a, Layout::transposed(c)), (g, Layout::rows(dv)), true);
            // G = ∂O Bᵀ + ∂B Vᵀ, H = G ⊙ D.
            let mut gm = vec![0.0; c * c];
            matmul((c, c, dv), &mut gm, (g, Layout::rows(dv)), (&b, Layout::transposed(dv)), false);
            matmul((c, c, dv), &mut gm, (&db, Layout::rows(dv)), (v, Layout::transposed(dv)), true);
            let hm = hadamard(&gm, &decay.mask);
            // ∂Q = diag(a) (∂O Eᵀ + ∂B Pᵀ) + H K.
            let (ag, adb) = (scaled_rows(g, dv, &decay.a), scaled_rows(&db, dv, &decay.a));
            let dqc = &mut out.q[c0 * d..][..c * d];
            matmul((c, d, dv), dqc, (&ag, Layout::rows(dv)), (e, Layout::transposed(dv)), false);
            matmul((c, d, dv), dqc, (&adb, Layout::rows(dv)), (p, Layout::transposed(dv)), true);
            matmul((c, d, c), dqc, (&hm, Layout::rows(c)), (k, Layout::rows(d)), true);
            // ∂K = Hᵀ Q + diag(e) (B ∂Eᵀ + V ∂Pᵀ).
            let (eb, ev) = (scaled_rows(&b, dv, &decay.e), scaled_rows(v, dv, &decay.e));
            let dkc = &mut out.k[c0 * d..][..c * d];
            matmul((c, d, c), dkc, (&hm, Layout::transposed(c)), (q, Layout::rows(d)), false);
            matmul((c, d, dv), dkc, (&eb, Layout::rows(dv)), (&*de, Layout::transposed(dv)), true);
            matmul((c, d, dv), dkc, (&ev, Layout::rows(dv)), (&*dp, Layout::transposed(dv)), true);
            // ∂V = Aᵀ ∂B + diag(e) K ∂P.
            let mut ek_dp = vec![0.0; c * dv];
            matmul((c, dv, d), &mut ek_dp, (&ek, Layout::rows(d)), (&*dp, Layout::rows(dv)), false);
            let dvc = &mut out.v[c0 * dv..][..c * dv];
            matmul((c, dv, c), dvc, (&a, Layout::transposed(c)), (&db, Layout::rows(dv)), false);
            dvc.iter_mut().zip(&ek_dp).for_each(|(dv, x)| *dv += x);
            if let Some(dg) = out.gates.as_deref_mut() {
                let mut grads = DecayGrads::new(c);
                let mut qe = vec![0.0; c * dv];
                matmul((c, dv, d), &mut qe, (q, Layout::rows(d)), (e, Layout::rows(dv)), false);
                grads.since_start(1, &row_dots(&ag, &qe, dv));
                grads.since_start(1, &row_dots(&adb, &qp, dv));
                grads.until_end(1, &row_dots(&ek_de, &b, dv));
                grads.until_end(1, &row_dots(&ek_dp, v, dv));
                grads.whole(1, decay.rho * (dot(de, e) + dot(dp, p)));
                grads.mask(1, &hadamard(&gm, &a));
                grads.finish(&mut dg[c0..c0 + c]);
            }
            // The gradients of the chunk's start state.
            scale(de, decay.rho);
            matmul((d, dv, c), de, (q, Layout::transposed(d)), (&ag, Layout::rows(dv)), true);
            scale(dp, decay.rho);
            matmul((d, dv, c), dp, (q, Layout::transposed(d)), (&adb, Layout::rows(dv)), true);
        }
    }
}

multiversion! {
    /// The serial recurrence ([`super::chunked`]) on CPU devices, one sequence and head, token by token in
    /// place: `state` `[P | E (d × dv)]` (the initial state on entry, the final one on
    /// return) and every token's output into `o [time, dv]` (no gradient).
    pub(crate) fn serial_head(x: &HeadInput, d: usize, dv: usize, state: &mut [f32], o: &mut [f32]) {
        let (p, e) = state.split_at_mut(d * dv);
        let mut q_p = vec![0.0; dv];
        for (t, o) in o.chunks_exact_mut(dv).enumerate() {
            let (q, k, v) = x.chunk((t, 1), d, dv);
            let g = exp(x.log_g[t]);
            for (p, &k) in p.chunks_exact_mut(dv).zip(k) {
                p.iter_mut().zip(v).for_each(|(p, &v)| *p = g * *p + k * v);
            }
            vec_mat(q, p, &mut q_p);
            for (e, &k) in e.chunks_exact_mut(dv).zip(k) {
                e.iter_mut().zip(&q_p).for_each(|(e, &qp)| *e = g * *e + k * qp);
            }
            vec_mat(q, e, o);
        }
    }
}
