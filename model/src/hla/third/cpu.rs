//! The CPU kernels of the chunk-parallel form of third order (D1) on CPU devices
//! ([`crate::hla::cpu`]): per sequence and head, chunk after chunk, the equations of
//! [`super::chunked`]
//!
//! ```text
//! W = D ⊙ (Q Kᵀ),  A = diag(a) Q Sᵀ + W K,  B = diag(a) Q P + W V,  T = (Q Aᵀ) ⊙ D³
//! O = diag(a³) Q Y + T B
//! Y ← ρ³ Y + Aᵀ diag(e³) B,  S ← ρ S + Kᵀ diag(e) K,  P ← ρ P + Kᵀ diag(e) V
//! ```
//!
//! and backward, chunk after chunk from the last, with `∂S`, `∂P`, `∂Y` the gradients of
//! the state after the chunk, `G = (∂O Bᵀ) ⊙ D³` and `H = (∂A Kᵀ + ∂B Vᵀ) ⊙ D`:
//!
//! ```text
//! ∂B = Tᵀ ∂O + diag(e³) A ∂Y,  ∂A = Gᵀ Q + diag(e³) B ∂Yᵀ
//! ∂Q = diag(a³) ∂O Yᵀ + G A + diag(a) (∂A S + ∂B Pᵀ) + H K
//! ∂K = Wᵀ ∂A + Hᵀ Q + diag(e) K (∂S + ∂Sᵀ) + diag(e) V ∂Pᵀ
//! ∂V = Wᵀ ∂B + diag(e) K ∂P
//! ∂Y ← ρ³ ∂Y + Qᵀ diag(a³) ∂O,  ∂S ← ρ ∂S + (diag(a) ∂A)ᵀ Q,  ∂P ← ρ ∂P + Qᵀ diag(a) ∂B
//! ```
//!
//! (`S`, `P`, `Y` in a chunk's equations are its start states, saved by the forward pass.)
//! The log gates, when they need a gradient, get it from each factor `f` as `f ⊙ ∂f`: `a³`
//! from `∂O · (a³ Q Y)`, `a` from `∂A · (a Q Sᵀ) + ∂B · (a Q P)`, `e³` from
//! `(diag(e³) A ∂Y) · B`, `e` from `(diag(e) K ∂S) · K + (diag(e) K ∂P) · V`, `ρ³` and `ρ`
//! from the states, `D³` from `(∂O Bᵀ) ⊙ T` and `D` from `(∂A Kᵀ + ∂B Vᵀ) ⊙ W`.

use crate::backend::gemm::{Layout, matmul};
use crate::backend::simd::{dot, exp, multiversion};
use crate::hla::cpu::{
    ChunkDecay, ChunkSizes, DecayGrads, Decays, Grads, HeadInput, HeadKernels, decayed_scores,
    hadamard, mat_vec, row_dots, scale, scale_rows, scaled_rows, state_rows, symmetrized, vec_mat,
};

/// One chunk's products that the backward pass recomputes, with `Q Sᵀ` and `Q P` (before
/// the decay) for the gates' gradient.
struct Products {
    w: Vec<f32>,
    a: Vec<f32>,
    b: Vec<f32>,
    t: Vec<f32>,
    qs: Vec<f32>,
    qp: Vec<f32>,
}

/// The products of the chunk `(q, k, v)` from the start states `s`, `p`.
#[inline(always)]
fn products(
    (q, k, v): (&[f32], &[f32], &[f32]),
    (s, p): (&[f32], &[f32]),
    decay: &ChunkDecay,
    (d, dv): (usize, usize),
) -> Products {
    let (one, three) = (decay.p(1), decay.p(3));
    let c = one.a.len();
    let w = decayed_scores(q, k, &one.mask, c, d);
    let [qs, a] = state_rows(q, (s, Layout::transposed(d)), (&w, k), &one.a, (c, d, d));
    let [qp, b] = state_rows(q, (p, Layout::rows(dv)), (&w, v), &one.a, (c, d, dv));
    let t = decayed_scores(q, &a, &three.mask, c, d);
    Products { w, a, b, t, qs, qp }
}

