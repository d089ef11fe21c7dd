//! [`super`]'s backward step on the tensor cores: per chunk, `∂Y Uᵀ` tile by tile
//! (those on or below the diagonal) into shared memory, masked there to `G = D^p ⊙
//! (∂Y Uᵀ)`, then each output tile one accumulator ([`crate::backend::gpu::mma`]):
//!
//! ```text
//! ∂U = Tᵀ ∂Y + (diag(e^p) A) ∂X,   ∂A = Gᵀ Q + (diag(e^p) U) ∂Xᵀ,   ∂Q = G A + (diag(a^p) ∂Y) X'ᵀ
//! ```
//!
//! with the sums in the same accumulators (∂Q's and ∂A's terms so far, and, tied, `∂U` in
//! `∂A`'s). The row-scaled operand of each product is copied into shared memory and
//! scaled there in turn; `T`, `∂Y`, `Q`, `A`, `∂X` and `X'` are read as fragments from
//! global memory (`Tᵀ`, `Gᵀ`, `∂Xᵀ` and `X'ᵀ` by columns). Where the gates need a
//! gradient, each token's parts of it come from shared memory: `T ⊙ (∂Y Uᵀ)`'s row less
//! its column before the mask, and the rows of `diag(e^p) A ∂X` and of the read's term,
//! kept there as tiles of their own, against `U` and `Q` (the kept products then start
//! their gradients' accumulators). One cube per chunk of every sequence and head, each
//! plane taking output tiles in turn. The register-tile kernel
//! ([`super::kernel::grads_kernel`]) is its oracle, and runs wherever a device has no
//! tensor cores.

use burn_cubecl::cubecl;
use cubecl::prelude::*;

use super::kernel::{Sums, store_log_gates};
use crate::backend::gpu::mma::{Mma, Operand, Product, tile_product};
use crate::hla::chunks::fused::kernel::{Gates, copy_in, gate_start, log_decay};
use crate::hla::chunks::fused::tiles::{mask_in_place, scale_in_place};
use gates::{keep_product, mask_parts};
use outputs::{da_tiles, dq_tiles, du_tiles};

/// Shared floats of [`grads_tiles_kernel`]: `G` and one row-scaled operand of a chunk,
/// and with the gates' gradient the product it dots and its parts a token.
pub(crate) fn grads_tiles_shared(c: usize, d: usize, n: usize, gates: bool) -> usize {
    let scaled = c * d.max(n);
    c * c + scaled + if gates { scaled + 2 * c } else { 0 }
}

/// Whether a chunk of `c` tokens with `d`-wide queries and `n`-wide `U` tiles into
/// `mma`'s fragments (every output's columns, every product's length).
pub(crate) fn grads_tiles_fit(mma: &Mma, c: usize, d: usize, n: usize) -> bool {
    let whole = |x: usize| x > 0 && x.is_multiple_of(mma.m) && x.is_multiple_of(mma.n);
    whole(c) && whole(d) && whole(n) && [c, d, n].iter().all(|x| x.is_multiple_of(mma.k))
}

