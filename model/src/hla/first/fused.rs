//! The fused chunk-parallel form of first order on CPU devices ([`crate::hla::fused`]): per
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
//! (`S` in a chunk's equations is its start state, saved by the forward pass.) The gates
//! get no gradient: the fused form runs only for gates that need none.

use burn::backend::TensorMetadata;
use burn::backend::tensor::FloatTensor;
use burn::prelude::*;
use burn::tensor::Shape;
use rayon::prelude::*;

use super::State;
use crate::fused::Host;
use crate::fused::gemm::{Layout, matmul};
use crate::fused::simd::multiversion;
use crate::hla::HlaInput;
use crate::hla::fused::{
    ChunkDecay, Decays, Head, Sizes, apply_mask, log_gates, scale, scale_rows, unpack,
};

/// The fused form of [`super::chunked`] (same arguments and results).
pub(super) fn chunked(input: &HlaInput, state: State, chunk: usize) -> (Tensor<4>, State) {
    use crate::fused::FusedOps;
    let [b, h, t, d] = input.q.dims();
    let dv = input.v.dims()[3];
    let packed = <burn::backend::Dispatch as FusedOps>::hla_first(
        input.q.clone().into_dispatch(),
        input.k.clone().into_dispatch(),
        input.v.clone().into_dispatch(),
        log_gates(input).into_dispatch(),
        state.s.into_dispatch(),
        chunk,
    );
    let (o, states) = unpack(
        Tensor::from_dispatch(packed),
        [b, h, t, dv],
        &[[b, h, d, dv]],
    );
    let [s] = <[_; 1]>::try_from(states).unwrap_or_else(|_| unreachable!("S"));
    (o, State { s })
}

/// `M = (Q Kᵀ) ⊙ D` of a chunk.
#[inline(always)]
fn scores(q: &[f32], k: &[f32], decay: &ChunkDecay, d: usize) -> Vec<f32> {
    let c = decay.a.len();
    let mut m = vec![0.0; c * c];
    matmul(
        (c, c, d),
        &mut m,
        (q, Layout::rows(d)),
        (k, Layout::transposed(d)),
        false,
    );
    apply_mask(&mut m, &decay.mask);
    m
}

multiversion! {
    /// One sequence and head forward: `o`, the final `S` (holding the initial state on
    /// entry) and every chunk's start state into `starts`.
    pub(crate) fn forward_head(n: &Sizes, x: &Head, s: &mut [f32], o: &mut [f32], starts: &mut [f32]) {
        let (d, dv) = (n.d, n.dv);
        let mut decays = Decays::default();
        for (span, saved) in n.spans().zip(starts.chunks_exact_mut(d * dv)) {
            saved.copy_from_slice(s);
            let (c0, c) = span;
            let (q, k, v) = x.chunk(span, d, dv);
            let decay = decays.of(&x.log_g[c0..c0 + c]);
            let m = scores(q, k, decay, d);
            let o = &mut o[c0 * dv..][..c * dv];
            matmul((c, dv, d), o, (q, Layout::rows(d)), (s, Layout::rows(dv)), false);
            let qs = o.to_vec();
            scale_rows(o, &qs, dv, &decay.a);
            matmul((c, dv, c), o, (&m, Layout::rows(c)), (v, Layout::rows(dv)), true);
            let mut ev = vec![0.0; c * dv];
            scale_rows(&mut ev, v, dv, &decay.e);
            scale(s, decay.rho);
            matmul((d, dv, c), s, (k, Layout::transposed(d)), (&ev, Layout::rows(dv)), true);
        }
    }
}

multiversion! {
    /// One sequence and head backward, from `∂o` (`g`) and the saved chunk start states;
    /// `ds` holds the final state's gradient on entry and the initial state's on return.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn backward_head(
        n: &Sizes,
        x: &Head,
        starts: &[f32],
        g: &[f32],
        dq: &mut [f32],
        dk: &mut [f32],
        dv_out: &mut [f32],
        ds: &mut [f32],
    ) {
        let (d, dv) = (n.d, n.dv);
        let mut decays = Decays::default();
        let spans: Vec<_> = n.spans().zip(starts.chunks_exact(d * dv)).collect();
        for (span, s) in spans.into_iter().rev() {
            let (c0, c) = span;
            let (q, k, v) = x.chunk(span, d, dv);
            let decay = decays.of(&x.log_g[c0..c0 + c]);
            let m = scores(q, k, decay, d);
            let g = &g[c0 * dv..][..c * dv];
            let mut gm = vec![0.0; c * c];
            matmul((c, c, dv), &mut gm, (g, Layout::rows(dv)), (v, Layout::transposed(dv)), false);
            apply_mask(&mut gm, &decay.mask);
            // ∂Q = diag(a) ∂O Sᵀ + G K.
            let mut ag = vec![0.0; c * dv];
            scale_rows(&mut ag, g, dv, &decay.a);
            let dqc = &mut dq[c0 * d..][..c * d];
            matmul((c, d, dv), dqc, (&ag, Layout::rows(dv)), (s, Layout::transposed(dv)), false);
            matmul((c, d, c), dqc, (&gm, Layout::rows(c)), (k, Layout::rows(d)), true);
            // ∂K = Gᵀ Q + diag(e) V ∂Sᵀ.
            let mut ev = vec![0.0; c * dv];
            scale_rows(&mut ev, v, dv, &decay.e);
            let dkc = &mut dk[c0 * d..][..c * d];
            matmul((c, d, c), dkc, (&gm, Layout::transposed(c)), (q, Layout::rows(d)), false);
            matmul((c, d, dv), dkc, (&ev, Layout::rows(dv)), (ds, Layout::transposed(dv)), true);
            // ∂V = Mᵀ ∂O + diag(e) K ∂S.
            let mut ek = vec![0.0; c * d];
            scale_rows(&mut ek, k, d, &decay.e);
            let dvc = &mut dv_out[c0 * dv..][..c * dv];
            matmul((c, dv, c), dvc, (&m, Layout::transposed(c)), (g, Layout::rows(dv)), false);
            matmul((c, dv, d), dvc, (&ek, Layout::rows(d)), (ds, Layout::rows(dv)), true);
            // ∂S of the chunk's start state.
            let mut aq = vec![0.0; c * d];
            scale_rows(&mut aq, q, d, &decay.a);
            scale(ds, decay.rho);
            matmul((d, dv, c), ds, (&aq, Layout::transposed(d)), (g, Layout::rows(dv)), true);
        }
    }
}

