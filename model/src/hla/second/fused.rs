//! The fused chunk-parallel form of second order on CPU devices ([`crate::hla::fused`]):
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
//! The gates get no gradient: the fused form runs only for gates that need none.

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
    let packed = <burn::backend::Dispatch as FusedOps>::hla_second(
        input.q.clone().into_dispatch(),
        input.k.clone().into_dispatch(),
        input.v.clone().into_dispatch(),
        log_gates(input).into_dispatch(),
        state.s.into_dispatch(),
        state.z.into_dispatch(),
        chunk,
    );
    let (o, states) = unpack(
        Tensor::from_dispatch(packed),
        [b, h, t, dv],
        &[[b, h, d, d], [b, h, d, dv]],
    );
    let [s, z] = <[_; 2]>::try_from(states).unwrap_or_else(|_| unreachable!("S and Z"));
    (o, State { s, z })
}

/// One chunk's products that the backward pass recomputes: `W`, `A`, `P`, `diag(e²) V`
/// and `diag(e) K`.
struct Products {
    w: Vec<f32>,
    a: Vec<f32>,
    p: Vec<f32>,
    ev: Vec<f32>,
    ek: Vec<f32>,
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
    let c = decay.a.len();
    let mut w = vec![0.0; c * c];
    matmul(
        (c, c, d),
        &mut w,
        (q, Layout::rows(d)),
        (k, Layout::transposed(d)),
        false,
    );
    apply_mask(&mut w, &decay.mask);
    let mut a = vec![0.0; c * d];
    matmul(
        (c, d, d),
        &mut a,
        (q, Layout::rows(d)),
        (s, Layout::transposed(d)),
        false,
    );
    let qs = a.clone();
    scale_rows(&mut a, &qs, d, &decay.a);
    matmul(
        (c, d, c),
        &mut a,
        (&w, Layout::rows(c)),
        (k, Layout::rows(d)),
        true,
    );
    let mut p = vec![0.0; c * c];
    matmul(
        (c, c, d),
        &mut p,
        (q, Layout::rows(d)),
        (&a, Layout::transposed(d)),
        false,
    );
    apply_mask(&mut p, &decay.mask2);
    let (mut ev, mut ek) = (vec![0.0; c * dv], vec![0.0; c * d]);
    scale_rows(&mut ev, v, dv, &decay.e2);
    scale_rows(&mut ek, k, d, &decay.e);
    Products { w, a, p, ev, ek }
}

multiversion! {
    /// One sequence and head forward: `o`, the final `(S, Z)` (holding the initial state on
    /// entry) and every chunk's start state into `starts`.
    pub(crate) fn forward_head(
        n: &Sizes,
        x: &Head,
        s: &mut [f32],
        z: &mut [f32],
        o: &mut [f32],
        starts: &mut [f32],
    ) {
        let (d, dv) = (n.d, n.dv);
        let mut decays = Decays::default();
        let start_len = d * d + d * dv;
        for ((c0, c), saved) in n.spans().zip(starts.chunks_exact_mut(start_len)) {
            saved[..d * d].copy_from_slice(s);
            saved[d * d..].copy_from_slice(z);
            let chunk = x.chunk((c0, c), d, dv);
            let decay = decays.of(&x.log_g[c0..c0 + c]);
            let pr = products(chunk, s, decay, (d, dv));
            let (q, k, v) = chunk;
            let o = &mut o[c0 * dv..][..c * dv];
            matmul((c, dv, d), o, (q, Layout::rows(d)), (z, Layout::rows(dv)), false);
            let qz = o.to_vec();
            scale_rows(o, &qz, dv, &decay.a2);
            matmul((c, dv, c), o, (&pr.p, Layout::rows(c)), (v, Layout::rows(dv)), true);
            scale(z, decay.rho * decay.rho);
            matmul((d, dv, c), z, (&pr.a, Layout::transposed(d)), (&pr.ev, Layout::rows(dv)), true);
            scale(s, decay.rho);
            matmul((d, d, c), s, (k, Layout::transposed(d)), (&pr.ek, Layout::rows(d)), true);
        }
    }
}

/// One sequence and head's gradients and the gradient of its state (the final state's on
/// entry, the initial state's on return).
pub(crate) struct Grads<'a> {
    pub(crate) q: &'a mut [f32],
    pub(crate) k: &'a mut [f32],
    pub(crate) v: &'a mut [f32],
    pub(crate) s: &'a mut [f32],
    pub(crate) z: &'a mut [f32],
}