/// A chunk's gradients of its products (`∂T` and `∂W` before their masks for the gates'
/// gradient), from `∂O` (`g`) and `∂Y` after the chunk.
struct ProductGrads {
    dt: Vec<f32>,
    gm: Vec<f32>,
    e3a_dy: Vec<f32>,
    da: Vec<f32>,
    db: Vec<f32>,
    dw: Vec<f32>,
    hm: Vec<f32>,
}

/// The gradients of the products `pr` of the chunk `(q, k, v)`.
#[inline(always)]
#[rustfmt::skip]
fn product_grads(
    (q, k, v): (&[f32], &[f32], &[f32]),
    pr: &Products,
    decay: &ChunkDecay,
    g: &[f32],
    dy: &[f32],
    (d, dv): (usize, usize),
) -> ProductGrads {
    let (one, three) = (decay.p(1), decay.p(3));
    let c = one.a.len();
    // G = (∂O Bᵀ) ⊙ D³, from ∂T = ∂O Bᵀ.
    let mut dt = vec![0.0; c * c];
    matmul((c, c, dv), &mut dt, (g, Layout::rows(dv)), (&pr.b, Layout::transposed(dv)), false);
    let gm = hadamard(&dt, &three.mask);
    // ∂B = Tᵀ ∂O + diag(e³) A ∂Y,  ∂A = Gᵀ Q + diag(e³) B ∂Yᵀ.
    let (e3a, e3b) = (scaled_rows(&pr.a, d, &three.e), scaled_rows(&pr.b, dv, &three.e));
    let mut e3a_dy = vec![0.0; c * dv];
    matmul((c, dv, d), &mut e3a_dy, (&e3a, Layout::rows(d)), (dy, Layout::rows(dv)), false);
    let mut db = e3a_dy.clone();
    matmul((c, dv, c), &mut db, (&pr.t, Layout::transposed(c)), (g, Layout::rows(dv)), true);
    let mut da = vec![0.0; c * d];
    matmul((c, d, c), &mut da, (&gm, Layout::transposed(c)), (q, Layout::rows(d)), false);
    matmul((c, d, dv), &mut da, (&e3b, Layout::rows(dv)), (dy, Layout::transposed(dv)), true);
    // H = (∂A Kᵀ + ∂B Vᵀ) ⊙ D, from ∂W.
    let mut dw = vec![0.0; c * c];
    matmul((c, c, d), &mut dw, (&da, Layout::rows(d)), (k, Layout::transposed(d)), false);
    matmul((c, c, dv), &mut dw, (&db, Layout::rows(dv)), (v, Layout::transposed(dv)), true);
    let hm = hadamard(&dw, &one.mask);
    ProductGrads { dt, gm, e3a_dy, da, db, dw, hm }
}

/// This order's CPU kernels, for [`crate::hla::cpu`]'s drivers.
pub(crate) const KERNELS: HeadKernels = HeadKernels {
    forward: forward_head,
    backward: backward_head,
    serial: serial_head,
    state_len: super::state_len,
};

