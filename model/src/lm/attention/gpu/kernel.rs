//! The causal attention on CubeCL devices (wgpu, cuda) with FlashAttention-2's tiling, so
//! no `Tq × Tk` tensor exists in the forward or the backward pass (Burn's attention under
//! autodiff materialises it) and each key or query row is read from global memory once
//! per tile of rows, not once per row.
//!
//! Forward, one cube per tile of queries (a unit per query): the cube copies each tile of
//! keys and values it sees into shared memory, and each unit runs an online softmax over
//! them: `O = (Σ exp(S − m) v) / l` and `L = m + ln l` saved, with `S = q kᵀ / √d`.
//! Backward, from `P = exp(S − L)` recomputed and `D = rowsum(∂O ⊙ O)`: one cube per
//! query tile for `∂Q = Σ ∂S k` (and `D`) over shared key and value tiles, then one cube
//! per key tile for `∂K = Σ ∂Sᵀ q` and `∂V = Σ Pᵀ ∂O` over shared tiles of queries, their
//! `∂O`, `L` and `D`, with `∂S = P ⊙ (∂O vᵀ − D) / √d`. Each unit owns its row's sums, so
//! there are no atomics.
//!
//! `d`, `dv` and the tiles' rows are compile-time sizes (a kernel per head width), so a
//! row's query and accumulators live in registers. The products run on the CUDA cores
//! (one unit per row); tensor-core fragments are the fused tile kernels' work.

use burn::backend::TensorMetadata;
use burn_cubecl::cubecl;
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;

use super::plan::tiles;
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

/// Copies rows `from .. from + rows` of `src` (rows of `width`, `total` of them; zeros
/// past the last) into `dst`, every unit of the cube taking every `CUBE_DIM`-th value so
/// that neighbouring units read neighbouring addresses.
#[cube]
fn load_tile(
    src: &Tensor<f32>,
    dst: &mut Shared<[f32]>,
    from: usize,
    total: usize,
    #[comptime] rows: usize,
    #[comptime] width: usize,
) {
    let mut i = UNIT_POS as usize;
    while i < rows * width {
        let row = from + i / width;
        let mut x = 0.0f32;
        if row < total {
            x = src[row * width + i % width];
        }
        dst[i] = x;
        i += CUBE_DIM as usize;
    }
}

/// This cube's sequence, its tile of `rows` rows in the sequence and this unit's row,
/// with `total` rows per sequence (a sequence past the last: one of a spread grid's
/// spare cubes).
#[cube]
fn tile_of(total: usize, #[comptime] rows: usize) -> (usize, usize, usize) {
    let per_sequence = total.div_ceil(rows);
    let cube = CUBE_POS;
    let t = cube % per_sequence;
    (cube / per_sequence, t, t * rows + UNIT_POS as usize)
}

/// The keys the queries of tile `t` of `rows` see: those of its last query.
#[cube]
fn tile_keys(
    t: usize,
    queries: usize,
    keys: usize,
    start: usize,
    #[comptime] rows: usize,
) -> usize {
    visible(keys, start + visible(queries, (t + 1) * rows))
}

