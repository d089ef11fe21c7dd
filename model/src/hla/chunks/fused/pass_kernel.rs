//! The kernel of a state's pass over the chunks ([`super::pass`]): one cube per tile of a
//! sequence's state values, one unit per `TILE × TILE` block of them in registers.

use burn_cubecl::cubecl;
use cubecl::prelude::*;

use super::kernel::{Gates, copy_in};
use crate::hla::gpu::blocks::{gate_row, state_at};

/// How a pass runs (compile-time): with the decay, `back` from the last chunk with `f = a`
/// (else forward with `f = e`), and from zeros (its start state unread).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub(crate) struct Walk {
    pub(crate) decayed: bool,
    pub(crate) back: bool,
    pub(crate) zero_start: bool,
}

/// The side of the block of state values a unit of the pass holds in registers: each
/// key and value it reads from shared memory serves `TILE` multiply-adds, where one value
/// per unit would load two for each.
pub(crate) const TILE: usize = 4;

/// [`super::pass::ChunkPass::chunk_pass`], one cube per `tiles`-th of a sequence's `rows ·
/// cols` state values and one unit per `TILE × TILE` block of them (of `owned` blocks).
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn pass_kernel(
    start: &Tensor<f32>,
    k: &Tensor<f32>,
    u: &Tensor<f32>,
    b: &Tensor<f32>,
    states: &mut Tensor<f32>,
    end: &mut Tensor<f32>,
    gates: &Gates,
    power: f32,
    tiles: usize,
    #[comptime] c: usize,
    #[comptime] rows: usize,
    #[comptime] cols: usize,
    #[comptime] walk: Walk,
) {
    let seq = CUBE_POS / tiles;
    // A grid spread over its axes may hold a few more cubes than tiles.
    if seq * rows * cols >= end.len() {
        terminate!();
    }
    let across = comptime!(cols.div_ceil(TILE));
    let owned = comptime!(rows.div_ceil(TILE) * across);
    let unit = (CUBE_POS % tiles) * CUBE_DIM as usize + UNIT_POS as usize;
    let active = unit < owned;
    let block = Block::new(unit / across * TILE, unit % across, rows, cols);
    let mut ks = Shared::<[f32]>::new_slice(comptime!(c * rows));
    let mut us = Shared::<[f32]>::new_slice(comptime!(c * cols));
    let heads = gates.heads;
    let chunks = gates.chunks;
    let mut x = Array::<f32>::new(comptime!(TILE * TILE));
    #[unroll]
    for e in 0..TILE * TILE {
        x[e] = 0.0;
    }
    // An idle unit's block lies past the state's last row: it reads nothing.
    if !walk.zero_start {
        read_block(start, seq, heads, &block, &mut x, rows, cols);
    }
    let gate = gate_row(seq, heads, gates.gb, gates.gh) * chunks;
    for step in 0..chunks {
        let mut m = step;
        if walk.back {
            m = chunks - 1 - step;
        }
        let chunk = seq * chunks + m;
        copy_in(k, &mut ks, chunk * c * rows, c * rows);
        copy_in(u, &mut us, chunk * c * cols, c * cols);
        let at = (gate + m) * c;
        let mut rho = 1.0f32;
        if walk.decayed {
            let b_last = b[at + c - 1];
            rho = (power * b_last).exp();
            scale_rows(b, at, b_last, power, &mut ks, c, rows, walk.back);
        }
        if active {
            write_block(states, chunk * rows * cols, &block, &x, rows, cols);
            let delta = block_product(&ks, &us, &block, c, rows, cols);
            #[unroll]
            for e in 0..TILE * TILE {
                x[e] = rho * x[e] + delta[e];
            }
        }
        // The next chunk's copies overwrite what this one read.
        sync_cube();
    }
    if active {
        write_block(end, seq * rows * cols, &block, &x, rows, cols);
    }
}

/// A unit's block of state values: rows `i0 + a` and columns `j0 + a · ⌈cols / TILE⌉`
/// for `a < TILE`, so the units of a warp take consecutive columns (their reads of a row
/// of `U` from shared memory fall in distinct banks, their writes of a state row are
/// coalesced) and share rows (their reads of `K` are broadcasts); and the rows and
/// columns it reads (clamped into the state, so a ragged edge reads inside the chunk; the
/// values past the edge are never written).
#[derive(CubeType)]
struct Block {
    i0: usize,
    j0: usize,
    i: Array<usize>,
    j: Array<usize>,
}

