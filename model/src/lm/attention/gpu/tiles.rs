//! The attention's forward pass with its two products on the tensor cores: the register
//! kernel's algorithm ([`super::kernel::forward_kernel`], FlashAttention-2's online
//! softmax over shared tiles of keys), with the tiles' products as fragment products of a
//! cube's planes ([`crate::backend::gpu::mma`]). Per tile of keys,
//!
//! ```text
//! S = Q Kᵀ                                  (tile products, into shared memory)
//! m' = max(m, max_j S_ij / √d),  P = exp(S / √d − m'),  l = l e^{m − m'} + Σ_j P_ij
//! O = diag(e^{m − m'}) O + P V              (a unit per row, then tile products)
//! ```
//!
//! and at the end `O / l` and `L = m + ln l`, as the register kernel writes them. `Q`, the
//! tile's `K` and `V`, `S` (then `P`) and `O` live in shared memory.

use burn_cubecl::cubecl;
use cubecl::prelude::*;

use super::kernel::{load_tile, tile_keys, tile_of, visible};
use crate::backend::gpu::mma::{Mma, Operand, Product, tile_accumulate, tile_product};

/// The floats a cube of the kernel holds in shared memory: `Q` and `O` (`rows` rows), a
/// tile of `K` and `V` (`tile` rows), `S`, and a row's maximum and sum.
pub(crate) fn shared_floats(rows: usize, tile: usize, [d, dv]: [usize; 2]) -> usize {
    rows * (d + dv + tile + 2) + tile * (d + dv)
}

/// Whether fragments `mma` tile a call with these tiles and widths: every product's sides
/// whole fragments, and its length whole steps.
pub(crate) fn fits(mma: &Mma, rows: usize, tile: usize, [d, dv]: [usize; 2]) -> bool {
    rows.is_multiple_of(mma.m)
        && tile.is_multiple_of(mma.n)
        && tile.is_multiple_of(mma.k)
        && d.is_multiple_of(mma.k)
        && dv.is_multiple_of(mma.n)
}

/// `o [rows, dv]` and `lse [rows]` as [`super::kernel::forward_kernel`] computes them: one
/// cube of whole planes per tile of `rows` queries, over shared tiles of `tile` keys.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn forward_tiles(
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
    #[comptime] mma: Mma,
) {
    let (seq, t) = tile_of(queries, rows);
    if seq * queries >= lse.len() {
        terminate!();
    }
    let base = seq * queries;
    let mut qs = Shared::<[f32]>::new_slice(rows * d);
    let mut ks = Shared::<[f32]>::new_slice(tile * d);
    let mut vs = Shared::<[f32]>::new_slice(tile * dv);
    let mut ss = Shared::<[f32]>::new_slice(rows * tile);
    let mut os = Shared::<[f32]>::new_slice(rows * dv);
    // Each row's running maximum `m` (at r) and sum `l` (at rows + r).
    let mut stats = Shared::<[f32]>::new_slice(comptime!(2 * rows));
    load_tile(q, &mut qs, base + t * rows, base + queries, rows, d);
    zero(&mut os, rows * dv);
    let mut r = UNIT_POS as usize;
    while r < rows {
        stats[r] = -1.0e30f32;
        stats[rows + r] = 0.0;
        r += CUBE_DIM as usize;
    }
    sync_cube();
    let cube_keys = tile_keys(t, queries, keys, start, rows);
    for kt in 0..cube_keys.div_ceil(tile) {
        let first = seq * keys + kt * tile;
        load_tile(k, &mut ks, first, (seq + 1) * keys, tile, d);
        load_tile(v, &mut vs, first, (seq + 1) * keys, tile, dv);
        sync_cube();
        times_transposed(&qs, &ks, &mut ss, d, rows, tile, mma);
        sync_cube();
        let seen = Seen {
            queries,
            keys,
            start,
            first: t * rows,
            key: kt * tile,
        };
        softmax_rows(&mut ss, &mut os, &mut stats, seen, scale, rows, tile, dv);
        sync_cube();
        accumulate(&ss, &vs, &mut os, rows, tile, dv, mma);
        sync_cube();
    }
    let mut x = UNIT_POS as usize;
    while x < rows * dv {
        let (r, col) = (x / dv, x % dv);
        let i = t * rows + r;
        if i < queries {
            o[(base + i) * dv + col] = os[x] / stats[rows + r];
            if col == 0 {
                lse[base + i] = stats[r] + stats[rows + r].ln();
            }
        }
        x += CUBE_DIM as usize;
    }
}