/// `o [rows, dv]` and `lse [rows]` of the queries `q [rows, d]` (rows = sequences ×
/// `queries`) over their sequence's keys `k [.., keys, d]`, `v [.., keys, dv]`; query `i`
/// sees keys `j ≤ start + i`. One cube of `rows` units per tile of `rows` queries, over
/// shared tiles of `tile` keys.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn forward_kernel(
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
    #[comptime] rows: usize,
    #[comptime] tile: usize,
) {
    let (seq, t, i) = tile_of(queries, rows);
    if seq * queries >= lse.len() {
        terminate!();
    }
    let active = i < queries;
    let row = seq * queries + i;
    let mut seen = 0;
    let mut qi = Array::<f32>::new(d);
    let mut acc = Array::<f32>::new(dv);
    if active {
        seen = visible(keys, start + i + 1);
        for x in 0..d {
            qi[x] = q[row * d + x] * scale;
        }
    }
    for x in 0..dv {
        acc[x] = 0.0;
    }
    let mut m = f32::new(-1.0e30);
    let mut l = 0.0f32;
    let cube_keys = tile_keys(t, queries, keys, start, rows);
    let mut ks = Shared::<[f32]>::new_slice(tile * d);
    let mut vs = Shared::<[f32]>::new_slice(tile * dv);
    for kt in 0..cube_keys.div_ceil(tile) {
        let first = seq * keys + kt * tile;
        load_tile(k, &mut ks, first, (seq + 1) * keys, tile, d);
        load_tile(v, &mut vs, first, (seq + 1) * keys, tile, dv);
        sync_cube();
        for j in 0..tile {
            if kt * tile + j < seen {
                let mut s = 0.0f32;
                for x in 0..d {
                    s += qi[x] * ks[j * d + x];
                }
                let mut m_new = m;
                if s > m {
                    m_new = s;
                }
                let correction = (m - m_new).exp();
                let p = (s - m_new).exp();
                l = l * correction + p;
                for x in 0..dv {
                    acc[x] = acc[x] * correction + p * vs[j * dv + x];
                }
                m = m_new;
            }
        }
        sync_cube();
    }
    if active {
        for x in 0..dv {
            o[row * dv + x] = acc[x] / l;
        }
        lse[row] = m + l.ln();
    }
}

/// `∂q` of every query row and `delta = rowsum(∂O ⊙ O)`, from the saved `lse`; the
/// forward's grid and tiles.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn query_grads(
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
    #[comptime] rows: usize,
    #[comptime] tile: usize,
) {
    let (seq, t, i) = tile_of(queries, rows);
    if seq * queries >= lse.len() {
        terminate!();
    }
    let active = i < queries;
    let row = seq * queries + i;
    let mut seen = 0;
    let mut qi = Array::<f32>::new(d);
    let mut g = Array::<f32>::new(dv);
    let mut di = 0.0f32;
    let mut li = 0.0f32;
    if active {
        seen = visible(keys, start + i + 1);
        for x in 0..d {
            qi[x] = q[row * d + x] * scale;
        }
        for x in 0..dv {
            g[x] = grad[row * dv + x];
            di += g[x] * o[row * dv + x];
        }
        delta[row] = di;
        li = lse[row];
    }
    let mut acc = Array::<f32>::new(d);
    for x in 0..d {
        acc[x] = 0.0;
    }
    let cube_keys = tile_keys(t, queries, keys, start, rows);
    let mut ks = Shared::<[f32]>::new_slice(tile * d);
    let mut vs = Shared::<[f32]>::new_slice(tile * dv);
    for kt in 0..cube_keys.div_ceil(tile) {
        let first = seq * keys + kt * tile;
        load_tile(k, &mut ks, first, (seq + 1) * keys, tile, d);
        load_tile(v, &mut vs, first, (seq + 1) * keys, tile, dv);
        sync_cube();
        for j in 0..tile {
            if kt * tile + j < seen {
                let mut s = 0.0f32;
                for x in 0..d {
                    s += qi[x] * ks[j * d + x];
                }
                let mut dp = 0.0f32;
                for x in 0..dv {
                    dp += g[x] * vs[j * dv + x];
                }
                let ds = (s - li).exp() * (dp - di);
                for x in 0..d {
                    acc[x] += ds * ks[j * d + x];
                }
            }
        }
        sync_cube();
    }
    if active {
        for x in 0..d {
            dq[row * d + x] = acc[x] * scale;
        }
    }
}

