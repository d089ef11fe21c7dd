//! The attention's backward pass with its products on the tensor cores: the register
//! kernels' two passes ([`super::kernel::query_grads`], [`super::kernel::key_grads`]) with
//! their products as fragment products over shared tiles ([`super::tiles`]'s helpers).
//! With `P = exp(S / √d − L)` and `∂S = P ⊙ (∂O Vᵀ − D)`, `D = rowsum(∂O ⊙ O)`:
//!
//! ```text
//! per query tile, over its key tiles:   ∂Q += ∂S K / √d
//! per key tile, over its query tiles:   ∂V += Pᵀ ∂O,   ∂K += ∂Sᵀ Q / √d
//! ```
//!
//! `S` and `∂O Vᵀ` (or their transposes) are tile products into shared memory, turned
//! into `P` and `∂S` value by value between them and the accumulating products.

use burn_cubecl::cubecl;
use cubecl::prelude::*;

use super::kernel::{delta_of, first_seeing, load_tile, tile_keys, tile_of, visible};
use super::tiles::{accumulate, times_transposed, zero};
use crate::backend::gpu::mma::Mma;
use crate::backend::gpu::rows::shared_row;

/// The floats a cube of either kernel holds in shared memory: for `rows` queries and
/// `tile` keys, the rows of `Q`, `∂O`, `K` and `V`, two score tiles, the accumulators
/// (`∂Q`, or `∂K` and `∂V`) and `L` and `D` of the queries.
pub(crate) fn shared_floats(rows: usize, tile: usize, [d, dv]: [usize; 2]) -> usize {
    let rows_and_tile = (rows + tile) * (d + dv) + 2 * rows * tile + 2 * rows;
    rows_and_tile + (rows * d).max(tile * (d + dv))
}

/// Whether fragments `mma` tile the backward's products: the forward's, and `∂Q` and `∂K`
/// come out `d` wide as `∂V` does `dv`.
pub(crate) fn fits(mma: &Mma, rows: usize, tile: usize, widths: [usize; 2]) -> bool {
    super::tiles::fits(mma, rows, tile, widths) && widths[0].is_multiple_of(mma.n)
}

/// `∂q` of every query row and `delta = rowsum(∂O ⊙ O)`, from the saved `lse`: one cube of
/// whole planes per tile of `rows` queries over shared tiles of `tile` keys.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn query_tiles(
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
    #[comptime] mma: Mma,
) {
    let (seq, t) = tile_of(queries, rows);
    if seq * queries >= lse.len() {
        terminate!();
    }
    let base = seq * queries;
    let (first, end) = (base + t * rows, base + queries);
    let mut qs = Shared::<[f32]>::new_slice(rows * d);
    let mut gs = Shared::<[f32]>::new_slice(rows * dv);
    let mut ks = Shared::<[f32]>::new_slice(tile * d);
    let mut vs = Shared::<[f32]>::new_slice(tile * dv);
    let mut ss = Shared::<[f32]>::new_slice(rows * tile);
    let mut ps = Shared::<[f32]>::new_slice(rows * tile);
    let mut acc = Shared::<[f32]>::new_slice(rows * d);
    let mut ls = Shared::<[f32]>::new_slice(rows);
    let mut ds = Shared::<[f32]>::new_slice(rows);
    load_tile(q, &mut qs, first, end, rows, d);
    load_tile(grad, &mut gs, first, end, rows, dv);
    load_tile(lse, &mut ls, first, end, rows, 1usize);
    zero(&mut acc, rows * d);
    sync_cube();
    // D of each row, a unit per row from its ∂O row in the shared tile and O in global memory.
    let mut r = UNIT_POS as usize;
    while r < rows {
        let i = t * rows + r;
        let mut sum = 0.0f32;
        if i < queries {
            let gi = shared_row(&gs, r, dv);
            sum = delta_of(o, base + i, &gi, 0usize, dv);
            delta[base + i] = sum;
        }
        ds[r] = sum;
        r += CUBE_DIM as usize;
    }
    sync_cube();
    let cube_keys = tile_keys(t, queries, keys, start, rows);
    for kt in 0..cube_keys.div_ceil(tile) {
        let first_key = seq * keys + kt * tile;
        load_tile(k, &mut ks, first_key, (seq + 1) * keys, tile, d);
        load_tile(v, &mut vs, first_key, (seq + 1) * keys, tile, dv);
        sync_cube();
        times_transposed(&qs, &ks, &mut ss, d, rows, tile, mma);
        times_transposed(&gs, &vs, &mut ps, dv, rows, tile, mma);
        sync_cube();
        // ∂S over S, query i (row x / tile) against key j (column x % tile).
        let mut x = UNIT_POS as usize;
        while x < rows * tile {
            let (r, j) = (x / tile, x % tile);
            let i = t * rows + r;
            let mut grad_s = 0.0f32;
            if i < queries && kt * tile + j < visible(keys, start + i + 1) {
                grad_s = (ss[x] * scale - ls[r]).exp() * (ps[x] - ds[r]);
            }
            ss[x] = grad_s;
            x += CUBE_DIM as usize;
        }
        sync_cube();
        accumulate(&ss, &ks, &mut acc, rows, tile, d, mma);
        sync_cube();
    }
    store_rows(&acc, dq, base, t * rows, queries, scale, rows, d);
}

