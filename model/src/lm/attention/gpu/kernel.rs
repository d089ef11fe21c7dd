//! The causal attention on CubeCL devices (wgpu, cuda): FlashAttention's algorithm with
//! one unit per row, so no `Tq × Tk` tensor exists in the forward or the backward pass
//! (Burn's attention under autodiff materialises it). Forward, one unit per query with an
//! online softmax over the keys it sees: `O = (Σ exp(S − m) v) / l` and `L = m + ln l`
//! saved, with `S = q kᵀ / √d`. Backward, from `P = exp(S − L)` recomputed and
//! `D = rowsum(∂O ⊙ O)`: one unit per query for `∂Q = Σ ∂S k` (and `D`), then one per
//! key for `∂K = Σ ∂Sᵀ q` and `∂V = Σ Pᵀ ∂O`, with `∂S = P ⊙ (∂O vᵀ − D) / √d`.
//!
//! `d` and `dv` are compile-time sizes (a kernel per head width), so a row's query and
//! accumulators live in registers.

use burn::backend::TensorMetadata;
use burn_cubecl::cubecl;
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;

use crate::backend::gpu::{cubes, empty, units};

/// The keys `0 .. n` a query sees: `through` of them, at most `keys`.
#[cube]
fn visible(keys: usize, through: usize) -> usize {
    let mut n = through;
    if keys < through {
        n = keys;
    }
    n
}

/// `o [rows, dv]` and `lse [rows]` of the queries `q [rows, d]` (rows = sequences ×
/// `queries`) over their sequence's keys `k [.., keys, d]`, `v [.., keys, dv]`; query `i`
/// sees keys `j ≤ start + i`.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn forward_kernel(
    q: &Tensor<f32>,
    k: &Tensor<f32>,
    v: &Tensor<f32>,
    o: &mut Tensor<f32>,
    lse: &mut Tensor<f32>,
    queries: usize,
    keys: usize,
    start: usize,
    scale: f32,
    #[comptime] d: usize,
    #[comptime] dv: usize,
) {
    let row = ABSOLUTE_POS;
    if row >= lse.len() {
        terminate!();
    }
    let first_key = (row / queries) * keys;
    let seen = visible(keys, start + row % queries + 1);
    let mut qi = Array::<f32>::new(d);
    for x in 0..d {
        qi[x] = q[row * d + x] * scale;
    }
    let mut acc = Array::<f32>::new(dv);
    for x in 0..dv {
        acc[x] = 0.0;
    }
    let mut m = f32::new(-1.0e30);
    let mut l = 0.0f32;
    for j in 0..seen {
        let key = first_key + j;
        let mut s = 0.0f32;
        for x in 0..d {
            s += qi[x] * k[key * d + x];
        }
        let mut m_new = m;
        if s > m {
            m_new = s;
        }
        let correction = (m - m_new).exp();
        let p = (s - m_new).exp();
        l = l * correction + p;
        for x in 0..dv {
            acc[x] = acc[x] * correction + p * v[key * dv + x];
        }
        m = m_new;
    }
    for x in 0..dv {
        o[row * dv + x] = acc[x] / l;
    }
    lse[row] = m + l.ln();
}

/// `∂q` of every query row and `delta = rowsum(∂O ⊙ O)`, from the saved `lse`.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn query_grads(
    q: &Tensor<f32>,
    k: &Tensor<f32>,
    v: &Tensor<f32>,
    o: &Tensor<f32>,
    lse: &Tensor<f32>,
    grad: &Tensor<f32>,
    dq: &mut Tensor<f32>,
    delta: &mut Tensor<f32>,
    queries: usize,
    keys: usize,
    start: usize,
    scale: f32,
    #[comptime] d: usize,
    #[comptime] dv: usize,
) {
    let row = ABSOLUTE_POS;
    if row >= lse.len() {
        terminate!();
    }
    let first_key = (row / queries) * keys;
    let seen = visible(keys, start + row % queries + 1);
    let mut g = Array::<f32>::new(dv);
    let mut di = 0.0f32;
    for x in 0..dv {
        g[x] = grad[row * dv + x];
        di += g[x] * o[row * dv + x];
    }
    delta[row] = di;
    let mut acc = Array::<f32>::new(d);
    for x in 0..d {
        acc[x] = 0.0;
    }
    let li = lse[row];
    for j in 0..seen {
        let key = first_key + j;
        let mut s = 0.0f32;
        for x in 0..d {
            s += q[row * d + x] * k[key * d + x];
        }
        let mut dp = 0.0f32;
        for x in 0..dv {
            dp += g[x] * v[key * dv + x];
        }
        let ds = (s * scale - li).exp() * (dp - di);
        for x in 0..d {
            acc[x] += ds * k[key * d + x];
        }
    }
    for x in 0..d {
        dq[row * d + x] = acc[x] * scale;
    }
}

