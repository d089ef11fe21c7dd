//! The causal attention's CPU kernel, FlashAttention-2 on the CPU. Per sequence and head, queries
//! in blocks of [`BLOCK`] rows meet keys in blocks of [`BLOCK`] up to the diagonal only.
//! Forward, with a running maximum `m` and sum `l` per query: `S = q kᵀ / √d`,
//! `P = exp(S − m)`, `O = (Σ P v) / l`, and `L = m + ln l` saved. Backward, with
//! `D = rowsum(∂O ⊙ O)` and `P = exp(S − L)` recomputed: `∂V += Pᵀ ∂O`,
//! `∂S = P ⊙ (∂O vᵀ − D) / √d`, `∂Q += ∂S k`, `∂K += ∂Sᵀ q`.

#![allow(deprecated)] // the generated dispatch names NdArray, a supported CPU device

use crate::backend::autodiff::record;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::{Autodiff, Backend, backend_extension};

use burn::backend::TensorMetadata;
use burn::backend::tensor::FloatTensor;
use burn::tensor::Shape;
use rayon::prelude::*;

use crate::backend::Host;
use crate::backend::gemm::{Layout, matmul};
use crate::backend::simd::{self, dot, exp, multiversion};

/// Queries and keys per block: a `BLOCK × BLOCK` score tile stays in the L2 cache.
const BLOCK: usize = 128;

/// The sizes of one call.
pub(crate) struct AttentionSizes {
    /// Sequences × heads.
    heads: usize,
    queries: usize,
    keys: usize,
    d: usize,
    dv: usize,
    /// The absolute position of the first query.
    start: usize,
    scale: f32,
}

impl AttentionSizes {
    fn of(q: &Shape, k: &Shape, v: &Shape, start: usize) -> Self {
        Self::new(q[0] * q[1], (q[2], k[2]), (q[3], v[3]), start)
    }

    /// `heads` sequences and heads of `(queries, keys)` tokens, `(d, dv)` wide.
    pub(crate) fn new(
        heads: usize,
        (queries, keys): (usize, usize),
        (d, dv): (usize, usize),
        start: usize,
    ) -> Self {
        Self {
            heads,
            queries,
            keys,
            d,
            dv,
            start,
            scale: 1.0 / (d as f32).sqrt(),
        }
    }

    /// Keys `0 .. n` that some query of the block from `first` with `rows` rows sees.
    fn keys_seen(&self, first: usize, rows: usize) -> usize {
        self.keys.min(self.start + first + rows)
    }

    /// Keys of the block from `j0` that the query `i` sees (0 when none).
    fn visible(&self, i: usize, j0: usize, cols: usize) -> usize {
        (self.start + i + 1).saturating_sub(j0).min(cols)
    }
}

multiversion! {
    /// One key block of the online softmax: the raw scores `s` of the block's query rows
    /// become `P = exp(S − m_new)` (0 where hidden), and `m`, `l` and the output rows
    /// `acc` are rescaled to the new maxima.
    fn online_softmax(
        s: &mut [f32],
        m: &mut [f32],
        l: &mut [f32],
        acc: &mut [f32],
        n: &AttentionSizes,
        first: usize,
        j0: usize,
    ) {
        let cols = s.len() / m.len();
        for (r, row) in s.chunks_exact_mut(cols).enumerate() {
            let visible = n.visible(first + r, j0, cols);
            let (seen, hidden) = row.split_at_mut(visible);
            hidden.fill(0.0);
            if visible == 0 {
                continue;
            }
            for x in seen.iter_mut() {
                *x *= n.scale;
            }
            let m_new = m[r].max(simd::max(seen));
            let correction = exp(m[r] - m_new);
            for x in seen.iter_mut() {
                *x = exp(*x - m_new);
            }
            l[r] = l[r] * correction + simd::sum(seen);
            for a in &mut acc[r * n.dv..][..n.dv] {
                *a *= correction;
            }
            m[r] = m_new;
        }
    }
}

multiversion! {
    /// The raw scores `s` of a tile become `P = exp(S − L)` (0 where hidden).
    fn probabilities(s: &mut [f32], lse: &[f32], n: &AttentionSizes, first: usize, j0: usize) {
        let cols = s.len() / lse.len();
        for (r, row) in s.chunks_exact_mut(cols).enumerate() {
            let visible = n.visible(first + r, j0, cols);
            let (seen, hidden) = row.split_at_mut(visible);
            hidden.fill(0.0);
            for x in seen.iter_mut() {
                *x = exp(*x * n.scale - lse[r]);
            }
        }
    }
}

multiversion! {
    /// `∂S = P ⊙ (∂P − D) / √d` in place of `∂P`.
    fn score_grad(dp: &mut [f32], p: &[f32], delta: &[f32], scale: f32) {
        let cols = dp.len() / delta.len();
        let rows = dp.chunks_exact_mut(cols).zip(p.chunks_exact(cols));
        for ((dp, p), &delta) in rows.zip(delta) {
            for (dp, p) in dp.iter_mut().zip(p) {
                *dp = p * (*dp - delta) * scale;
            }
        }
    }
}

