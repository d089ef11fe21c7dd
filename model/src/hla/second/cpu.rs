//! The CPU kernels of the chunk-parallel form of second order on CPU devices ([`crate::hla::cpu`]):
//! per sequence and head, chunk after chunk, the equations of [`super::chunked`]
//!
//! ```text
//! W = D ⊙ (Q Kᵀ),  A = diag(a) Q Sᵀ + W K,  P = (Q Aᵀ) ⊙ D²
//! O = diag(a²) Q Z + P V
//! Z ← ρ² Z + Aᵀ diag(e²) V,  S ← ρ S + Kᵀ diag(e) K
//! ```
//!
//! and backward, chunk after chunk from the last, with `∂S`, `∂Z` the gradients of the
//! state after the chunk, `G = (∂O Vᵀ) ⊙ D²` and `H = (∂A Kᵀ) ⊙ D`:
//!
//! ```text
//! ∂V = Pᵀ ∂O + diag(e²) A ∂Z
//! ∂A = Gᵀ Q + diag(e²) V ∂Zᵀ
//! ∂Q = diag(a²) ∂O Zᵀ + G A + diag(a) ∂A S + H K
//! ∂K = Wᵀ ∂A + Hᵀ Q + diag(e) K (∂S + ∂Sᵀ)
//! ∂S ← ρ ∂S + (diag(a) ∂A)ᵀ Q,  ∂Z ← ρ² ∂Z + Qᵀ diag(a²) ∂O
//! ```
//!
//! (`S`, `Z` in a chunk's equations are its start states, saved by the forward pass.)
//! The log gates, when they need a gradient, get it from each factor `f` as `f ⊙ ∂f`:
//! `a²` from `∂O · (a² Q Z)`, `a` from `∂A · (a Q Sᵀ)`, `e²` from `(diag(e²) A ∂Z) · V`,
//! `e` from `(diag(e) K ∂S) · K`, `ρ²` and `ρ` from `⟨∂Z, ρ² Z⟩`, `⟨∂S, ρ S⟩`, `D²` from
//! `(∂O Vᵀ) ⊙ P` and `D` from `(∂A Kᵀ) ⊙ W`.

use crate::backend::gemm::{Layout, matmul};
use crate::backend::simd::{dot, exp, multiversion};
use crate::hla::cpu::{
    ChunkDecay, ChunkSizes, DecayGrads, Decays, Grads, HeadInput, HeadKernels, decayed_scores,
    hadamard, mat_vec, row_dots, scale, scale_rows, scaled_rows, state_rows, symmetrized, vec_mat,
};

/// One chunk's products that the backward pass recomputes: `W`, `A`, `P`, `diag(e²) V`
/// and `diag(e) K`, with `Q Sᵀ` and `Q Kᵀ` (before the decay) for the gates' gradient.
struct Products {
    w: Vec<f32>,
    a: Vec<f32>,
    p: Vec<f32>,
    ev: Vec<f32>,
    ek: Vec<f32>,
    qs: Vec<f32>,
}

/// `W`, `A`, `P`, `diag(e²) V` and `diag(e) K` of the chunk `(q, k, v)` from the start
/// state `s`.
#[inline(always)]
fn products(
    (q, k, v): (&[f32], &[f32], &[f32]),
    s: &[f32],
    decay: &ChunkDecay,
    (d, dv): (usize, usize),
) -> Products {
    let (one, two) = (decay.p(1), decay.p(2));
    let c = one.a.len();
    let w = decayed_scores(q, k, &one.mask, c, d);
    let [qs, a] = state_rows(q, (s, Layout::transposed(d)), (&w, k), &one.a, (c, d, d));
    let p = decayed_scores(q, &a, &two.mask, c, d);
    Products {
        w,
        a,
        p,
        ev: scaled_rows(v, dv, &two.e),
        ek: scaled_rows(k, d, &one.e),
        qs,
    }
}

/// This order's CPU kernels, for [`crate::hla::cpu`]'s drivers.
pub(crate) const KERNELS: HeadKernels = HeadKernels {
    forward: forward_head,
    backward: backward_head,
    serial: serial_head,
    state_len: super::state_len,
};