/// `[q, k, v, log g [gb, gh, time], S₀]` → the packed `[o, S]`; saves the inputs but the
/// initial state, and the start state of every chunk.
pub(crate) fn forward<B: Host>(
    inputs: [FloatTensor<B>; 5],
    chunk: usize,
) -> (FloatTensor<B>, Vec<FloatTensor<B>>) {
    let [q, k, v, log_g, s0] = inputs;
    let n = Sizes::new(&q.shape(), &v.shape(), &log_g.shape(), chunk);
    let (d, dv) = (n.d, n.dv);
    let (packed, starts) = {
        let values = [&q, &k, &v, &log_g, &s0].map(|t| B::values(t));
        let [qv, kv, vv, gv, s0] = &values;
        let sequences = n.sequences();
        let mut packed = vec![0.0; sequences * (n.time * dv + d * dv)];
        let (o, s) = packed.split_at_mut(sequences * n.time * dv);
        s.copy_from_slice(s0);
        let start_len = n.chunks() * d * dv;
        let mut starts = vec![0.0; sequences * start_len];
        let heads = o
            .par_chunks_mut(n.time * dv)
            .zip(s.par_chunks_mut(d * dv))
            .zip(starts.par_chunks_mut(start_len))
            .enumerate();
        heads.for_each(|(i, ((o, s), starts))| {
            let x = Head {
                q: &qv[i * n.time * d..][..n.time * d],
                k: &kv[i * n.time * d..][..n.time * d],
                v: &vv[i * n.time * dv..][..n.time * dv],
                log_g: n.gates_of(gv, i),
            };
            forward_head(&n, &x, s, o, starts);
        });
        (packed, starts)
    };
    let (packed_len, starts_len) = (packed.len(), starts.len());
    let saved = vec![q, k, v, log_g, B::tensor(starts, Shape::new([starts_len]))];
    (B::tensor(packed, Shape::new([packed_len])), saved)
}

/// Saved `[q, k, v, log g, starts]` and the packed gradient `[∂o, ∂S]` →
/// `[∂q, ∂k, ∂v, 0, ∂S₀]` (the gates get none).
pub(crate) fn backward<B: Host>(
    saved: Vec<FloatTensor<B>>,
    grad: FloatTensor<B>,
    chunk: usize,
) -> [FloatTensor<B>; 5] {
    let [q, k, v, log_g, starts] = <[_; 5]>::try_from(saved)
        .unwrap_or_else(|_| unreachable!("saved q, k, v, log g and the starts"));
    let (q_shape, k_shape, v_shape, g_shape) = (q.shape(), k.shape(), v.shape(), log_g.shape());
    let n = Sizes::new(&q_shape, &v_shape, &g_shape, chunk);
    let (d, dv) = (n.d, n.dv);
    let values = [&q, &k, &v, &log_g, &starts, &grad].map(|t| B::values(t));
    let [qv, kv, vv, gv, sv, grad] = &values;
    let (g_o, g_s) = grad.split_at(n.sequences() * n.time * dv);
    let (mut dq, mut dk, mut dv_out) = (
        vec![0.0; qv.len()],
        vec![0.0; kv.len()],
        vec![0.0; vv.len()],
    );
    let mut ds = g_s.to_vec();
    let start_len = n.chunks() * d * dv;
    let heads = dq
        .par_chunks_mut(n.time * d)
        .zip(dk.par_chunks_mut(n.time * d))
        .zip(dv_out.par_chunks_mut(n.time * dv))
        .zip(ds.par_chunks_mut(d * dv))
        .enumerate();
    heads.for_each(|(i, (((dq, dk), dv_i), ds))| {
        let x = Head {
            q: &qv[i * n.time * d..][..n.time * d],
            k: &kv[i * n.time * d..][..n.time * d],
            v: &vv[i * n.time * dv..][..n.time * dv],
            log_g: n.gates_of(gv, i),
        };
        let g = &g_o[i * n.time * dv..][..n.time * dv];
        let starts = &sv[i * start_len..][..start_len];
        backward_head(&n, &x, starts, g, dq, dk, dv_i, ds);
    });
    [
        B::tensor(dq, q_shape),
        B::tensor(dk, k_shape),
        B::tensor(dv_out, v_shape),
        B::tensor(vec![0.0; gv.len()], g_shape),
        B::tensor(ds, Shape::new([n.batch, n.heads, d, dv])),
    ]
}