multiversion! {
    /// One sequence and head backward, from `∂o` (`g`) and the saved chunk start states.
    pub(crate) fn backward_head(n: &Sizes, x: &Head, starts: &[f32], g: &[f32], out: &mut Grads) {
        let (d, dv) = (n.d, n.dv);
        let mut decays = Decays::default();
        let start_len = d * d + d * dv;
        let spans: Vec<_> = n.spans().zip(starts.chunks_exact(start_len)).collect();
        for ((c0, c), saved) in spans.into_iter().rev() {
            let (s, z) = saved.split_at(d * d);
            let chunk = x.chunk((c0, c), d, dv);
            let decay = decays.of(&x.log_g[c0..c0 + c]);
            let pr = products(chunk, s, decay, (d, dv));
            let (q, k, v) = chunk;
            let g = &g[c0 * dv..][..c * dv];
            let (ds, dz) = (&mut *out.s, &mut *out.z);
            // G = (∂O Vᵀ) ⊙ D².
            let mut gm = vec![0.0; c * c];
            matmul((c, c, dv), &mut gm, (g, Layout::rows(dv)), (v, Layout::transposed(dv)), false);
            apply_mask(&mut gm, &decay.mask2);
            // ∂V = Pᵀ ∂O + diag(e²) A ∂Z.
            let dvc = &mut out.v[c0 * dv..][..c * dv];
            matmul((c, dv, c), dvc, (&pr.p, Layout::transposed(c)), (g, Layout::rows(dv)), false);
            let mut ea = vec![0.0; c * d];
            scale_rows(&mut ea, &pr.a, d, &decay.e2);
            matmul((c, dv, d), dvc, (&ea, Layout::rows(d)), (dz, Layout::rows(dv)), true);
            // ∂A = Gᵀ Q + diag(e²) V ∂Zᵀ.
            let mut da = vec![0.0; c * d];
            matmul((c, d, c), &mut da, (&gm, Layout::transposed(c)), (q, Layout::rows(d)), false);
            matmul((c, d, dv), &mut da, (&pr.ev, Layout::rows(dv)), (dz, Layout::transposed(dv)), true);
            // H = (∂A Kᵀ) ⊙ D.
            let mut hm = vec![0.0; c * c];
            matmul((c, c, d), &mut hm, (&da, Layout::rows(d)), (k, Layout::transposed(d)), false);
            apply_mask(&mut hm, &decay.mask);
            // ∂Q = diag(a²) ∂O Zᵀ + G A + diag(a) ∂A S + H K.
            let mut a2g = vec![0.0; c * dv];
            scale_rows(&mut a2g, g, dv, &decay.a2);
            let mut ada = vec![0.0; c * d];
            scale_rows(&mut ada, &da, d, &decay.a);
            let dqc = &mut out.q[c0 * d..][..c * d];
            matmul((c, d, dv), dqc, (&a2g, Layout::rows(dv)), (z, Layout::transposed(dv)), false);
            matmul((c, d, c), dqc, (&gm, Layout::rows(c)), (&pr.a, Layout::rows(d)), true);
            matmul((c, d, d), dqc, (&ada, Layout::rows(d)), (s, Layout::rows(d)), true);
            matmul((c, d, c), dqc, (&hm, Layout::rows(c)), (k, Layout::rows(d)), true);
            // ∂K = Wᵀ ∂A + Hᵀ Q + diag(e) K (∂S + ∂Sᵀ).
            let dkc = &mut out.k[c0 * d..][..c * d];
            matmul((c, d, c), dkc, (&pr.w, Layout::transposed(c)), (&da, Layout::rows(d)), false);
            matmul((c, d, c), dkc, (&hm, Layout::transposed(c)), (q, Layout::rows(d)), true);
            let mut sym = vec![0.0; d * d];
            for i in 0..d {
                for j in 0..d {
                    sym[i * d + j] = ds[i * d + j] + ds[j * d + i];
                }
            }
            matmul((c, d, d), dkc, (&pr.ek, Layout::rows(d)), (&sym, Layout::rows(d)), true);
            // The gradients of the chunk's start state.
            scale(ds, decay.rho);
            matmul((d, d, c), ds, (&ada, Layout::transposed(d)), (q, Layout::rows(d)), true);
            scale(dz, decay.rho * decay.rho);
            matmul((d, dv, c), dz, (q, Layout::transposed(d)), (&a2g, Layout::rows(dv)), true);
        }
    }
}