/// One sequence and head: `o` and `lse` from `q`, `k`, `v`.
pub(crate) fn forward_head(
    n: &AttentionSizes,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    o: &mut [f32],
    lse: &mut [f32],
) {
    let (d, dv) = (n.d, n.dv);
    let mut s = vec![0.0; BLOCK * BLOCK];
    let mut acc = vec![0.0; BLOCK * dv];
    let (mut m, mut l) = (vec![0.0; BLOCK], vec![0.0; BLOCK]);
    for i0 in (0..n.queries).step_by(BLOCK) {
        let rows = BLOCK.min(n.queries - i0);
        let (m, l, acc) = (&mut m[..rows], &mut l[..rows], &mut acc[..rows * dv]);
        m.fill(f32::NEG_INFINITY);
        l.fill(0.0);
        acc.fill(0.0);
        let keys = n.keys_seen(i0, rows);
        for j0 in (0..keys).step_by(BLOCK) {
            let cols = BLOCK.min(keys - j0);
            let s = &mut s[..rows * cols];
            let (qi, kj) = (
                (&q[i0 * d..], Layout::rows(d)),
                (&k[j0 * d..], Layout::transposed(d)),
            );
            matmul((rows, cols, d), s, qi, kj, false);
            online_softmax(s, m, l, acc, n, i0, j0);
            let vj = (&v[j0 * dv..], Layout::rows(dv));
            matmul((rows, dv, cols), acc, (s, Layout::rows(cols)), vj, true);
        }
        let outputs = o[i0 * dv..].chunks_exact_mut(dv).zip(acc.chunks_exact(dv));
        for (r, (o, acc)) in outputs.take(rows).enumerate() {
            for (o, a) in o.iter_mut().zip(acc) {
                *o = a / l[r];
            }
            lse[i0 + r] = m[r] + l[r].ln();
        }
    }
}

/// One sequence and head's saved tensors and output gradient `g`.
pub(crate) struct AttentionHead<'a> {
    pub(crate) q: &'a [f32],
    pub(crate) k: &'a [f32],
    pub(crate) v: &'a [f32],
    pub(crate) o: &'a [f32],
    pub(crate) lse: &'a [f32],
    pub(crate) g: &'a [f32],
}

/// One sequence and head: `∂q`, `∂k`, `∂v`.
pub(crate) fn backward_head(
    n: &AttentionSizes,
    head: AttentionHead,
    dq: &mut [f32],
    dk: &mut [f32],
    dv_out: &mut [f32],
) {
    let AttentionHead { q, k, v, o, lse, g } = head;
    let (d, dv) = (n.d, n.dv);
    let delta: Vec<f32> = g
        .chunks_exact(dv)
        .zip(o.chunks_exact(dv))
        .map(|(g, o)| dot(g, o))
        .collect();
    let (mut p, mut dp) = (vec![0.0; BLOCK * BLOCK], vec![0.0; BLOCK * BLOCK]);
    for j0 in (0..n.keys).step_by(BLOCK) {
        let cols = BLOCK.min(n.keys - j0);
        let (dk, dv_block) = (
            &mut dk[j0 * d..][..cols * d],
            &mut dv_out[j0 * dv..][..cols * dv],
        );
        // The first query block with a query that sees key j0.
        let first = j0.saturating_sub(n.start) / BLOCK * BLOCK;
        for i0 in (first..n.queries).step_by(BLOCK) {
            let rows = BLOCK.min(n.queries - i0);
            let (p, dp) = (&mut p[..rows * cols], &mut dp[..rows * cols]);
            let (qi, gi) = (&q[i0 * d..], &g[i0 * dv..]);
            let kj = (&k[j0 * d..], Layout::transposed(d));
            matmul((rows, cols, d), p, (qi, Layout::rows(d)), kj, false);
            probabilities(p, &lse[i0..i0 + rows], n, i0, j0);
            let (p_t, g_rows) = ((&p[..], Layout::transposed(cols)), (gi, Layout::rows(dv)));
            matmul((cols, dv, rows), dv_block, p_t, g_rows, true);
            let vj = (&v[j0 * dv..], Layout::transposed(dv));
            matmul((rows, cols, dv), dp, (gi, Layout::rows(dv)), vj, false);
            score_grad(dp, p, &delta[i0..i0 + rows], n.scale);
            let ds = (&dp[..], Layout::rows(cols));
            let dqi = &mut dq[i0 * d..][..rows * d];
            matmul(
                (rows, d, cols),
                dqi,
                ds,
                (&k[j0 * d..], Layout::rows(d)),
                true,
            );
            let ds_t = (&dp[..], Layout::transposed(cols));
            matmul((cols, d, rows), dk, ds_t, (qi, Layout::rows(d)), true);
        }
    }
}

