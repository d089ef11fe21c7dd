//! The causal attention on CubeCL devices (wgpu, cuda) with FlashAttention-2's tiling, so
//! no `Tq × Tk` tensor exists in the forward or the backward pass (Burn's attention under
//! autodiff materialises it) and each key or query row is read from global memory once
//! per tile of rows, not once per row.
//!
//! Forward, one cube per tile of queries: the cube copies each tile of keys and values it
//! sees into shared memory, and each unit runs an online softmax over them for its rows:
//! `O = (Σ exp(S − m) v) / l` and `L = m + ln l` saved, with `S = q kᵀ / √d`.
//! Backward, from `P = exp(S − L)` recomputed and `D = rowsum(∂O ⊙ O)`: one cube per
//! query tile for `∂Q = Σ ∂S k` (and `D`) over shared key and value tiles, then one cube
//! per key tile for `∂K = Σ ∂Sᵀ q` and `∂V = Σ Pᵀ ∂O` over shared tiles of queries, their
//! `∂O`, `L` and `D`, with `∂S = P ⊙ (∂O vᵀ − D) / √d`. Each unit owns its rows' sums, so
//! there are no atomics.
//!
//! `d`, `dv`, the tiles' rows and the rows a unit owns (`per_unit`) are compile-time
//! sizes, and every loop over them is unrolled, so a unit's rows and accumulators live in
//! registers. Each key (or query) row a unit reads from shared memory serves all of its
//! `per_unit` rows: with one row per unit a unit loads as many values as it multiplies.
//! The products run on the CUDA cores; where a device has tensor cores the passes run as
//! [`super::tiles`] and [`super::tile_grads`] instead.

use burn_cubecl::cubecl;
use cubecl::prelude::*;

use crate::backend::gpu::rows::{blend, dot, fill, load_row, own_row, shared_row, store_row};

/// The keys `0 .. n` a query sees: `through` of them, at most `keys`.
#[cube]
pub(super) fn visible(keys: usize, through: usize) -> usize {
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
pub(super) fn load_tile(
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

/// This cube's sequence and its tile of `rows` rows in the sequence, with `total` rows
/// per sequence (a sequence past the last: one of a spread grid's spare cubes).
#[cube]
pub(super) fn tile_of(total: usize, #[comptime] rows: usize) -> (usize, usize) {
    let per_sequence = total.div_ceil(rows);
    let cube = CUBE_POS;
    (cube / per_sequence, cube % per_sequence)
}

/// The keys the queries of tile `t` of `rows` see: those of its last query.
#[cube]
pub(super) fn tile_keys(
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
/// sees keys `j ≤ start + i`. One cube of `rows / per_unit` units per tile of `rows`
/// queries, over shared tiles of `tile` keys.
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
    #[comptime] per_unit: usize,
) {
    let (seq, t) = tile_of(queries, rows);
    if seq * queries >= lse.len() {
        terminate!();
    }
    let base = seq * queries;
    let mut qi = Array::<f32>::new(comptime!(per_unit * d));
    let mut acc = Array::<f32>::new(comptime!(per_unit * dv));
    let mut m = Array::<f32>::new(per_unit);
    let mut l = Array::<f32>::new(per_unit);
    #[unroll]
    for r in 0..per_unit {
        let i = t * rows + own_row(r, rows, per_unit);
        load_row(q, base + i, i < queries, scale, &mut qi, r * d, d);
        fill(&mut acc, r * dv, dv);
        m[r] = -1.0e30f32;
        l[r] = 0.0;
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
            let key = kt * tile + j;
            let kj = shared_row(&ks, j, d);
            let vj = shared_row(&vs, j, dv);
            #[unroll]
            for r in 0..per_unit {
                let i = t * rows + own_row(r, rows, per_unit);
                if i < queries && key < visible(keys, start + i + 1) {
                    let s = dot(&qi, r * d, &kj, d);
                    let mut correction = 1.0f32;
                    if s > m[r] {
                        correction = (m[r] - s).exp();
                        m[r] = s;
                    }
                    let p = (s - m[r]).exp();
                    l[r] = l[r] * correction + p;
                    blend(&mut acc, r * dv, correction, p, &vj, dv);
                }
            }
        }
        sync_cube();
    }
    #[unroll]
    for r in 0..per_unit {
        let i = t * rows + own_row(r, rows, per_unit);
        if i < queries {
            store_row(&acc, r * dv, 1.0f32 / l[r], o, base + i, dv);
            lse[base + i] = m[r] + l[r].ln();
        }
    }
}

/// `D = ∂O · O` of row `row` of `o` (rows of `dv`), its `∂O` row already on chip at
/// `grad[at ..]`: the term every score's gradient of that query subtracts.
#[cube]
pub(super) fn delta_of(
    o: &Tensor<f32>,
    row: usize,
    grad: &Array<f32>,
    at: usize,
    #[comptime] dv: usize,
) -> f32 {
    let mut sum = 0.0f32;
    #[unroll]
    for x in 0..dv {
        sum += grad[at + x] * o[row * dv + x];
    }
    sum
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
    #[comptime] per_unit: usize,
) {
    let (seq, t) = tile_of(queries, rows);
    if seq * queries >= lse.len() {
        terminate!();
    }
    let base = seq * queries;
    let mut qi = Array::<f32>::new(comptime!(per_unit * d));
    let mut g = Array::<f32>::new(comptime!(per_unit * dv));
    let mut di = Array::<f32>::new(per_unit);
    let mut li = Array::<f32>::new(per_unit);
    let mut acc = Array::<f32>::new(comptime!(per_unit * d));
    #[unroll]
    for r in 0..per_unit {
        let i = t * rows + own_row(r, rows, per_unit);
        let active = i < queries;
        load_row(q, base + i, active, scale, &mut qi, r * d, d);
        load_row(grad, base + i, active, 1.0f32, &mut g, r * dv, dv);
        fill(&mut acc, r * d, d);
        di[r] = 0.0;
        li[r] = 0.0;
        if active {
            let sum = delta_of(o, base + i, &g, r * dv, dv);
            di[r] = sum;
            delta[base + i] = sum;
            li[r] = lse[base + i];
        }
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
            let key = kt * tile + j;
            let kj = shared_row(&ks, j, d);
            let vj = shared_row(&vs, j, dv);
            #[unroll]
            for r in 0..per_unit {
                let i = t * rows + own_row(r, rows, per_unit);
                if i < queries && key < visible(keys, start + i + 1) {
                    let s = dot(&qi, r * d, &kj, d);
                    let dp = dot(&g, r * dv, &vj, dv);
                    let ds = (s - li[r]).exp() * (dp - di[r]);
                    blend(&mut acc, r * d, 1.0f32, ds, &kj, d);
                }
            }
        }
        sync_cube();
    }
    #[unroll]
    for r in 0..per_unit {
        let i = t * rows + own_row(r, rows, per_unit);
        if i < queries {
            store_row(&acc, r * d, scale, dq, base + i, d);
        }
    }
}

