//! [`super::pass`]'s kernel on the tensor cores: one cube per `part` rows of a sequence's
//! state, which it holds in shared memory from chunk to chunk. Per chunk the cube writes
//! its rows of `X_m` out and scales them by `ρ_m^p` in place, copies its columns of `K`
//! (scaled by `f^p`) and the chunk's `U`; then its planes add `Kᵀ U` to `X` tile by tile,
//! each tile one accumulator loaded from `X`, `c / k` fragment products and a store
//! ([`crate::backend::gpu::mma`]). The register-block kernel
//! ([`super::pass_kernel::pass_kernel`]) is its oracle and runs wherever a device has no
//! tensor cores.

use burn_cubecl::cubecl;
use cubecl::prelude::*;

use super::kernel::{Gates, copy_in};
use super::pass_kernel::{Walk, key_factor};
use crate::backend::gpu::mma::{Mma, Operand, Product, tile_accumulate};
use crate::hla::gpu::blocks::{gate_row, state_at};

/// The state values a cube holds: the register-block kernel's (256 units of 16), so both
/// plan as many cubes for the states the models use (a 128 × 128 state in four cubes).
const VALUES: usize = 4096;

/// Whether a pass over chunks of `c` tokens of a `[rows, cols]` state tiles into `mma`'s
/// fragments: its rows into the accumulators' rows, its columns into theirs, the chunk
/// into the products' length.
pub(crate) fn tiles_fit(mma: &Mma, c: usize, rows: usize, cols: usize) -> bool {
    let whole = |n: usize, by: usize| n > 0 && n.is_multiple_of(by);
    whole(rows, mma.m) && whole(cols, mma.n) && whole(c, mma.k)
}

/// Rows of the state a cube holds: [`VALUES`] values in whole fragment rows, at least
/// one fragment's and at most the state's.
pub(crate) fn tile_rows(mma: &Mma, rows: usize, cols: usize) -> usize {
    ((VALUES / cols).max(mma.m) / mma.m * mma.m).min(rows)
}

/// Shared floats of a cube holding `part` rows of a `cols`-wide state: its rows of `X`,
/// its columns of a chunk's `K` and the chunk's `U`.
pub(crate) fn tiles_shared(c: usize, part: usize, cols: usize) -> usize {
    part * cols + c * part + c * cols
}

/// The pass over every chunk, one cube per `part` rows of each sequence's `[rows, cols]`
/// state (`parts` cubes a sequence), its planes taking `X`'s tiles in turn.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn pass_tiles_kernel(
    start: &Tensor<f32>,
    k: &Tensor<f32>,
    u: &Tensor<f32>,
    b: &Tensor<f32>,
    states: &mut Tensor<f32>,
    end: &mut Tensor<f32>,
    gates: &Gates,
    power: f32,
    parts: usize,
    #[comptime] c: usize,
    #[comptime] rows: usize,
    #[comptime] cols: usize,
    #[comptime] walk: Walk,
    #[comptime] part: usize,
    #[comptime] mma: Mma,
) {
    let seq = CUBE_POS / parts;
    // A grid spread over its axes may hold a few more cubes than parts.
    if seq * rows * cols >= end.len() {
        terminate!();
    }
    let r0 = (CUBE_POS % parts) * part;
    // The last cube of a sequence may hold fewer rows (still whole fragments).
    let mut own = rows - r0;
    if own > part {
        own = part;
    }
    // A fragment's load and store take 32-byte aligned addresses: every tile starts a
    // multiple of 8 floats in.
    let mut xs = Shared::<[f32]>::new_aligned_slice(comptime!(part * cols), 32usize);
    let mut ks = Shared::<[f32]>::new_aligned_slice(comptime!(c * part), 32usize);
    let mut us = Shared::<[f32]>::new_aligned_slice(comptime!(c * cols), 32usize);
    let heads = gates.heads;
    let chunks = gates.chunks;
    // Each unit reads and writes the same values of `X` outside the products, so only
    // the products need barriers around them.
    read_start(start, &mut xs, seq, heads, r0, own, cols, walk.zero_start);
    let gate = gate_row(seq, heads, gates.gb, gates.gh) * chunks;
    for step in 0..chunks {
        let mut m = step;
        if walk.back {
            m = chunks - 1 - step;
        }
        let chunk = seq * chunks + m;
        let at = (gate + m) * c;
        let mut rho = 1.0f32;
        if walk.decayed {
            rho = (power * b[at + c - 1]).exp();
        }
        let out = (chunk * rows + r0) * cols;
        let mut e = UNIT_POS as usize;
        while e < own * cols {
            let x = xs[e];
            states[out + e] = x;
            xs[e] = rho * x;
            e += CUBE_DIM as usize;
        }
        copy_keys(
            k, b, &mut ks, chunk, at, r0, own, power, c, rows, part, walk,
        );
        // With a barrier after it, for the products.
        copy_in(u, &mut us, chunk * c * cols, c * cols);
        add_updates(&ks, &us, &mut xs, own, c, cols, part, mma);
        // The next chunk's copies overwrite what these products read.
        sync_cube();
    }
    let out = (seq * rows + r0) * cols;
    let mut e = UNIT_POS as usize;
    while e < own * cols {
        end[out + e] = xs[e];
        e += CUBE_DIM as usize;
    }
}