multiversion! {
    /// One sequence and head forward: `o`, the final state `[S | Z]` (holding the initial
    /// state on entry) and every chunk's start state into `starts`.
    pub(crate) fn forward_head(n: &ChunkSizes, x: &HeadInput, state: &mut [f32], o: &mut [f32], starts: &mut [f32]) {
        let (d, dv) = (n.d, n.dv);
        let mut decays = Decays::new(2);
        let (s, z) = state.split_at_mut(d * d);
        for ((c0, c), saved) in n.spans().zip(starts.chunks_exact_mut(d * d + d * dv)) {
            saved[..d * d].copy_from_slice(s);
            saved[d * d..].copy_from_slice(z);
            let chunk = x.chunk((c0, c), d, dv);
            let decay = decays.of(&x.log_g[c0..c0 + c]);
            let pr = products(chunk, s, decay, (d, dv));
            let (one, two) = (decay.p(1), decay.p(2));
            let (q, k, v) = chunk;
            let o = &mut o[c0 * dv..][..c * dv];
            matmul((c, dv, d), o, (q, Layout::rows(d)), (z, Layout::rows(dv)), false);
            let qz = o.to_vec();
            scale_rows(o, &qz, dv, &two.a);
            matmul((c, dv, c), o, (&pr.p, Layout::rows(c)), (v, Layout::rows(dv)), true);
            scale(z, two.rho);
            matmul((d, dv, c), z, (&pr.a, Layout::transposed(d)), (&pr.ev, Layout::rows(dv)), true);
            scale(s, one.rho);
            matmul((d, d, c), s, (k, Layout::transposed(d)), (&pr.ek, Layout::rows(d)), true);
        }
    }
}