multiversion! {
    /// One sequence and head forward: `o`, the final state `[S | P | Y]` (holding the
    /// initial state on entry) and every chunk's start state into `starts`.
    pub(crate) fn forward_head(n: &ChunkSizes, x: &HeadInput, state: &mut [f32], o: &mut [f32], starts: &mut [f32]) {
        let (d, dv) = (n.d, n.dv);
        let mut decays = Decays::new(3);
        let (s, py) = state.split_at_mut(d * d);
        let (p, y) = py.split_at_mut(d * dv);
        for ((c0, c), saved) in n.spans().zip(starts.chunks_exact_mut(d * d + 2 * d * dv)) {
            saved[..d * d].copy_from_slice(s);
            saved[d * d..d * d + d * dv].copy_from_slice(p);
            saved[d * d + d * dv..].copy_from_slice(y);
            let chunk = x.chunk((c0, c), d, dv);
            let decay = decays.of(&x.log_g[c0..c0 + c]);
            let pr = products(chunk, (s, p), decay, (d, dv));
            let (one, three) = (decay.p(1), decay.p(3));
            let (q, k, v) = chunk;
            let o = &mut o[c0 * dv..][..c * dv];
            let mut qy = vec![0.0; c * dv];
            matmul((c, dv, d), &mut qy, (q, Layout::rows(d)), (&*y, Layout::rows(dv)), false);
            scale_rows(o, &qy, dv, &three.a);
            matmul((c, dv, c), o, (&pr.t, Layout::rows(c)), (&pr.b, Layout::rows(dv)), true);
            let e3b = scaled_rows(&pr.b, dv, &three.e);
            scale(y, three.rho);
            matmul((d, dv, c), y, (&pr.a, Layout::transposed(d)), (&e3b, Layout::rows(dv)), true);
            let ek = scaled_rows(k, d, &one.e);
            scale(s, one.rho);
            matmul((d, d, c), s, (&ek, Layout::transposed(d)), (k, Layout::rows(d)), true);
            scale(p, one.rho);
            matmul((d, dv, c), p, (&ek, Layout::transposed(d)), (v, Layout::rows(dv)), true);
        }
    }
}

multiversion! {
    /// One sequence and head backward, from `∂o` (`g`) and the saved chunk start states.
    pub(crate) fn backward_head(n: &ChunkSizes, x: &HeadInput, starts: &[f32], g: &[f32], out: &mut Grads) {
        let (d, dv) = (n.d, n.dv);
        let mut decays = Decays::new(3);
        let start_len = d * d + 2 * d * dv;
        let spans: Vec<_> = n.spans().zip(starts.chunks_exact(start_len)).collect();
        for ((c0, c), saved) in spans.into_iter().rev() {
            let (s, py) = saved.split_at(d * d);
            let (p, y) = py.split_at(d * dv);
            let chunk = x.chunk((c0, c), d, dv);
            let decay = decays.of(&x.log_g[c0..c0 + c]);
            let (one, three) = (decay.p(1), decay.p(3));
            let pr = products(chunk, (s, p), decay, (d, dv));
            let (q, k, v) = chunk;
            let g = &g[c0 * dv..][..c * dv];
            let (ds, dpy) = out.state.split_at_mut(d * d);
            let (dp, dy) = dpy.split_at_mut(d * dv);
            let ProductGrads { dt, gm, e3a_dy, da, db, dw, hm } = product_grads(chunk, &pr, decay, g, dy, (d, dv));
            // ∂Q = diag(a³) ∂O Yᵀ + G A + diag(a) (∂A S + ∂B Pᵀ) + H K.
            let a3g = scaled_rows(g, dv, &three.a);
            let (ada, adb) = (scaled_rows(&da, d, &one.a), scaled_rows(&db, dv, &one.a));
            let dqc = &mut out.q[c0 * d..][..c * d];
            matmul((c, d, dv), dqc, (&a3g, Layout::rows(dv)), (y, Layout::transposed(dv)), false);
            matmul((c, d, c), dqc, (&gm, Layout::rows(c)), (&pr.a, Layout::rows(d)), true);
            matmul((c, d, d), dqc, (&ada, Layout::rows(d)), (s, Layout::rows(d)), true);
            matmul((c, d, dv), dqc, (&adb, Layout::rows(dv)), (p, Layout::transposed(dv)), true);
            matmul((c, d, c), dqc, (&hm, Layout::rows(c)), (k, Layout::rows(d)), true);
            // ∂K = Wᵀ ∂A + Hᵀ Q + diag(e) K (∂S + ∂Sᵀ) + diag(e) V ∂Pᵀ.
            let (ek, ev) = (scaled_rows(k, d, &one.e), scaled_rows(v, dv, &one.e));
            let dkc = &mut out.k[c0 * d..][..c * d];
            matmul((c, d, c), dkc, (&pr.w, Layout::transposed(c)), (&da, Layout::rows(d)), false);
            matmul((c, d, c), dkc, (&hm, Layout::transposed(c)), (q, Layout::rows(d)), true);
            let sym = symmetrized(ds, d);
            matmul((c, d, d), dkc, (&ek, Layout::rows(d)), (&sym, Layout::rows(d)), true);
            matmul((c, d, dv), dkc, (&ev, Layout::rows(dv)), (&*dp, Layout::transposed(dv)), true);
            // ∂V = Wᵀ ∂B + diag(e) K ∂P.
            let mut ek_dp = vec![0.0; c * dv];
            matmul((c, dv, d), &mut ek_dp, (&ek, Layout::rows(d)), (&*dp, Layout::rows(dv)), false);
            let dvc = &mut out.v[c0 * dv..][..c * dv];
            matmul((c, dv, c), dvc, (&pr.w, Layout::transposed(c)), (&db, Layout::rows(dv)), false);
            dvc.iter_mut().zip(&ek_dp).for_each(|(dv, x)| *dv += x);
            if let Some(dg) = out.gates.as_deref_mut() {
                let mut grads = DecayGrads::new(c);
                let mut qy = vec![0.0; c * dv];
                matmul((c, dv, d), &mut qy, (q, Layout::rows(d)), (y, Layout::rows(dv)), false);
                grads.since_start(3, &row_dots(&a3g, &qy, dv));
                grads.since_start(1, &row_dots(&ada, &pr.qs, d));
                grads.since_start(1, &row_dots(&adb, &pr.qp, dv));
                grads.until_end(3, &row_dots(&e3a_dy, &pr.b, dv));
                let mut ek_ds = vec![0.0; c * d];
                matmul((c, d, d), &mut ek_ds, (&ek, Layout::rows(d)), (&*ds, Layout::rows(d)), false);
                grads.until_end(1, &row_dots(&ek_ds, k, d));
                grads.until_end(1, &row_dots(&ek_dp, v, dv));
                grads.whole(3, three.rho * dot(dy, y));
                grads.whole(1, one.rho * (dot(ds, s) + dot(dp, p)));
                grads.mask(3, &hadamard(&dt, &pr.t));
                grads.mask(1, &hadamard(&dw, &pr.w));
                grads.finish(&mut dg[c0..c0 + c]);
            }
            // The gradients of the chunk's start state.
            scale(dy, three.rho);
            matmul((d, dv, c), dy, (q, Layout::transposed(d)), (&a3g, Layout::rows(dv)), true);
            scale(ds, one.rho);
            matmul((d, d, c), ds, (&ada, Layout::transposed(d)), (q, Layout::rows(d)), true);
            scale(dp, one.rho);
            matmul((d, dv, c), dp, (q, Layout::transposed(d)), (&adb, Layout::rows(dv)), true);
        }
    }
}

