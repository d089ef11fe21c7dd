//! The gradients' tiles of [`super::grads_tiles_kernel`]: each plane takes output tiles
//! in turn, each tile one accumulator through its products and the sums in.

use burn_cubecl::cubecl;
use cubecl::prelude::*;

use super::read_state;
use crate::backend::gpu::mma::{Mma, Operand, Product, tile_sums};
use crate::hla::node::fused::kernel::Sums;

/// `∂U = Tᵀ ∂Y + (diag(e^p) A) ∂X`, `diag(e^p) A` in `ea`, or with `gated` the second
/// product already in `e`; `Tᵀ`'s rows `τ` start at `σ = τ`'s tile (`T` is zero above
/// its diagonal).
#[cube]
#[allow(clippy::too_many_arguments)]
pub(super) fn du_tiles(
    t: &Tensor<f32>,
    dy: &Tensor<f32>,
    x: &Tensor<f32>,
    ea: &Shared<[f32]>,
    e: &Shared<[f32]>,
    du: &mut Tensor<f32>,
    block: usize,
    #[comptime] c: usize,
    #[comptime] d: usize,
    #[comptime] n: usize,
    #[comptime] gated: bool,
    #[comptime] mma: Mma,
) {
    let plain = comptime!(if gated { 0usize } else { 1usize });
    let planes = CUBE_DIM as usize / mma.plane;
    let mut at = UNIT_POS as usize / mma.plane;
    while at < comptime!(c / mma.m * (n / mma.n)) {
        let (i, j) = (at / comptime!(n / mma.n), at % comptime!(n / mma.n));
        let from = i * mma.m;
        let t_i = Operand::cols(&t[block * c * c + from * c + i * mma.m..], c);
        let dy_j = Operand::rows(&dy[(block * c + from) * n + j * mma.n..], n);
        let ea_i = Operand::rows(&ea[i * mma.m * d..], d);
        let dx_j = Operand::rows(&x[block * d * n + j * mma.n..], n);
        let none = Product::new(ea_i.clone(), dx_j.clone(), 0);
        let e_ij = Operand::rows(&e[kept_at(i, j, n, gated, mma)..], n);
        let out = &mut du[(block * c + i * mma.m) * n + j * mma.n..];
        tile_sums(
            Product::new(t_i, dy_j, c - from),
            Product::new(ea_i, dx_j, d * plain),
            none.clone(),
            none,
            e_ij,
            out,
            n,
            gated,
            mma,
        );
        at += planes;
    }
}

/// Where tile `(i, j)` of a kept product `[c, w]` starts (0 where none is kept).
#[cube]
fn kept_at(
    i: usize,
    j: usize,
    #[comptime] w: usize,
    #[comptime] kept: bool,
    #[comptime] mma: Mma,
) -> usize {
    let mut at = 0usize;
    if kept {
        at = i * mma.m * w + j * mma.n;
    }
    at
}