/// `∂k` and `∂v` of every key row, from the saved `lse` and the queries' `delta`: one cube
/// of whole planes per tile of `tile` keys, over shared tiles of the `rows` queries that
/// see them.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn key_tiles(
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
    #[comptime] rows: usize,
    #[comptime] tile: usize,
    #[comptime] mma: Mma,
) {
    let (seq, t) = tile_of(keys, tile);
    if seq * keys >= k.len() / d {
        terminate!();
    }
    let base = seq * keys;
    let mut ks = Shared::<[f32]>::new_slice(tile * d);
    let mut vs = Shared::<[f32]>::new_slice(tile * dv);
    let mut qs = Shared::<[f32]>::new_slice(rows * d);
    let mut gs = Shared::<[f32]>::new_slice(rows * dv);
    // Sᵀ, then Pᵀ, and ∂Pᵀ, then ∂Sᵀ: [tile, rows].
    let mut st = Shared::<[f32]>::new_slice(tile * rows);
    let mut pt = Shared::<[f32]>::new_slice(tile * rows);
    let mut dk_acc = Shared::<[f32]>::new_slice(tile * d);
    let mut dv_acc = Shared::<[f32]>::new_slice(tile * dv);
    let mut ls = Shared::<[f32]>::new_slice(rows);
    let mut ds = Shared::<[f32]>::new_slice(rows);
    load_tile(k, &mut ks, base + t * tile, base + keys, tile, d);
    load_tile(v, &mut vs, base + t * tile, base + keys, tile, dv);
    zero(&mut dk_acc, tile * d);
    zero(&mut dv_acc, tile * dv);
    let first_key = t * tile;
    let from = first_seeing(first_key, start);
    let end = (seq + 1) * queries;
    let mut qt = from / rows;
    while qt * rows < queries {
        let first = seq * queries + qt * rows;
        load_tile(q, &mut qs, first, end, rows, d);
        load_tile(grad, &mut gs, first, end, rows, dv);
        load_tile(lse, &mut ls, first, end, rows, 1usize);
        load_tile(delta, &mut ds, first, end, rows, 1usize);
        sync_cube();
        times_transposed(&ks, &qs, &mut st, d, tile, rows, mma);
        times_transposed(&vs, &gs, &mut pt, dv, tile, rows, mma);
        sync_cube();
        // Pᵀ over Sᵀ and ∂Sᵀ over ∂Pᵀ, key j (row x / rows) against query i (column).
        let mut x = UNIT_POS as usize;
        while x < tile * rows {
            let (jj, r) = (x / rows, x % rows);
            let (j, i) = (first_key + jj, qt * rows + r);
            let mut p = 0.0f32;
            if j < keys && i < queries && start + i >= j {
                p = (st[x] * scale - ls[r]).exp();
            }
            st[x] = p;
            pt[x] = p * (pt[x] - ds[r]);
            x += CUBE_DIM as usize;
        }
        sync_cube();
        accumulate(&st, &gs, &mut dv_acc, tile, rows, dv, mma);
        accumulate(&pt, &qs, &mut dk_acc, tile, rows, d, mma);
        sync_cube();
        qt += 1;
    }
    store_rows(&dk_acc, dk, base, t * tile, keys, scale, tile, d);
    store_rows(&dv_acc, dv_out, base, t * tile, keys, 1.0f32, tile, dv);
}

/// Rows `first ..` of `acc` (`rows` rows of `width`), times `scale`, to rows `base +
/// first ..` of `out`, those before row `total` of the sequence.
#[cube]
#[allow(clippy::too_many_arguments)]
fn store_rows(
    acc: &Shared<[f32]>,
    out: &mut Tensor<f32>,
    base: usize,
    first: usize,
    total: usize,
    scale: f32,
    #[comptime] rows: usize,
    #[comptime] width: usize,
) {
    let mut x = UNIT_POS as usize;
    while x < rows * width {
        let row = first + x / width;
        if row < total {
            out[(base + row) * width + x % width] = acc[x] * scale;
        }
        x += CUBE_DIM as usize;
    }
}