/// Zeros in `len` values of `x`, every unit of the cube taking every `CUBE_DIM`-th.
#[cube]
pub(super) fn zero(x: &mut Shared<[f32]>, #[comptime] len: usize) {
    let mut at = UNIT_POS as usize;
    while at < len {
        x[at] = 0.0;
        at += CUBE_DIM as usize;
    }
}

/// Which scores of a tile a row sees: query `first + r` (of `queries`) sees keys
/// `j ≤ start + first + r` of `keys`; the tile's first key is `key`.
#[derive(CubeType, Clone, Copy)]
struct Seen {
    queries: usize,
    keys: usize,
    start: usize,
    first: usize,
    key: usize,
}

/// `C = A Bᵀ` (`[rows, cols]`) of `A [rows, width]` and `B [cols, width]` by rows, `Bᵀ`
/// read by columns from `B`'s rows (`S = Q Kᵀ`, `∂P = ∂O Vᵀ` and their transposes), each
/// plane taking output tiles in turn.
#[cube]
pub(super) fn times_transposed(
    a: &Shared<[f32]>,
    b: &Shared<[f32]>,
    c: &mut Shared<[f32]>,
    #[comptime] width: usize,
    #[comptime] rows: usize,
    #[comptime] cols: usize,
    #[comptime] mma: Mma,
) {
    let planes = CUBE_DIM as usize / mma.plane;
    let mut at = UNIT_POS as usize / mma.plane;
    while at < comptime!(rows / mma.m * (cols / mma.n)) {
        let (i, j) = (at / comptime!(cols / mma.n), at % comptime!(cols / mma.n));
        let a_i = Operand::rows(&a[i * mma.m * width..], width);
        let bt_j = Operand::cols(&b[j * mma.n * width..], width);
        tile_product(
            Product::new(a_i, bt_j, width),
            &mut c[i * mma.m * cols + j * mma.n..],
            cols,
            mma,
        );
        at += planes;
    }
}

/// A unit per row: its scores to `P` in place, its maximum and sum carried on, and its
/// row of `O` scaled by `e^{m − m'}`. Scores a row does not see (and every score of a
/// query past the last) weigh 0.
#[cube]
#[allow(clippy::too_many_arguments)]
fn softmax_rows(
    ss: &mut Shared<[f32]>,
    os: &mut Shared<[f32]>,
    stats: &mut Shared<[f32]>,
    seen: Seen,
    scale: f32,
    #[comptime] rows: usize,
    #[comptime] tile: usize,
    #[comptime] dv: usize,
) {
    let mut r = UNIT_POS as usize;
    while r < rows {
        let i = seen.first + r;
        let mut through = 0;
        if i < seen.queries {
            through = visible(seen.keys, seen.start + i + 1);
        }
        let mut m = stats[r];
        for j in 0..tile {
            let s = ss[r * tile + j] * scale;
            if seen.key + j < through && s > m {
                m = s;
            }
        }
        let mut sum = 0.0f32;
        for j in 0..tile {
            let mut p = 0.0f32;
            if seen.key + j < through {
                p = (ss[r * tile + j] * scale - m).exp();
            }
            ss[r * tile + j] = p;
            sum += p;
        }
        let correction = (stats[r] - m).exp();
        stats[r] = m;
        stats[rows + r] = stats[rows + r] * correction + sum;
        for x in 0..dv {
            os[r * dv + x] *= correction;
        }
        r += CUBE_DIM as usize;
    }
}

/// `C += A B` (`[rows, width]`) of `A [rows, len]` and `B [len, width]` by rows (`O += P
/// V`, `∂Q += ∂S K`, `∂V += Pᵀ ∂O`, `∂K += ∂Sᵀ Q`), each plane taking output tiles in
/// turn.
#[cube]
pub(super) fn accumulate(
    a: &Shared<[f32]>,
    b: &Shared<[f32]>,
    c: &mut Shared<[f32]>,
    #[comptime] rows: usize,
    #[comptime] len: usize,
    #[comptime] width: usize,
    #[comptime] mma: Mma,
) {
    let planes = CUBE_DIM as usize / mma.plane;
    let mut at = UNIT_POS as usize / mma.plane;
    while at < comptime!(rows / mma.m * (width / mma.n)) {
        let (i, j) = (at / comptime!(width / mma.n), at % comptime!(width / mma.n));
        let a_i = Operand::rows(&a[i * mma.m * len..], len);
        let b_j = Operand::rows(&b[j * mma.n..], width);
        let c_ij = &mut c[i * mma.m * width + j * mma.n..];
        tile_accumulate(Product::new(a_i, b_j, len), c_ij, width, mma);
        at += planes;
    }
}