/// `∂A = Gᵀ Q + (diag(e^p) U) ∂Xᵀ` (tied, `+ ∂U`: `U = A`, `eu` holds both, and with the
/// gates' gradient `diag(e^p) A ∂X` is in `e`), plus `∂A`'s term so far with `sums.a`
/// (tied with the gates' gradient, already in `e`); `Gᵀ`'s rows `τ` start at `σ = τ`'s
/// tile.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(super) fn da_tiles(
    q: &Tensor<f32>,
    dy: &Tensor<f32>,
    t: &Tensor<f32>,
    x: &Tensor<f32>,
    da_in: &Tensor<f32>,
    gs: &Shared<[f32]>,
    eu: &Shared<[f32]>,
    e: &Shared<[f32]>,
    da: &mut Tensor<f32>,
    block: usize,
    #[comptime] c: usize,
    #[comptime] d: usize,
    #[comptime] n: usize,
    #[comptime] sums: Sums,
    #[comptime] mma: Mma,
) {
    let kept = comptime!(sums.tied && sums.gates);
    let tied = comptime!(if sums.tied { 1usize } else { 0usize });
    let plain = comptime!(if sums.gates { 0usize } else { 1usize });
    let planes = CUBE_DIM as usize / mma.plane;
    let mut at = UNIT_POS as usize / mma.plane;
    while at < comptime!(c / mma.m * (d / mma.n)) {
        let (i, j) = (at / comptime!(d / mma.n), at % comptime!(d / mma.n));
        let from = i * mma.m;
        let g_i = Operand::cols(&gs[from * c + i * mma.m..], c);
        let q_j = Operand::rows(&q[(block * c + from) * d + j * mma.n..], d);
        let eu_i = Operand::rows(&eu[i * mma.m * n..], n);
        // ∂Xᵀ [n, d] by columns: ∂X's rows.
        let dxt_j = Operand::cols(&x[block * d * n + j * mma.n * n..], n);
        // Tied (n = d): ∂U's products, Tᵀ ∂Y and (diag(e^p) A) ∂X.
        let t_i = Operand::cols(&t[block * c * c + from * c + i * mma.m..], c);
        let dy_j = Operand::rows(&dy[(block * c + from) * n + j * mma.n..], n);
        let dx_j = Operand::rows(&x[block * d * n + j * mma.n..], n);
        let out_at = (block * c + i * mma.m) * d + j * mma.n;
        let init = if comptime!(kept) {
            Operand::rows(&e[kept_at(i, j, n, kept, mma)..], n)
        } else {
            Operand::rows(&da_in[out_at..], d)
        };
        tile_sums(
            Product::new(g_i, q_j, c - from),
            Product::new(eu_i.clone(), dxt_j, n),
            Product::new(t_i, dy_j, (c - from) * tied),
            Product::new(eu_i, dx_j, d * tied * plain),
            init,
            &mut da[out_at..],
            d,
            comptime!(kept || sums.a),
            mma,
        );
        at += planes;
    }
}

/// `∂Q = G A + (diag(a^p) ∂Y) X'ᵀ` (with `sums.read`, `diag(a^p) ∂Y` in `ady`, or with
/// the gates' gradient the read's term, with ∂Q's terms so far, in `r`; `X'` `[d, n]`,
/// or `[n, d]` when `sums.transposed`), plus ∂Q's terms so far with `sums.q`; `G`'s rows
/// `τ` end at `τ`'s tile.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(super) fn dq_tiles(
    a: &Tensor<f32>,
    x_start: &Tensor<f32>,
    dq_in: &Tensor<f32>,
    gs: &Shared<[f32]>,
    ady: &Shared<[f32]>,
    r: &Shared<[f32]>,
    dq: &mut Tensor<f32>,
    block: usize,
    #[comptime] c: usize,
    #[comptime] d: usize,
    #[comptime] n: usize,
    #[comptime] sums: Sums,
    #[comptime] mma: Mma,
) {
    let kept = comptime!(sums.read && sums.gates);
    let read = comptime!(if sums.read && !sums.gates { n } else { 0usize });
    let planes = CUBE_DIM as usize / mma.plane;
    let mut at = UNIT_POS as usize / mma.plane;
    while at < comptime!(c / mma.m * (d / mma.n)) {
        let (i, j) = (at / comptime!(d / mma.n), at % comptime!(d / mma.n));
        let g_i = Operand::rows(&gs[i * mma.m * c..], c);
        let a_j = Operand::rows(&a[block * c * d + j * mma.n..], d);
        let ady_i = Operand::rows(&ady[i * mma.m * n..], n);
        let xt_j = read_state(x_start, block, j, d, n, sums, mma);
        let none = Product::new(g_i.clone(), a_j.clone(), 0);
        let out_at = (block * c + i * mma.m) * d + j * mma.n;
        let init = if comptime!(kept) {
            Operand::rows(&r[kept_at(i, j, d, kept, mma)..], d)
        } else {
            Operand::rows(&dq_in[out_at..], d)
        };
        tile_sums(
            Product::new(g_i, a_j, (i + 1) * mma.m),
            Product::new(ady_i, xt_j, read),
            none.clone(),
            none,
            init,
            &mut dq[out_at..],
            d,
            comptime!(kept || sums.q),
            mma,
        );
        at += planes;
    }
}