#[cube]
impl Block {
    fn new(i0: usize, j0: usize, #[comptime] rows: usize, #[comptime] cols: usize) -> Block {
        let mut i = Array::<usize>::new(TILE);
        let mut j = Array::<usize>::new(TILE);
        #[unroll]
        for a in 0..TILE {
            i[a] = clamp_below(i0 + a, rows);
            j[a] = clamp_below(block_col(j0, a, cols), cols);
        }
        Block { i0, j0, i, j }
    }
}

/// Column `a` of the block whose first column is `j0`, in a state of `cols` columns.
#[cube]
fn block_col(j0: usize, a: usize, #[comptime] cols: usize) -> usize {
    j0 + a * comptime!(cols.div_ceil(TILE))
}

/// `x` if below `n`, else `n − 1`.
#[cube]
fn clamp_below(x: usize, #[comptime] n: usize) -> usize {
    let mut y = x;
    if y >= n {
        y = n - 1;
    }
    y
}

/// `Kᵀ U` over the block's values of the chunk in `ks [c, rows]`, `us [c, cols]`.
#[cube]
fn block_product(
    ks: &Shared<[f32]>,
    us: &Shared<[f32]>,
    block: &Block,
    #[comptime] c: usize,
    #[comptime] rows: usize,
    #[comptime] cols: usize,
) -> Array<f32> {
    let mut delta = Array::<f32>::new(comptime!(TILE * TILE));
    #[unroll]
    for e in 0..TILE * TILE {
        delta[e] = 0.0;
    }
    let mut kr = Array::<f32>::new(TILE);
    let mut ur = Array::<f32>::new(TILE);
    for t in 0..c {
        #[unroll]
        for a in 0..TILE {
            kr[a] = ks[t * rows + block.i[a]];
            ur[a] = us[t * cols + block.j[a]];
        }
        #[unroll]
        for a in 0..TILE {
            #[unroll]
            for e in 0..TILE {
                delta[a * TILE + e] += kr[a] * ur[e];
            }
        }
    }
    delta
}

/// Rows `τ` of the chunk's `ks [c, rows]` scaled by `f^p_τ` (`f = a` when `back`, else
/// `e`), the units taking every `CUBE_DIM`-th row, then a barrier.
#[cube]
#[allow(clippy::too_many_arguments)]
fn scale_rows(
    b: &Tensor<f32>,
    at: usize,
    b_last: f32,
    power: f32,
    ks: &mut Shared<[f32]>,
    #[comptime] c: usize,
    #[comptime] rows: usize,
    #[comptime] back: bool,
) {
    let mut tau = UNIT_POS as usize;
    while tau < c {
        let f = key_factor(b[at + tau], b_last, power, back);
        for r in 0..rows {
            ks[tau * rows + r] *= f;
        }
        tau += CUBE_DIM as usize;
    }
    sync_cube();
}

/// `f^p_τ` of a token whose cumulative log gate is `b_tau` in a chunk whose last is
/// `b_last`: `a^p_τ = exp(p b_τ)` (the decay from the chunk's start) when `back`, else
/// `e^p_τ = exp(p (b_last − b_τ))` (to its end).
#[cube]
pub(crate) fn key_factor(b_tau: f32, b_last: f32, power: f32, #[comptime] back: bool) -> f32 {
    let mut log = b_last - b_tau;
    if back {
        log = b_tau;
    }
    (power * log).exp()
}

/// The block's values of sequence-and-head `seq`'s state in `state [b, h, rows, cols]`
/// (any strides) into `x`.
#[cube]
fn read_block(
    state: &Tensor<f32>,
    seq: usize,
    heads: usize,
    block: &Block,
    x: &mut Array<f32>,
    #[comptime] rows: usize,
    #[comptime] cols: usize,
) {
    #[unroll]
    for a in 0..TILE {
        #[unroll]
        for e in 0..TILE {
            let (i, j) = (block.i0 + a, block_col(block.j0, e, cols));
            if i < rows && j < cols {
                x[a * TILE + e] = state[state_at(state, seq, heads, i, j)];
            }
        }
    }
}

/// The block's values `x` into the `[rows, cols]` state at `offset` of `out`.
#[cube]
fn write_block(
    out: &mut Tensor<f32>,
    offset: usize,
    block: &Block,
    x: &Array<f32>,
    #[comptime] rows: usize,
    #[comptime] cols: usize,
) {
    #[unroll]
    for a in 0..TILE {
        #[unroll]
        for e in 0..TILE {
            let (i, j) = (block.i0 + a, block_col(block.j0, e, cols));
            if i < rows && j < cols {
                out[offset + i * cols + j] = x[a * TILE + e];
            }
        }
    }
}
