//! The chunk output kernel of [`super`], and the cube functions the fused kernels of every
//! order share: one cube per chunk of every sequence and head, one unit per `per_unit`
//! tokens (their rows in registers, [`crate::backend::gpu::rows`]).

use burn_cubecl::cubecl;
use cubecl::prelude::*;

use crate::backend::gpu::rows::{
    blend, dot, fill, load_row, own_row, scale, shared_row, shared_strided, store_row,
};
use crate::hla::gpu::blocks::gate_row;

/// Floats of the shared buffer a cube holds beside its `[c, d]` matrix: room for the
/// largest of `[d, d]`, `[c, d]`, `[c, dv]` and `[d, dv]`.
pub(crate) fn shared_buffer(c: usize, d: usize, dv: usize) -> usize {
    (d * d).max(c * d).max(c * dv).max(d * dv)
}

/// `dst[..len] = src[from..from + len]`, every unit of the cube taking every
/// `CUBE_DIM`-th value, then a barrier.
#[cube]
pub(crate) fn copy_in(src: &Tensor<f32>, dst: &mut Shared<[f32]>, from: usize, len: usize) {
    let mut i = UNIT_POS as usize;
    while i < len {
        dst[i] = src[from + i];
        i += CUBE_DIM as usize;
    }
    sync_cube();
}

/// `b_τ` of token `tau` of the chunk whose gates start at `gate` (0 without decay).
#[cube]
pub(crate) fn log_decay(
    b: &Tensor<f32>,
    gate: usize,
    tau: usize,
    #[comptime] decayed: bool,
) -> f32 {
    let mut x = 0.0f32;
    if decayed {
        x = b[gate + tau];
    }
    x
}

/// Where a chunk's gates are in `b [gb · gh, chunks · c]`: the chunks of a sequence, the
/// heads, and the batch and heads of the gates.
#[derive(CubeLaunch, CubeType)]
pub(crate) struct Gates {
    pub(crate) chunks: usize,
    pub(crate) heads: usize,
    pub(crate) gb: usize,
    pub(crate) gh: usize,
}

/// Where chunk `block`'s gates start in `b`.
#[cube]
pub(crate) fn gate_start(block: usize, gates: &Gates, c: usize) -> usize {
    let chunks = gates.chunks;
    (gate_row(block / chunks, gates.heads, gates.gb, gates.gh) * chunks + block % chunks) * c
}

/// `b_τ` of this unit's `per_unit` tokens of a chunk of `c` ([`own_row`]) whose gates
/// start at `gate`.
#[cube]
pub(crate) fn own_decays(
    b: &Tensor<f32>,
    gate: usize,
    #[comptime] c: usize,
    #[comptime] per_unit: usize,
    #[comptime] decayed: bool,
) -> Array<f32> {
    let mut b_tau = Array::<f32>::new(per_unit);
    #[unroll]
    for t in 0..per_unit {
        b_tau[t] = log_decay(b, gate, own_row(t, c, per_unit), decayed);
    }
    b_tau
}

/// This unit's `per_unit` rows (tokens [`own_row`]) of chunk `block` of `x [blocks · c,
/// width]`, in registers.
#[cube]
pub(crate) fn own_rows(
    x: &Tensor<f32>,
    block: usize,
    #[comptime] c: usize,
    #[comptime] width: usize,
    #[comptime] per_unit: usize,
) -> Array<f32> {
    let mut rows = Array::<f32>::new(comptime!(per_unit * width));
    #[unroll]
    for t in 0..per_unit {
        let tau = own_row(t, c, per_unit);
        load_row(
            x,
            block * c + tau,
            true,
            1.0f32,
            &mut rows,
            t * width,
            width,
        );
    }
    rows
}

/// This unit's `per_unit` rows `x` (tokens [`own_row`], rows of `width`) into chunk
/// `block` of `dst [blocks · c, width]`: [`own_rows`]'s way back.
#[cube]
pub(crate) fn store_own_rows(
    x: &Array<f32>,
    dst: &mut Tensor<f32>,
    block: usize,
    #[comptime] c: usize,
    #[comptime] width: usize,
    #[comptime] per_unit: usize,
) {
    #[unroll]
    for t in 0..per_unit {
        store_row(
            x,
            t * width,
            1.0f32,
            dst,
            block * c + own_row(t, c, per_unit),
            width,
        );
    }
}

/// `M = D^p ⊙ (Q Rᵀ)` (written when `scores`) and `Y = diag(a^p) Q X + M V` of every
/// chunk with `p = power` (`X` read from its transpose when `transposed`), one cube per
/// block and one unit per `per_unit` tokens `τ`.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn output_kernel(
    q: &Tensor<f32>,
    r: &Tensor<f32>,
    v: &Tensor<f32>,
    x: &Tensor<f32>,
    b: &Tensor<f32>,
    m: &mut Tensor<f32>,
    y: &mut Tensor<f32>,
    gates: &Gates,
    power: f32,
    #[comptime] c: usize,
    #[comptime] d: usize,
    #[comptime] dv: usize,
    #[comptime] decayed: bool,
    #[comptime] scores: bool,
    #[comptime] transposed: bool,
    #[comptime] per_unit: usize,
) {
    let block = CUBE_POS;
    // A grid spread over its axes may hold a few more cubes than blocks.
    if block * c * d >= q.len() {
        terminate!();
    }
    let mut rows = Shared::<[f32]>::new_slice(comptime!(c * d));
    let mut buf = Shared::<[f32]>::new_slice(comptime!(shared_buffer(c, d, dv)));
    let gate = gate_start(block, gates, c);
    let b_tau = own_decays(b, gate, c, per_unit, decayed);
    let qt = own_rows(q, block, c, d, per_unit);
    // diag(a^p) Q X: row τ is a^p_τ q_τᵀ X = a^p_τ Σ_i q_τi x_i (X stored [dv, d] when
    // transposed).
    copy_in(x, &mut buf, block * d * dv, d * dv);
    let mut acc = Array::<f32>::new(comptime!(per_unit * dv));
    #[unroll]
    for t in 0..per_unit {
        fill(&mut acc, t * dv, dv);
    }
    for i in 0..d {
        let mut at = i * dv;
        if transposed {
            at = i;
        }
        let x_i = shared_strided(&buf, at, comptime!(if transposed { d } else { 1 }), dv);
        #[unroll]
        for t in 0..per_unit {
            blend(&mut acc, t * dv, 1.0f32, qt[t * d + i], &x_i, dv);
        }
    }
    #[unroll]
    for t in 0..per_unit {
        scale(&mut acc, t * dv, (power * b_tau[t]).exp(), dv);
    }
    sync_cube();
    // M's rows τ and M V.
    copy_in(r, &mut rows, block * c * d, c * d);
    copy_in(v, &mut buf, block * c * dv, c * dv);
    for sigma in 0..c {
        let r_sigma = shared_row(&rows, sigma, d);
        let v_sigma = shared_row(&buf, sigma, dv);
        let b_sigma = log_decay(b, gate, sigma, decayed);
        #[unroll]
        for t in 0..per_unit {
            let tau = own_row(t, c, per_unit);
            let mut score = 0.0f32;
            if sigma <= tau {
                score = (power * (b_tau[t] - b_sigma)).exp() * dot(&qt, t * d, &r_sigma, d);
                blend(&mut acc, t * dv, 1.0f32, score, &v_sigma, dv);
            }
            if scores {
                m[(block * c + tau) * c + sigma] = score;
            }
        }
    }
    store_own_rows(&acc, y, block, c, dv, per_unit);
}