/// `[∂U, ∂A, ∂Q]` of every chunk with `p = power`, and with `sums.gates` the log gates'
/// gradient, as [`super::kernel::grads_kernel`], one cube per block, its planes taking
/// tiles in turn.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn grads_tiles_kernel(
    q: &Tensor<f32>,
    dy: &Tensor<f32>,
    a: &Tensor<f32>,
    u: &Tensor<f32>,
    t: &Tensor<f32>,
    x: &Tensor<f32>,
    b: &Tensor<f32>,
    dq_in: &Tensor<f32>,
    da_in: &Tensor<f32>,
    x_start: &Tensor<f32>,
    log_g_in: &Tensor<f32>,
    du: &mut Tensor<f32>,
    da: &mut Tensor<f32>,
    dq: &mut Tensor<f32>,
    log_g: &mut Tensor<f32>,
    gates: &Gates,
    power: f32,
    #[comptime] c: usize,
    #[comptime] d: usize,
    #[comptime] n: usize,
    #[comptime] decayed: bool,
    #[comptime] sums: Sums,
    #[comptime] mma: Mma,
) {
    let block = CUBE_POS;
    // A grid spread over its axes may hold a few more cubes than blocks.
    if block * c * d >= q.len() {
        terminate!();
    }
    // Fragments load from 32-byte aligned addresses; every tile starts a multiple of 8
    // floats in.
    let width = comptime!(d.max(n));
    let mut gs = Shared::<[f32]>::new_aligned_slice(comptime!(c * c), 32usize);
    let mut scaled = Shared::<[f32]>::new_aligned_slice(comptime!(c * width), 32usize);
    // With the gates' gradient: `diag(e^p) A ∂X`, then the read's term, beside them (their
    // rows dot into ∂b before they join their gradients), and the parts of ∂b a token.
    let kept = comptime!(if sums.gates { c * width } else { 8 });
    let mut products = Shared::<[f32]>::new_aligned_slice(kept, 32usize);
    let mut parts = Shared::<[f32]>::new_slice(comptime!(if sums.gates { 2 * c } else { 1 }));
    let gate = gate_start(block, gates, c);

    let w = comptime!(Tiling::new(c, d, n, decayed, sums, mma));
    let (g, scaled_of, parts_of) = (&mut gs, &mut scaled, &mut parts);
    masked_g(
        dy, u, a, t, b, g, scaled_of, parts_of, block, gate, power, w,
    );
    if sums.gates {
        let (p, kept) = (power, &mut products);
        keep_product(
            &scaled, x, u, da_in, kept, &mut parts, block, p, c, d, n, sums, false, mma,
        );
    }

    if !sums.tied {
        du_tiles(
            t, dy, x, &scaled, &products, du, block, c, d, n, sums.gates, mma,
        );
        sync_cube();
        copy_in(u, &mut scaled, block * c * n, c * n);
        scale_in_place(b, gate, &mut scaled, power, c, n, decayed, true);
        sync_cube();
    }
    da_tiles(
        q, dy, t, x, da_in, &gs, &scaled, &products, da, block, c, d, n, sums, mma,
    );

    if sums.read {
        let (scaled_of, kept, parts_of) = (&mut scaled, &mut products, &mut parts);
        read_operand(
            dy, b, x_start, q, dq_in, scaled_of, kept, parts_of, block, gate, power, w,
        );
    }
    dq_tiles(
        a, x_start, dq_in, &gs, &scaled, &products, dq, block, c, d, n, sums, mma,
    );
    if sums.gates {
        let (b_last, size) = (log_decay(b, gate, c - 1, decayed), comptime!(d * n));
        store_log_gates(
            &mut parts, x, x_start, log_g_in, log_g, block, power, b_last, c, size, sums,
        );
    }
}

/// A chunk's widths and what [`grads_tiles_kernel`] does with them (compile-time): `c`
/// tokens, keys of `d`, `U` of `n`, whether it decays, its sums and the fragments.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Tiling {
    c: usize,
    d: usize,
    n: usize,
    decayed: bool,
    sums: Sums,
    mma: Mma,
}

impl Tiling {
    fn new(c: usize, d: usize, n: usize, decayed: bool, sums: Sums, mma: Mma) -> Self {
        Self {
            c,
            d,
            n,
            decayed,
            sums,
            mma,
        }
    }
}