/// The cube's `own` rows from `r0` of sequence-and-head `seq`'s start state `[b, h, rows,
/// cols]` (any strides) into `xs`, or zeros.
#[cube]
#[allow(clippy::too_many_arguments)]
fn read_start(
    start: &Tensor<f32>,
    xs: &mut Shared<[f32]>,
    seq: usize,
    heads: usize,
    r0: usize,
    own: usize,
    #[comptime] cols: usize,
    #[comptime] zero_start: bool,
) {
    let mut e = UNIT_POS as usize;
    while e < own * cols {
        let mut x = 0.0f32;
        if !zero_start {
            x = start[state_at(start, seq, heads, r0 + e / cols, e % cols)];
        }
        xs[e] = x;
        e += CUBE_DIM as usize;
    }
}

/// Columns `r0..r0 + own` of chunk `chunk`'s `K [c, rows]` into `ks [c, part]`, row `τ`
/// scaled by `f^p_τ` (`f = a` when `walk.back`, else `e`; gates from `at` in `b`); the
/// columns past `own` are never read.
#[cube]
#[allow(clippy::too_many_arguments)]
fn copy_keys(
    k: &Tensor<f32>,
    b: &Tensor<f32>,
    ks: &mut Shared<[f32]>,
    chunk: usize,
    at: usize,
    r0: usize,
    own: usize,
    power: f32,
    #[comptime] c: usize,
    #[comptime] rows: usize,
    #[comptime] part: usize,
    #[comptime] walk: Walk,
) {
    let from = chunk * c * rows + r0;
    let mut e = UNIT_POS as usize;
    while e < c * part {
        let (tau, r) = (e / part, e % part);
        if r < own {
            let mut f = 1.0f32;
            if walk.decayed {
                f = key_factor(b[at + tau], b[at + c - 1], power, walk.back);
            }
            ks[e] = f * k[from + tau * rows + r];
        }
        e += CUBE_DIM as usize;
    }
}

/// `X += Kᵀ U` over the cube's `own` rows of `xs [part, cols]`, from `ks [c, part]` (read
/// by columns as `Kᵀ`) and `us [c, cols]`, each plane taking tiles in turn.
#[cube]
#[allow(clippy::too_many_arguments)]
fn add_updates(
    ks: &Shared<[f32]>,
    us: &Shared<[f32]>,
    xs: &mut Shared<[f32]>,
    own: usize,
    #[comptime] c: usize,
    #[comptime] cols: usize,
    #[comptime] part: usize,
    #[comptime] mma: Mma,
) {
    let planes = CUBE_DIM as usize / mma.plane;
    let col_tiles = comptime!(cols / mma.n);
    let mut t = UNIT_POS as usize / mma.plane;
    while t < own / mma.m * col_tiles {
        let (i, j) = (t / col_tiles, t % col_tiles);
        let update = Product::new(
            Operand::cols(&ks[i * mma.m..], part),
            Operand::rows(&us[j * mma.n..], cols),
            c,
        );
        tile_accumulate(update, &mut xs[i * mma.m * cols + j * mma.n..], cols, mma);
        t += planes;
    }
}