/// `∂k` and `∂v` of every key row, from the saved `lse` and the queries' `delta`.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn key_grads(
    q: &Tensor<f32>,
    k: &Tensor<f32>,
    v: &Tensor<f32>,
    lse: &Tensor<f32>,
    delta: &Tensor<f32>,
    grad: &Tensor<f32>,
    dk: &mut Tensor<f32>,
    dv_out: &mut Tensor<f32>,
    queries: usize,
    keys: usize,
    start: usize,
    scale: f32,
    #[comptime] d: usize,
    #[comptime] dv: usize,
) {
    let key = ABSOLUTE_POS;
    if key >= k.len() / d {
        terminate!();
    }
    let j = key % keys;
    let first_query = (key / keys) * queries;
    // Query i sees key j when start + i ≥ j.
    let mut from = 0;
    if j > start {
        from = j - start;
    }
    let mut kj = Array::<f32>::new(d);
    let mut dk_acc = Array::<f32>::new(d);
    for x in 0..d {
        kj[x] = k[key * d + x];
        dk_acc[x] = 0.0;
    }
    let mut vj = Array::<f32>::new(dv);
    let mut dv_acc = Array::<f32>::new(dv);
    for x in 0..dv {
        vj[x] = v[key * dv + x];
        dv_acc[x] = 0.0;
    }
    for i in from..queries {
        let row = first_query + i;
        let mut s = 0.0f32;
        for x in 0..d {
            s += q[row * d + x] * kj[x];
        }
        let p = (s * scale - lse[row]).exp();
        let mut dp = 0.0f32;
        for x in 0..dv {
            let g = grad[row * dv + x];
            dv_acc[x] += p * g;
            dp += g * vj[x];
        }
        let ds = p * (dp - delta[row]);
        for x in 0..d {
            dk_acc[x] += ds * q[row * d + x];
        }
    }
    for x in 0..d {
        dk[key * d + x] = dk_acc[x] * scale;
    }
    for x in 0..dv {
        dv_out[key * dv + x] = dv_acc[x];
    }
}

/// The sizes of a call: `q [b, h, queries, d]`, `v [b, h, keys, dv]`.
struct RowSizes {
    rows: usize,
    queries: usize,
    keys: usize,
    d: usize,
    dv: usize,
    scale: f32,
}

impl RowSizes {
    fn of(q: &CubeTensor, v: &CubeTensor) -> Self {
        let ([b, h, queries, d], [.., keys, dv]) = (q.shape().dims::<4>(), v.shape().dims::<4>());
        Self {
            rows: b * h * queries,
            queries,
            keys,
            d,
            dv,
            scale: 1.0 / (d as f32).sqrt(),
        }
    }
}

/// One unit per row of `rows`, in cubes of `like`'s device (the kernels stop past the
/// last row).
fn grid(like: &CubeTensor, rows: usize) -> (CubeCount, CubeDim) {
    let dim = CubeDim::new_1d(units(like));
    (cubes(like, rows.div_ceil(dim.num_elems() as usize)), dim)
}

/// `[q, k, v]` → `o [b, h, Tq, dv]` and the log-sum-exp of every query's scores.
pub(crate) fn forward(inputs: [CubeTensor; 3], start: usize) -> (CubeTensor, CubeTensor) {
    let [q, k, v] = inputs.map(into_contiguous);
    let n = RowSizes::of(&q, &v);
    let mut o_dims = q.shape().dims::<4>();
    o_dims[3] = n.dv;
    let (o, lse) = (empty(&q, o_dims), empty(&q, [n.rows]));
    let (count, dim) = grid(&q, n.rows);
    forward_kernel::launch(
        &q.client.clone(),
        count,
        dim,
        q.into_tensor_arg(),
        k.into_tensor_arg(),
        v.into_tensor_arg(),
        o.clone().into_tensor_arg(),
        lse.clone().into_tensor_arg(),
        n.queries,
        n.keys,
        start,
        n.scale,
        n.d,
        n.dv,
    );
    (o, lse)
}

/// Saved `[q, k, v, o, lse]` and `∂o` → `[∂q, ∂k, ∂v]`.
pub(crate) fn backward(saved: [CubeTensor; 5], grad: CubeTensor, start: usize) -> [CubeTensor; 3] {
    let [q, k, v, o, lse] = saved.map(into_contiguous);
    let grad = into_contiguous(grad);
    let n = RowSizes::of(&q, &v);
    let (dq, dk, dv) = (
        empty(&q, q.shape().dims::<4>()),
        empty(&q, k.shape().dims::<4>()),
        empty(&q, v.shape().dims::<4>()),
    );
    let delta = empty(&q, [n.rows]);
    let client = q.client.clone();
    let (count, dim) = grid(&q, n.rows);
    query_grads::launch(
        &client,
        count,
        dim,
        q.clone().into_tensor_arg(),
        k.clone().into_tensor_arg(),
        v.clone().into_tensor_arg(),
        o.into_tensor_arg(),
        lse.clone().into_tensor_arg(),
        grad.clone().into_tensor_arg(),
        dq.clone().into_tensor_arg(),
        delta.clone().into_tensor_arg(),
        n.queries,
        n.keys,
        start,
        n.scale,
        n.d,
        n.dv,
    );
    let (count, dim) = grid(&q, n.rows / n.queries.max(1) * n.keys);
    key_grads::launch(
        &client,
        count,
        dim,
        q.into_tensor_arg(),
        k.into_tensor_arg(),
        v.into_tensor_arg(),
        lse.into_tensor_arg(),
        delta.into_tensor_arg(),
        grad.into_tensor_arg(),
        dk.clone().into_tensor_arg(),
        dv.clone().into_tensor_arg(),
        n.queries,
        n.keys,
        start,
        n.scale,
        n.d,
        n.dv,
    );
    [dq, dk, dv]
}