multiversion! {
    /// One sequence and head backward, from `∂o` (`g`) and the saved chunk start states.
    pub(crate) fn backward_head(n: &ChunkSizes, x: &HeadInput, starts: &[f32], g: &[f32], out: &mut Grads) {
        let (d, dv) = (n.d, n.dv);
        let mut decays = Decays::new(2);
        let start_len = d * d + d * dv;
        let spans: Vec<_> = n.spans().zip(starts.chunks_exact(start_len)).collect();
        for ((c0, c), saved) in spans.into_iter().rev() {
            let (s, z) = saved.split_at(d * d);
            let chunk = x.chunk((c0, c), d, dv);
            let decay = decays.of(&x.log_g[c0..c0 + c]);
            let (one, two) = (decay.p(1), decay.p(2));
            let pr = products(chunk, s, decay, (d, dv));
            let (q, k, v) = chunk;
            let g = &g[c0 * dv..][..c * dv];
            let (ds, dz) = out.state.split_at_mut(d * d);
            // G = (∂O Vᵀ) ⊙ D², from ∂P = ∂O Vᵀ.
            let mut dp = vec![0.0; c * c];
            matmul((c, c, dv), &mut dp, (g, Layout::rows(dv)), (v, Layout::transposed(dv)), false);
            let gm = hadamard(&dp, &two.mask);
            // ∂V = Pᵀ ∂O + diag(e²) A ∂Z.
            let ea = scaled_rows(&pr.a, d, &two.e);
            let mut ea_dz = vec![0.0; c * dv];
            matmul((c, dv, d), &mut ea_dz, (&ea, Layout::rows(d)), (dz, Layout::rows(dv)), false);
            let dvc = &mut out.v[c0 * dv..][..c * dv];
            matmul((c, dv, c), dvc, (&pr.p, Layout::transposed(c)), (g, Layout::rows(dv)), false);
            dvc.iter_mut().zip(&ea_dz).for_each(|(dv, x)| *dv += x);
            // ∂A = Gᵀ Q + diag(e²) V ∂Zᵀ.
            let mut da = vec![0.0; c * d];
            matmul((c, d, c), &mut da, (&gm, Layout::transposed(c)), (q, Layout::rows(d)), false);
            matmul((c, d, dv), &mut da, (&pr.ev, Layout::rows(dv)), (dz, Layout::transposed(dv)), true);
            // H = (∂A Kᵀ) ⊙ D, from ∂W = ∂A Kᵀ.
            let mut dw = vec![0.0; c * c];
            matmul((c, c, d), &mut dw, (&da, Layout::rows(d)), (k, Layout::transposed(d)), false);
            let hm = hadamard(&dw, &one.mask);
            // ∂Q = diag(a²) ∂O Zᵀ + G A + diag(a) ∂A S + H K.
            let a2g = scaled_rows(g, dv, &two.a);
            let ada = scaled_rows(&da, d, &one.a);
            let dqc = &mut out.q[c0 * d..][..c * d];
            matmul((c, d, dv), dqc, (&a2g, Layout::rows(dv)), (z, Layout::transposed(dv)), false);
            matmul((c, d, c), dqc, (&gm, Layout::rows(c)), (&pr.a, Layout::rows(d)), true);
            matmul((c, d, d), dqc, (&ada, Layout::rows(d)), (s, Layout::rows(d)), true);
            matmul((c, d, c), dqc, (&hm, Layout::rows(c)), (k, Layout::rows(d)), true);
            // ∂K = Wᵀ ∂A + Hᵀ Q + diag(e) K (∂S + ∂Sᵀ).
            let dkc = &mut out.k[c0 * d..][..c * d];
            matmul((c, d, c), dkc, (&pr.w, Layout::transposed(c)), (&da, Layout::rows(d)), false);
            matmul((c, d, c), dkc, (&hm, Layout::transposed(c)), (q, Layout::rows(d)), true);
            let sym = symmetrized(ds, d);
            matmul((c, d, d), dkc, (&pr.ek, Layout::rows(d)), (&sym, Layout::rows(d)), true);
            if let Some(dg) = out.gates.as_deref_mut() {
                let mut grads = DecayGrads::new(c);
                let mut qz = vec![0.0; c * dv];
                matmul((c, dv, d), &mut qz, (q, Layout::rows(d)), (z, Layout::rows(dv)), false);
                grads.since_start(2, &row_dots(&a2g, &qz, dv));
                grads.since_start(1, &row_dots(&ada, &pr.qs, d));
                grads.until_end(2, &row_dots(&ea_dz, v, dv));
                let mut ek_ds = vec![0.0; c * d];
                matmul((c, d, d), &mut ek_ds, (&pr.ek, Layout::rows(d)), (&*ds, Layout::rows(d)), false);
                grads.until_end(1, &row_dots(&ek_ds, k, d));
                grads.whole(2, two.rho * dot(dz, z));
                grads.whole(1, one.rho * dot(ds, s));
                grads.mask(2, &hadamard(&dp, &pr.p));
                grads.mask(1, &hadamard(&dw, &pr.w));
                grads.finish(&mut dg[c0..c0 + c]);
            }
            // The gradients of the chunk's start state.
            scale(ds, one.rho);
            matmul((d, d, c), ds, (&ada, Layout::transposed(d)), (q, Layout::rows(d)), true);
            scale(dz, two.rho);
            matmul((d, dv, c), dz, (q, Layout::transposed(d)), (&a2g, Layout::rows(dv)), true);
        }
    }
}

multiversion! {
    /// The serial recurrence ([`super::chunked`]) on CPU devices, one sequence and head, token by token in
    /// place: `state` `[S (d × d) | Z (d × dv)]` (the initial state on entry, the final one on
    /// return) and every token's output into `o [time, dv]` (no gradient).
    pub(crate) fn serial_head(x: &HeadInput, d: usize, dv: usize, state: &mut [f32], o: &mut [f32]) {
        let (s, z) = state.split_at_mut(d * d);
        let mut s_q = vec![0.0; d];
        for (t, o) in o.chunks_exact_mut(dv).enumerate() {
            let (q, k, v) = x.chunk((t, 1), d, dv);
            let g = exp(x.log_g[t]);
            for (s, &ki) in s.chunks_exact_mut(d).zip(k) {
                s.iter_mut().zip(k).for_each(|(s, &kj)| *s = g * *s + ki * kj);
            }
            mat_vec(s, q, &mut s_q);
            for (z, &sq) in z.chunks_exact_mut(dv).zip(&s_q) {
                z.iter_mut().zip(v).for_each(|(z, &v)| *z = g * g * *z + sq * v);
            }
            vec_mat(q, z, o);
        }
    }
}