/// `G = D^p ⊙ (∂Y Uᵀ)` into `gs` and `diag(e^p) A` into `scaled`; with the gates'
/// gradient, each token's parts of `∂b` through `T ⊙ (∂Y Uᵀ)` into `parts` before the mask.
#[cube]
#[allow(clippy::too_many_arguments)]
fn masked_g(
    dy: &Tensor<f32>,
    u: &Tensor<f32>,
    a: &Tensor<f32>,
    t: &Tensor<f32>,
    b: &Tensor<f32>,
    gs: &mut Shared<[f32]>,
    scaled: &mut Shared<[f32]>,
    parts: &mut Shared<[f32]>,
    block: usize,
    gate: usize,
    power: f32,
    #[comptime] w: Tiling,
) {
    let (c, d, n, decayed, sums, mma) = (w.c, w.d, w.n, w.decayed, w.sums, w.mma);
    dy_u_tiles(dy, u, gs, block, c, n, mma);
    // diag(e^p) A beside it (tied: also diag(e^p) U).
    copy_in(a, scaled, block * c * d, c * d);
    scale_in_place(b, gate, scaled, power, c, d, decayed, true);
    if sums.gates {
        mask_parts(t, &*gs, parts, block, power, c);
        sync_cube();
    }
    mask_in_place(b, gate, gs, power, c, decayed);
    sync_cube();
}

/// The read's operand `diag(a^p) ∂Y` into `scaled`; with the gates' gradient, its product
/// with `X'` kept beside it and dotted into `parts` ([`keep_product`]).
#[cube]
#[allow(clippy::too_many_arguments)]
fn read_operand(
    dy: &Tensor<f32>,
    b: &Tensor<f32>,
    x_start: &Tensor<f32>,
    q: &Tensor<f32>,
    dq_in: &Tensor<f32>,
    scaled: &mut Shared<[f32]>,
    products: &mut Shared<[f32]>,
    parts: &mut Shared<[f32]>,
    block: usize,
    gate: usize,
    power: f32,
    #[comptime] w: Tiling,
) {
    let (c, d, n, decayed, sums, mma) = (w.c, w.d, w.n, w.decayed, w.sums, w.mma);
    sync_cube();
    copy_in(dy, scaled, block * c * n, c * n);
    scale_in_place(b, gate, scaled, power, c, n, decayed, false);
    sync_cube();
    if sums.gates {
        keep_product(
            &*scaled, x_start, q, dq_in, products, parts, block, power, c, d, n, sums, true, mma,
        );
    }
}

/// `∂Y Uᵀ` on and below the diagonal into `gs [c, c]`, `Uᵀ` read by columns from `U`'s
/// rows.
#[cube]
fn dy_u_tiles(
    dy: &Tensor<f32>,
    u: &Tensor<f32>,
    gs: &mut Shared<[f32]>,
    block: usize,
    #[comptime] c: usize,
    #[comptime] n: usize,
    #[comptime] mma: Mma,
) {
    let planes = CUBE_DIM as usize / mma.plane;
    let mut at = UNIT_POS as usize / mma.plane;
    while at < comptime!(c / mma.m * (c / mma.n)) {
        let (i, j) = (at / comptime!(c / mma.n), at % comptime!(c / mma.n));
        if j * mma.n < (i + 1) * mma.m {
            let dy_i = Operand::rows(&dy[(block * c + i * mma.m) * n..], n);
            let u_j = Operand::cols(&u[(block * c + j * mma.n) * n..], n);
            let out = &mut gs[i * mma.m * c + j * mma.n..];
            tile_product(Product::new(dy_i, u_j, n), out, c, mma);
        }
        at += planes;
    }
}

/// `X'ᵀ`'s column tile `j` (`[n, d]`): by columns from `X' [d, n]`, by rows where it is
/// stored transposed; without the read, `x_start` is any tensor, read from its start.
#[cube]
fn read_state<'a>(
    x_start: &'a Tensor<f32>,
    block: usize,
    j: usize,
    #[comptime] d: usize,
    #[comptime] n: usize,
    #[comptime] sums: Sums,
    #[comptime] mma: Mma,
) -> Operand<'a> {
    let mut from = 0usize;
    if sums.read {
        from = block * d * n + j * mma.n * comptime!(if sums.transposed { 1usize } else { n });
    }
    Operand::new(
        &x_start[from..],
        comptime!(if sums.transposed { d } else { n }),
        comptime!(!sums.transposed),
    )
}

mod gates;
mod outputs;
#[cfg(all(test, feature = "wgpu"))]
mod tests;