/// `∂k` and `∂v` of every key row, from the saved `lse` and the queries' `delta`. One
/// cube of `tile / per_unit` units per tile of `tile` keys, over shared tiles of the
/// queries that see them.
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
    #[comptime] per_unit: usize,
) {
    let (seq, t) = tile_of(keys, tile);
    if seq * keys >= k.len() / d {
        terminate!();
    }
    let base = seq * keys;
    let mut kj = Array::<f32>::new(comptime!(per_unit * d));
    let mut vj = Array::<f32>::new(comptime!(per_unit * dv));
    let mut dk_acc = Array::<f32>::new(comptime!(per_unit * d));
    let mut dv_acc = Array::<f32>::new(comptime!(per_unit * dv));
    #[unroll]
    for r in 0..per_unit {
        let j = t * tile + own_row(r, tile, per_unit);
        load_row(k, base + j, j < keys, scale, &mut kj, r * d, d);
        load_row(v, base + j, j < keys, 1.0f32, &mut vj, r * dv, dv);
        fill(&mut dk_acc, r * d, d);
        fill(&mut dv_acc, r * dv, dv);
    }
    let first_key = t * tile;
    let from = first_seeing(first_key, start);
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
        for i_tile in 0..tile {
            let i = qt * tile + i_tile;
            let qi = shared_row(&qs, i_tile, d);
            let gi = shared_row(&gs, i_tile, dv);
            #[unroll]
            for r in 0..per_unit {
                let j = t * tile + own_row(r, tile, per_unit);
                if j < keys && i < queries && start + i >= j {
                    let p = (dot(&kj, r * d, &qi, d) - ls[i_tile]).exp();
                    let dp = dot(&vj, r * dv, &gi, dv);
                    blend(&mut dv_acc, r * dv, 1.0f32, p, &gi, dv);
                    blend(&mut dk_acc, r * d, 1.0f32, p * (dp - ds[i_tile]), &qi, d);
                }
            }
        }
        sync_cube();
        qt += 1;
    }
    #[unroll]
    for r in 0..per_unit {
        let j = t * tile + own_row(r, tile, per_unit);
        if j < keys {
            store_row(&dk_acc, r * d, scale, dk, base + j, d);
            store_row(&dv_acc, r * dv, 1.0f32, dv_out, base + j, dv);
        }
    }
}

/// The first query that sees key `key` when the queries follow `start` cached keys: query
/// `i` sees key `j` when `start + i ≥ j`.
#[cube]
pub(crate) fn first_seeing(key: usize, start: usize) -> usize {
    let mut from = 0;
    if key > start {
        from = key - start;
    }
    from
}