/// `[q, k, v]` → `o [batch, heads, Tq, dv]`; saves `q`, `k`, `v`, `o` and `L [batch,
/// heads, Tq]`.
pub(crate) fn forward<B: Host>(
    [q, k, v]: [FloatTensor<B>; 3],
    start: usize,
) -> (FloatTensor<B>, Vec<FloatTensor<B>>) {
    let q_shape = q.shape();
    let n = AttentionSizes::of(&q_shape, &k.shape(), &v.shape(), start);
    let (o, lse) = {
        let (qv, kv, vv) = (B::values(&q), B::values(&k), B::values(&v));
        let (mut o, mut lse) = (
            vec![0.0; n.heads * n.queries * n.dv],
            vec![0.0; n.heads * n.queries],
        );
        let heads = o
            .par_chunks_mut(n.queries * n.dv)
            .zip(lse.par_chunks_mut(n.queries))
            .enumerate();
        heads.for_each(|(h, (o, lse))| {
            let q = &qv[h * n.queries * n.d..][..n.queries * n.d];
            let k = &kv[h * n.keys * n.d..][..n.keys * n.d];
            let v = &vv[h * n.keys * n.dv..][..n.keys * n.dv];
            forward_head(&n, q, k, v, o, lse);
        });
        (o, lse)
    };
    let o_shape = Shape::new([q_shape[0], q_shape[1], n.queries, n.dv]);
    let lse_shape = Shape::new([q_shape[0], q_shape[1], n.queries]);
    let o = B::tensor(o, o_shape);
    (o.clone(), vec![q, k, v, o, B::tensor(lse, lse_shape)])
}

/// Saved `[q, k, v, o, L]` and `∂o` → `[∂q, ∂k, ∂v]`.
pub(crate) fn backward<B: Host>(
    saved: Vec<FloatTensor<B>>,
    grad: FloatTensor<B>,
    start: usize,
) -> [FloatTensor<B>; 3] {
    let [q, k, v, o, lse] =
        <[_; 5]>::try_from(saved).unwrap_or_else(|_| unreachable!("saved q, k, v, o and L"));
    let (q_shape, k_shape, v_shape) = (q.shape(), k.shape(), v.shape());
    let n = AttentionSizes::of(&q_shape, &k_shape, &v_shape, start);
    let values = [&q, &k, &v, &o, &lse, &grad].map(|t| B::values(t));
    let [qv, kv, vv, ov, lv, gv] = &values;
    let mut dq = vec![0.0; n.heads * n.queries * n.d];
    let mut dk = vec![0.0; n.heads * n.keys * n.d];
    let mut dv = vec![0.0; n.heads * n.keys * n.dv];
    let heads = dq
        .par_chunks_mut(n.queries * n.d)
        .zip(dk.par_chunks_mut(n.keys * n.d))
        .zip(dv.par_chunks_mut(n.keys * n.dv))
        .enumerate();
    heads.for_each(|(h, ((dq, dk), dv))| {
        let (tq, tk) = (n.queries, n.keys);
        let head = AttentionHead {
            q: &qv[h * tq * n.d..][..tq * n.d],
            k: &kv[h * tk * n.d..][..tk * n.d],
            v: &vv[h * tk * n.dv..][..tk * n.dv],
            o: &ov[h * tq * n.dv..][..tq * n.dv],
            lse: &lv[h * tq..][..tq],
            g: &gv[h * tq * n.dv..][..tq * n.dv],
        };
        backward_head(&n, head, dq, dk, dv);
    });
    [
        B::tensor(dq, q_shape),
        B::tensor(dk, k_shape),
        B::tensor(dv, v_shape),
    ]
}

/// Causal attention as a Burn backend extension: the CPU backends run its kernel, and their
/// autodiff wrapper records it as one graph node whose backward pass is the backward
/// kernel.
#[backend_extension(
    Autodiff,
    NdArray: cfg(feature = "ndarray"),
    Flex: cfg(feature = "flex")
)]
pub(crate) trait AttentionCpuOps: Backend {
    /// Causal softmax attention of queries from position `start`,
    /// [`super::causal_attention`].
    fn attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        start: usize,
    ) -> FloatTensor<Self>;
}

impl<B: Host> AttentionCpuOps for B {
    fn attention(
        q: FloatTensor<B>,
        k: FloatTensor<B>,
        v: FloatTensor<B>,
        start: usize,
    ) -> FloatTensor<B> {
        forward::<B>([q, k, v], start).0
    }
}

impl<B: Host, C: CheckpointStrategy> AttentionCpuOps for Autodiff<B, C> {
    fn attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        start: usize,
    ) -> FloatTensor<Self> {
        record::<B, C, 3>(
            [q, k, v],
            |inputs| forward::<B>(inputs, start),
            move |saved, grad| backward::<B>(saved, grad, start),
        )
    }
}
