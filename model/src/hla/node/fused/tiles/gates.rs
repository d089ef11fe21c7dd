//! The gates' gradient in [`super::grads_tiles_kernel`]: each token's parts of `∂b` from
//! the products it keeps in shared memory, one unit a token.

use burn_cubecl::cubecl;
use cubecl::prelude::*;

use super::read_state;
use crate::backend::gpu::mma::{Mma, Operand, Product, tile_product};
use crate::hla::node::fused::kernel::Sums;

/// With the gates' gradient, each token's part through `D^p` into `parts[τ]`: `p` times
/// `T ⊙ (∂Y Uᵀ)`'s row `τ` less its column `τ` (`gs` not yet masked); `parts[c + τ]`, the
/// part through `b_last`, starts at zero.
#[cube]
pub(super) fn mask_parts(
    t: &Tensor<f32>,
    gs: &Shared<[f32]>,
    parts: &mut Shared<[f32]>,
    block: usize,
    power: f32,
    #[comptime] c: usize,
) {
    let t_at = block * c * c;
    let mut tau = UNIT_POS as usize;
    while tau < c {
        let mut part = 0.0f32;
        for sigma in 0..c {
            if sigma <= tau {
                part += t[t_at + tau * c + sigma] * gs[tau * c + sigma];
            }
            if sigma >= tau {
                part -= t[t_at + sigma * c + tau] * gs[sigma * c + tau];
            }
        }
        parts[tau] = power * part;
        parts[c + tau] = 0.0;
        tau += CUBE_DIM as usize;
    }
}

/// Keeps in `products` a product whose rows the gates' gradient dots, and dots them into
/// each token's parts, between barriers: `diag(e^p) A ∂X` (`scaled` holding `diag(e^p) A`,
/// `x` `∂X`) against `U` (`y`), with `∂A`'s term so far (`sum_in`) added when tied; or
/// with `read` the read's term (`scaled` holding `diag(a^p) ∂Y`, `x` the state read)
/// against `Q`, with ∂Q's terms so far added.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(super) fn keep_product(
    scaled: &Shared<[f32]>,
    x: &Tensor<f32>,
    y: &Tensor<f32>,
    sum_in: &Tensor<f32>,
    products: &mut Shared<[f32]>,
    parts: &mut Shared<[f32]>,
    block: usize,
    power: f32,
    #[comptime] c: usize,
    #[comptime] d: usize,
    #[comptime] n: usize,
    #[comptime] sums: Sums,
    #[comptime] read: bool,
    #[comptime] mma: Mma,
) {
    scaled_products(scaled, x, products, block, c, d, n, sums, read, mma);
    sync_cube();
    let (w, add) = comptime!(if read {
        (d, sums.q)
    } else {
        (n, sums.tied && sums.a)
    });
    gate_dots(
        products,
        y,
        sum_in,
        parts,
        block,
        power,
        c,
        w,
        comptime!(!read),
        add,
    );
    sync_cube();
}

/// Each token's dot of `products [c, w]`'s row with `y`'s (`[blocks, c, w]`) into its
/// part of ∂b, times `p`: `diag(e^p) A ∂X` against `U` (`until_end`: less, and into the
/// part through `b_last`), or the read's term against `Q` (plus); then, with `add`,
/// `sum_in`'s row added to the product's.
#[cube]
#[allow(clippy::too_many_arguments)]
fn gate_dots(
    products: &mut Shared<[f32]>,
    y: &Tensor<f32>,
    sum_in: &Tensor<f32>,
    parts: &mut Shared<[f32]>,
    block: usize,
    power: f32,
    #[comptime] c: usize,
    #[comptime] w: usize,
    #[comptime] until_end: bool,
    #[comptime] add: bool,
) {
    let mut tau = UNIT_POS as usize;
    while tau < c {
        let row = (block * c + tau) * w;
        let mut dot = 0.0f32;
        for j in 0..w {
            dot += products[tau * w + j] * y[row + j];
            if add {
                products[tau * w + j] += sum_in[row + j];
            }
        }
        if until_end {
            parts[tau] -= power * dot;
            parts[c + tau] = power * dot;
        } else {
            parts[tau] += power * dot;
        }
        tau += CUBE_DIM as usize;
    }
}

/// Into `out [c, w]`: `diag(e^p) A ∂X` (`w = n`, `scaled` holding `diag(e^p) A`), or
/// when `read` the read's term `diag(a^p) ∂Y X'ᵀ` (`w = d`, `scaled` holding
/// `diag(a^p) ∂Y`).
#[cube]
#[allow(clippy::too_many_arguments)]
fn scaled_products(
    scaled: &Shared<[f32]>,
    x: &Tensor<f32>,
    out: &mut Shared<[f32]>,
    block: usize,
    #[comptime] c: usize,
    #[comptime] d: usize,
    #[comptime] n: usize,
    #[comptime] sums: Sums,
    #[comptime] read: bool,
    #[comptime] mma: Mma,
) {
    let (len, w) = comptime!(if read { (n, d) } else { (d, n) });
    let planes = CUBE_DIM as usize / mma.plane;
    let mut at = UNIT_POS as usize / mma.plane;
    while at < comptime!(c / mma.m * (w / mma.n)) {
        let (i, j) = (at / comptime!(w / mma.n), at % comptime!(w / mma.n));
        let scaled_i = Operand::rows(&scaled[i * mma.m * len..], len);
        let x_j = if comptime!(read) {
            read_state(x, block, j, d, n, sums, mma)
        } else {
            Operand::rows(&x[block * d * n + j * mma.n..], n)
        };
        let tile = &mut out[i * mma.m * w + j * mma.n..];
        tile_product(Product::new(scaled_i, x_j, len), tile, w, mma);
        at += planes;
    }
}