/// `[q, k, v, log g [gb, gh, time], S₀, Z₀]` → the packed `[o, S, Z]`; saves the inputs
/// but the initial state, and the start state of every chunk.
pub(crate) fn forward<B: Host>(
    inputs: [FloatTensor<B>; 6],
    chunk: usize,
) -> (FloatTensor<B>, Vec<FloatTensor<B>>) {
    let [q, k, v, log_g, s0, z0] = inputs;
    let n = Sizes::new(&q.shape(), &v.shape(), &log_g.shape(), chunk);
    let (d, dv) = (n.d, n.dv);
    let (packed, starts) = {
        let values = [&q, &k, &v, &log_g, &s0, &z0].map(|t| B::values(t));
        let [qv, kv, vv, gv, s0, z0] = &values;
        let sequences = n.sequences();
        let mut packed = vec![0.0; sequences * (n.time * dv + d * d + d * dv)];
        let (o, states) = packed.split_at_mut(sequences * n.time * dv);
        let (s, z) = states.split_at_mut(sequences * d * d);
        s.copy_from_slice(s0);
        z.copy_from_slice(z0);
        let start_len = n.chunks() * (d * d + d * dv);
        let mut starts = vec![0.0; sequences * start_len];
        let heads = o
            .par_chunks_mut(n.time * dv)
            .zip(s.par_chunks_mut(d * d))
            .zip(z.par_chunks_mut(d * dv))
            .zip(starts.par_chunks_mut(start_len))
            .enumerate();
        heads.for_each(|(i, (((o, s), z), starts))| {
            let x = Head {
                q: &qv[i * n.time * d..][..n.time * d],
                k: &kv[i * n.time * d..][..n.time * d],
                v: &vv[i * n.time * dv..][..n.time * dv],
                log_g: n.gates_of(gv, i),
            };
            forward_head(&n, &x, s, z, o, starts);
        });
        (packed, starts)
    };
    let packed_len = packed.len();
    let starts_len = starts.len();
    let saved = vec![q, k, v, log_g, B::tensor(starts, Shape::new([starts_len]))];
    (B::tensor(packed, Shape::new([packed_len])), saved)
}

/// Saved `[q, k, v, log g, starts]` and the packed gradient `[∂o, ∂S, ∂Z]` →
/// `[∂q, ∂k, ∂v, 0, ∂S₀, ∂Z₀]` (the gates get none).
pub(crate) fn backward<B: Host>(
    saved: Vec<FloatTensor<B>>,
    grad: FloatTensor<B>,
    chunk: usize,
) -> [FloatTensor<B>; 6] {
    let [q, k, v, log_g, starts] = <[_; 5]>::try_from(saved)
        .unwrap_or_else(|_| unreachable!("saved q, k, v, log g and the starts"));
    let (q_shape, v_shape, g_shape) = (q.shape(), v.shape(), log_g.shape());
    let n = Sizes::new(&q_shape, &v_shape, &g_shape, chunk);
    let (d, dv) = (n.d, n.dv);
    let values = [&q, &k, &v, &log_g, &starts, &grad].map(|t| B::values(t));
    let [qv, kv, vv, gv, sv, grad] = &values;
    let sequences = n.sequences();
    let (g_o, g_states) = grad.split_at(sequences * n.time * dv);
    let (mut dq, mut dk, mut dv_out) = (
        vec![0.0; qv.len()],
        vec![0.0; kv.len()],
        vec![0.0; vv.len()],
    );
    let (ds, dz) = g_states.split_at(sequences * d * d);
    let (mut ds, mut dz) = (ds.to_vec(), dz.to_vec());
    let start_len = n.chunks() * (d * d + d * dv);
    let heads = dq
        .par_chunks_mut(n.time * d)
        .zip(dk.par_chunks_mut(n.time * d))
        .zip(dv_out.par_chunks_mut(n.time * dv))
        .zip(ds.par_chunks_mut(d * d))
        .zip(dz.par_chunks_mut(d * dv))
        .enumerate();
    heads.for_each(|(i, ((((dq, dk), dv_i), ds), dz))| {
        let x = Head {
            q: &qv[i * n.time * d..][..n.time * d],
            k: &kv[i * n.time * d..][..n.time * d],
            v: &vv[i * n.time * dv..][..n.time * dv],
            log_g: n.gates_of(gv, i),
        };
        let mut out = Grads {
            q: dq,
            k: dk,
            v: dv_i,
            s: ds,
            z: dz,
        };
        let g = &g_o[i * n.time * dv..][..n.time * dv];
        backward_head(&n, &x, &sv[i * start_len..][..start_len], g, &mut out);
    });
    let (b, h) = (n.batch, n.heads);
    [
        B::tensor(dq, q_shape),
        B::tensor(dk, k.shape()),
        B::tensor(dv_out, v_shape),
        B::tensor(vec![0.0; gv.len()], g_shape),
        B::tensor(ds, Shape::new([b, h, d, d])),
        B::tensor(dz, Shape::new([b, h, d, dv])),
    ]
}
