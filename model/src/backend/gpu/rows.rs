//! Cube functions for kernels whose units own several rows of a tile in registers
//! (`Array`s whose every loop is unrolled, so that a row's values stay in registers): a
//! value read from shared memory once then serves every row a unit owns.
//!
//! A unit's rows lie in one array, row `r` of width `w` at `r · w`.

use burn_cubecl::cubecl;
use cubecl::prelude::*;

/// Row `r` of this unit's `per_unit` rows of a tile of `rows` rows: the cube's
/// `rows / per_unit` units take the tile's rows in turn, so that neighbouring units read
/// neighbouring rows.
#[cube]
pub(crate) fn own_row(r: usize, #[comptime] rows: usize, #[comptime] per_unit: usize) -> usize {
    r * comptime!(rows / per_unit) + UNIT_POS as usize
}

/// Zeros in `dst[at .. at + width]`.
#[cube]
pub(crate) fn fill(dst: &mut Array<f32>, at: usize, #[comptime] width: usize) {
    #[unroll]
    for x in 0..width {
        dst[at + x] = 0.0;
    }
}

/// `dst[at .. at + width]`: row `row` of `src` (rows of `width`) times `scale` where
/// `active`, else zeros.
#[cube]
pub(crate) fn load_row(
    src: &Tensor<f32>,
    row: usize,
    active: bool,
    scale: f32,
    dst: &mut Array<f32>,
    at: usize,
    #[comptime] width: usize,
) {
    fill(dst, at, width);
    if active {
        #[unroll]
        for x in 0..width {
            dst[at + x] = src[row * width + x] * scale;
        }
    }
}

/// `dst[at .. at + width] += ` row `row` of `src` (rows of `width`).
#[cube]
pub(crate) fn add_row(
    src: &Tensor<f32>,
    row: usize,
    dst: &mut Array<f32>,
    at: usize,
    #[comptime] width: usize,
) {
    #[unroll]
    for x in 0..width {
        dst[at + x] += src[row * width + x];
    }
}

/// Row `row` of `dst` (rows of `width`): `src[at .. at + width]` times `scale`.
#[cube]
pub(crate) fn store_row(
    src: &Array<f32>,
    at: usize,
    scale: f32,
    dst: &mut Tensor<f32>,
    row: usize,
    #[comptime] width: usize,
) {
    #[unroll]
    for x in 0..width {
        dst[row * width + x] = src[at + x] * scale;
    }
}

/// Row `j` of the shared tile `src` (rows of `width`) in registers.
#[cube]
pub(crate) fn shared_row(src: &Shared<[f32]>, j: usize, #[comptime] width: usize) -> Array<f32> {
    shared_strided(src, j * width, 1usize, width)
}

/// This unit's `per_unit` rows ([`own_row`]) of the shared tile `src` of `rows` rows of
/// `width`, in registers.
#[cube]
pub(crate) fn own_shared_rows(
    src: &Shared<[f32]>,
    #[comptime] rows: usize,
    #[comptime] width: usize,
    #[comptime] per_unit: usize,
) -> Array<f32> {
    let mut own = Array::<f32>::new(comptime!(per_unit * width));
    #[unroll]
    for r in 0..per_unit {
        let at = own_row(r, rows, per_unit) * width;
        #[unroll]
        for x in 0..width {
            own[r * width + x] = src[at + x];
        }
    }
    own
}

/// `width` values of `src` from `at`, `stride` apart (a column of a tile), in registers.
#[cube]
pub(crate) fn shared_strided(
    src: &Shared<[f32]>,
    at: usize,
    #[comptime] stride: usize,
    #[comptime] width: usize,
) -> Array<f32> {
    let mut row = Array::<f32>::new(width);
    #[unroll]
    for x in 0..width {
        row[x] = src[at + x * stride];
    }
    row
}

/// `a[at .. at + width] · b`.
#[cube]
pub(crate) fn dot(a: &Array<f32>, at: usize, b: &Array<f32>, #[comptime] width: usize) -> f32 {
    dot_at(a, at, b, 0usize, width)
}

/// `a[at .. at + width] · b[bt .. bt + width]`.
#[cube]
pub(crate) fn dot_at(
    a: &Array<f32>,
    at: usize,
    b: &Array<f32>,
    bt: usize,
    #[comptime] width: usize,
) -> f32 {
    let mut s = 0.0f32;
    #[unroll]
    for x in 0..width {
        s += a[at + x] * b[bt + x];
    }
    s
}

/// `a[at .. at + width] *= α`.
#[cube]
pub(crate) fn scale(a: &mut Array<f32>, at: usize, alpha: f32, #[comptime] width: usize) {
    #[unroll]
    for x in 0..width {
        a[at + x] *= alpha;
    }
}

/// `a[at .. at + width] = α a[at .. at + width] + β b`.
#[cube]
pub(crate) fn blend(
    a: &mut Array<f32>,
    at: usize,
    alpha: f32,
    beta: f32,
    b: &Array<f32>,
    #[comptime] width: usize,
) {
    #[unroll]
    for x in 0..width {
        a[at + x] = alpha * a[at + x] + beta * b[x];
    }
}