multiversion! {
    /// The serial recurrence ([`super::chunked`]) on CPU devices, one sequence and head, token by token in
    /// place: `state` `[S (d × d) | P | Y (d × dv)]` (the initial state on entry, the final
    /// one on return) and every token's output into `o [time, dv]` (no gradient).
    pub(crate) fn serial_head(x: &HeadInput, d: usize, dv: usize, state: &mut [f32], o: &mut [f32]) {
        let (s, py) = state.split_at_mut(d * d);
        let (p, y) = py.split_at_mut(d * dv);
        let (mut s_q, mut q_p) = (vec![0.0; d], vec![0.0; dv]);
        for (t, o) in o.chunks_exact_mut(dv).enumerate() {
            let (q, k, v) = x.chunk((t, 1), d, dv);
            let g = exp(x.log_g[t]);
            for (s, &ki) in s.chunks_exact_mut(d).zip(k) {
                s.iter_mut().zip(k).for_each(|(s, &kj)| *s = g * *s + ki * kj);
            }
            for (p, &k) in p.chunks_exact_mut(dv).zip(k) {
                p.iter_mut().zip(v).for_each(|(p, &v)| *p = g * *p + k * v);
            }
            mat_vec(s, q, &mut s_q);
            vec_mat(q, p, &mut q_p);
            for (y, &sq) in y.chunks_exact_mut(dv).zip(&s_q) {
                y.iter_mut().zip(&q_p).for_each(|(y, &qp)| *y = g * g * g * *y + sq * qp);
            }
            vec_mat(q, y, o);
        }
    }
}