/// `∂k` and `∂v` of every key row, from the saved `lse` and the queries' `delta`. One
/// cube of `tile` units per tile of `tile` keys, over shared tiles of the queries that
/// see them.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn key_grads(
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
    #[comptime] tile: usize,
) {
    let (seq, t, j) = tile_of(keys, tile);
    if seq * keys >= k.len() / d {
        terminate!();
    }
    let active = j < keys;
    let key = seq * keys + j;
    let mut kj = Array::<f32>::new(d);
    let mut dk_acc = Array::<f32>::new(d);
    let mut vj = Array::<f32>::new(dv);
    let mut dv_acc = Array::<f32>::new(dv);
    for x in 0..d {
        dk_acc[x] = 0.0;
    }
    for x in 0..dv {
        dv_acc[x] = 0.0;
    }
    if active {
        for x in 0..d {
            kj[x] = k[key * d + x] * scale;
        }
        for x in 0..dv {
            vj[x] = v[key * dv + x];
        }
    }
    // Query i sees key j when start + i ≥ j: the cube's first key is seen from query
    // `first_key − start` on.
    let first_key = t * tile;
    let mut from = 0;
    if first_key > start {
        from = first_key - start;
    }
    let end = (seq + 1) * queries;
    let mut qs = Shared::<[f32]>::new_slice(tile * d);
    let mut gs = Shared::<[f32]>::new_slice(tile * dv);
    let mut ls = Shared::<[f32]>::new_slice(tile);
    let mut ds = Shared::<[f32]>::new_slice(tile);
    let mut qt = from / tile;
    while qt * tile < queries {
        let first = seq * queries + qt * tile;
        load_tile(q, &mut qs, first, end, tile, d);
        load_tile(grad, &mut gs, first, end, tile, dv);
        load_tile(lse, &mut ls, first, end, tile, 1usize);
        load_tile(delta, &mut ds, first, end, tile, 1usize);
        sync_cube();
        for r in 0..tile {
            let i = qt * tile + r;
            if active && i < queries && start + i >= j {
                let mut s = 0.0f32;
                for x in 0..d {
                    s += qs[r * d + x] * kj[x];
                }
                let p = (s - ls[r]).exp();
                let mut dp = 0.0f32;
                for x in 0..dv {
                    let g = gs[r * dv + x];
                    dv_acc[x] += p * g;
                    dp += g * vj[x];
                }
                let dsr = p * (dp - ds[r]);
                for x in 0..d {
                    dk_acc[x] += dsr * qs[r * d + x];
                }
            }
        }
        sync_cube();
        qt += 1;
    }
    if active {
        for x in 0..d {
            dk[key * d + x] = dk_acc[x] * scale;
        }
        for x in 0..dv {
            dv_out[key * dv + x] = dv_acc[x];
        }
    }
}

/// The sizes of a call: `q [b, h, queries, d]`, `v [b, h, keys, dv]`.
struct RowSizes {
    sequences: usize,
    queries: usize,
    keys: usize,
    d: usize,
    dv: usize,
    scale: f32,
    /// Rows of the query tiles and of the shared tiles ([`tiles`]).
    rows: usize,
    tile: usize,
}

impl RowSizes {
    fn of(q: &CubeTensor, v: &CubeTensor) -> Self {
        let ([b, h, queries, d], [.., keys, dv]) = (q.shape().dims::<4>(), v.shape().dims::<4>());
        let shared = q.client.properties().hardware.max_shared_memory_size;
        let (rows, tile) = tiles(shared, units(q) as usize, [d, dv], queries)
            .expect("the attention's tiles fit (checked by `fits`)");
        Self {
            sequences: b * h,
            queries,
            keys,
            d,
            dv,
            scale: 1.0 / (d as f32).sqrt(),
            rows,
            tile,
        }
    }

    /// A cube of `rows` units per tile of `rows` of the `total` rows of every sequence.
    fn grid(&self, like: &CubeTensor, total: usize, rows: usize) -> (CubeCount, CubeDim) {
        let count = cubes(like, self.sequences * total.div_ceil(rows));
        (count, CubeDim::new_1d(rows as u32))
    }
}

/// `[q, k, v]` → `o [b, h, Tq, dv]` and the log-sum-exp of every query's scores.
pub(crate) fn forward(inputs: [CubeTensor; 3], start: usize) -> (CubeTensor, CubeTensor) {
    let [q, k, v] = inputs.map(into_contiguous);
    let n = RowSizes::of(&q, &v);
    let mut o_dims = q.shape().dims::<4>();
    o_dims[3] = n.dv;
    let (o, lse) = (empty(&q, o_dims), empty(&q, [n.sequences * n.queries]));
    let (count, dim) = n.grid(&q, n.queries, n.rows);
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
        n.rows,
        n.tile,
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
    let delta = empty(&q, [n.sequences * n.queries]);
    let client = q.client.clone();
    let (count, dim) = n.grid(&q, n.queries, n.rows);
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
        n.rows,
        n.tile,
    );
    let (count, dim) = n.grid(&q, n.keys, n.tile);
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
        n.tile,
    );
    [dq, dk, dv]
}
