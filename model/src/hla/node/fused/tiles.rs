//! [`super`]'s backward step on the tensor cores, where the gates need no gradient: per
//! chunk, `G = D^p ⊙ (∂Y Uᵀ)` tile by tile (those on or below the diagonal) into shared
//! memory, masked there, then each output tile one accumulator
//! ([`crate::backend::gpu::mma`]):
//!
//! ```text
//! ∂U = Tᵀ ∂Y + (diag(e^p) A) ∂X,   ∂A = Gᵀ Q + (diag(e^p) U) ∂Xᵀ,   ∂Q = G A + (diag(a^p) ∂Y) X'ᵀ
//! ```
//!
//! with the sums in the same accumulators (∂Q's and ∂A's terms so far, and, tied, `∂U` in
//! `∂A`'s). The row-scaled operand of each product is copied into shared memory and
//! scaled there in turn; `T`, `∂Y`, `Q`, `A`, `∂X` and `X'` are read as fragments from
//! global memory (`Tᵀ`, `Gᵀ`, `∂Xᵀ` and `X'ᵀ` by columns). One cube per chunk of every
//! sequence and head, each plane taking output tiles in turn. The register-tile kernel
//! ([`super::kernel::grads_kernel`]) is its oracle, and runs wherever a device has no
//! tensor cores or the gates need their gradient.

use burn_cubecl::cubecl;
use cubecl::prelude::*;

use super::kernel::Sums;
use crate::backend::gpu::mma::{Mma, Operand, Product, tile_product, tile_sum, tile_sums};
use crate::hla::chunks::fused::kernel::{Gates, copy_in, gate_start};
use crate::hla::chunks::fused::tiles::{mask_in_place, scale_in_place};

/// Shared floats of [`grads_tiles_kernel`]: `G` and one row-scaled operand of a chunk.
pub(crate) fn grads_tiles_shared(c: usize, d: usize, n: usize) -> usize {
    c * c + c * d.max(n)
}

/// Whether a chunk of `c` tokens with `d`-wide queries and `n`-wide `U` tiles into
/// `mma`'s fragments (every output's columns, every product's length).
pub(crate) fn grads_tiles_fit(mma: &Mma, c: usize, d: usize, n: usize) -> bool {
    let whole = |x: usize| x > 0 && x.is_multiple_of(mma.m) && x.is_multiple_of(mma.n);
    whole(c) && whole(d) && whole(n) && [c, d, n].iter().all(|x| x.is_multiple_of(mma.k))
}

/// `[∂U, ∂A, ∂Q]` of every chunk with `p = power`, as [`super::kernel::grads_kernel`]
/// without the gates' gradient, one cube per block, its planes taking tiles in turn.
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
    du: &mut Tensor<f32>,
    da: &mut Tensor<f32>,
    dq: &mut Tensor<f32>,
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
    let mut gs = Shared::<[f32]>::new_aligned_slice(comptime!(c * c), 32usize);
    let mut scaled = Shared::<[f32]>::new_aligned_slice(comptime!(c * d.max(n)), 32usize);
    let gate = gate_start(block, gates, c);
    let planes = CUBE_DIM as usize / mma.plane;
    let plane = UNIT_POS as usize / mma.plane;

    // ∂Y Uᵀ on and below the diagonal, Uᵀ read by columns from U's rows.
    let tiles = comptime!(c / mma.m * (c / mma.n));
    let mut at = plane;
    while at < tiles {
        let (i, j) = (at / comptime!(c / mma.n), at % comptime!(c / mma.n));
        if j * mma.n < (i + 1) * mma.m {
            let dy_i = Operand::rows(&dy[(block * c + i * mma.m) * n..], n);
            let u_j = Operand::cols(&u[(block * c + j * mma.n) * n..], n);
            let out = &mut gs[i * mma.m * c + j * mma.n..];
            tile_product(Product::new(dy_i, u_j, n), out, c, mma);
        }
        at += planes;
    }
    // diag(e^p) A beside it (tied: also diag(e^p) U).
    copy_in(a, &mut scaled, block * c * d, c * d);
    scale_in_place(b, gate, &mut scaled, power, c, d, decayed, true);
    mask_in_place(b, gate, &mut gs, power, c, decayed);
    sync_cube();

    if !sums.tied {
        du_tiles(t, dy, x, &scaled, du, block, c, d, n, mma);
        sync_cube();
        copy_in(u, &mut scaled, block * c * n, c * n);
        scale_in_place(b, gate, &mut scaled, power, c, n, decayed, true);
        sync_cube();
    }
    da_tiles(
        q, dy, t, x, da_in, &gs, &scaled, da, block, c, d, n, sums, mma,
    );

    if sums.read {
        sync_cube();
        copy_in(dy, &mut scaled, block * c * n, c * n);
        scale_in_place(b, gate, &mut scaled, power, c, n, decayed, false);
        sync_cube();
    }
    dq_tiles(
        a, x_start, dq_in, &gs, &scaled, dq, block, c, d, n, sums, mma,
    );
}

/// `∂U = Tᵀ ∂Y + (diag(e^p) A) ∂X`, `diag(e^p) A` in `ea`; `Tᵀ`'s rows `τ` start at
/// `σ = τ`'s tile (`T` is zero above its diagonal).
#[cube]
#[allow(clippy::too_many_arguments)]
fn du_tiles(
    t: &Tensor<f32>,
    dy: &Tensor<f32>,
    x: &Tensor<f32>,
    ea: &Shared<[f32]>,
    du: &mut Tensor<f32>,
    block: usize,
    #[comptime] c: usize,
    #[comptime] d: usize,
    #[comptime] n: usize,
    #[comptime] mma: Mma,
) {
    let planes = CUBE_DIM as usize / mma.plane;
    let mut at = UNIT_POS as usize / mma.plane;
    while at < comptime!(c / mma.m * (n / mma.n)) {
        let (i, j) = (at / comptime!(n / mma.n), at % comptime!(n / mma.n));
        let from = i * mma.m;
        let t_i = Operand::cols(&t[block * c * c + from * c + i * mma.m..], c);
        let dy_j = Operand::rows(&dy[(block * c + from) * n + j * mma.n..], n);
        let ea_i = Operand::rows(&ea[i * mma.m * d..], d);
        let dx_j = Operand::rows(&x[block * d * n + j * mma.n..], n);
        let out = &mut du[(block * c + i * mma.m) * n + j * mma.n..];
        tile_sum(
            Product::new(t_i, dy_j, c - from),
            Product::new(ea_i, dx_j, d),
            out,
            n,
            mma,
        );
        at += planes;
    }
}

/// `∂A = Gᵀ Q + (diag(e^p) U) ∂Xᵀ` (tied, `+ ∂U`: `U = A`, `eu` holds both), plus
/// `∂A`'s term so far with `sums.a`; `Gᵀ`'s rows `τ` start at `σ = τ`'s tile.
#[cube]
#[allow(clippy::too_many_arguments)]
fn da_tiles(
    q: &Tensor<f32>,
    dy: &Tensor<f32>,
    t: &Tensor<f32>,
    x: &Tensor<f32>,
    da_in: &Tensor<f32>,
    gs: &Shared<[f32]>,
    eu: &Shared<[f32]>,
    da: &mut Tensor<f32>,
    block: usize,
    #[comptime] c: usize,
    #[comptime] d: usize,
    #[comptime] n: usize,
    #[comptime] sums: Sums,
    #[comptime] mma: Mma,
) {
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
        let tied = comptime!(if sums.tied { 1usize } else { 0usize });
        let sum_in = Operand::rows(&da_in[(block * c + i * mma.m) * d + j * mma.n..], d);
        let out = &mut da[(block * c + i * mma.m) * d + j * mma.n..];
        tile_sums(
            Product::new(g_i, q_j, c - from),
            Product::new(eu_i.clone(), dxt_j, n),
            Product::new(t_i, dy_j, (c - from) * tied),
            Product::new(eu_i, dx_j, d * tied),
            sum_in,
            out,
            d,
            sums.a,
            mma,
        );
        at += planes;
    }
}

/// `∂Q = G A + (diag(a^p) ∂Y) X'ᵀ` (with `sums.read`, `diag(a^p) ∂Y` in `ady`; `X'`
/// `[d, n]`, or `[n, d]` when `sums.transposed`), plus ∂Q's terms so far with `sums.q`;
/// `G`'s rows `τ` end at `τ`'s tile.
#[cube]
#[allow(clippy::too_many_arguments)]
fn dq_tiles(
    a: &Tensor<f32>,
    x_start: &Tensor<f32>,
    dq_in: &Tensor<f32>,
    gs: &Shared<[f32]>,
    ady: &Shared<[f32]>,
    dq: &mut Tensor<f32>,
    block: usize,
    #[comptime] c: usize,
    #[comptime] d: usize,
    #[comptime] n: usize,
    #[comptime] sums: Sums,
    #[comptime] mma: Mma,
) {
    let planes = CUBE_DIM as usize / mma.plane;
    let mut at = UNIT_POS as usize / mma.plane;
    while at < comptime!(c / mma.m * (d / mma.n)) {
        let (i, j) = (at / comptime!(d / mma.n), at % comptime!(d / mma.n));
        let g_i = Operand::rows(&gs[i * mma.m * c..], c);
        let a_j = Operand::rows(&a[block * c * d + j * mma.n..], d);
        let ady_i = Operand::rows(&ady[i * mma.m * n..], n);
        // X'ᵀ [n, d]: by columns from X' [d, n], by rows when it is stored transposed.
        // Without the read, x_start is any tensor, and the product's length 0.
        let mut from = 0usize;
        if sums.read {
            from = block * d * n + j * mma.n * comptime!(if sums.transposed { 1usize } else { n });
        }
        let xt_j = Operand::new(
            &x_start[from..],
            comptime!(if sums.transposed { d } else { n }),
            comptime!(!sums.transposed),
        );
        let read = comptime!(if sums.read { n } else { 0usize });
        let none = Product::new(g_i.clone(), a_j.clone(), 0);
        let sum_in = Operand::rows(&dq_in[(block * c + i * mma.m) * d + j * mma.n..], d);
        let out = &mut dq[(block * c + i * mma.m) * d + j * mma.n..];
        tile_sums(
            Product::new(g_i, a_j, (i + 1) * mma.m),
            Product::new(ady_i, xt_j, read),
            none.clone(),
            none,
            sum_in,
            out,
            d,
            sums.q,
            mma,
        );
        at += planes;
    }
}

#[cfg(all(test, feature = "wgpu"))]
mod tests {
    use burn::backend::Dispatch;
    use burn::prelude::*;
    use burn::tensor::{DeviceKind, Distribution};

    use super::super::{Grads, MomentGrads, Sums};
    use crate::agreement::relative_rms_error;
    use crate::backend::{TensorCores, set_tensor_cores};
    use crate::hla::chunks::Chunks;
    use crate::hla::chunks::fused::{blocks, gates_layout};
    use crate::hla::decay::Decay;

    /// A moment product's operands in chunks: `q`, `∂Y`, `A`, `U`, `T`, `∂X` after the
    /// chunk, the terms so far of ∂Q and `∂A`, the state the read took.
    struct Operands {
        q: Tensor<5>,
        dy: Tensor<5>,
        a: Tensor<5>,
        u: Tensor<5>,
        t: Tensor<5>,
        x: Tensor<5>,
        dq_in: Tensor<5>,
        da_in: Tensor<5>,
        x_start: Tensor<5>,
    }

    /// `[∂U, ∂A, ∂Q]` as the composed form computes them.
    fn composed(o: &Operands, decay: &Decay<5>, power: u32, sums: Sums) -> [Tensor<5>; 3] {
        let p = f64::from(power);
        let g = decay.mask(o.dy.clone().matmul(o.u.clone().transpose()), power);
        let ea = decay.until_end(o.a.clone(), p);
        let eu = decay.until_end(o.u.clone(), p);
        let du = o.t.clone().transpose().matmul(o.dy.clone()) + ea.matmul(o.x.clone());
        let mut da = g.clone().transpose().matmul(o.q.clone()) + eu.matmul(o.x.clone().transpose());
        if sums.tied {
            da = da + du.clone();
        }
        if sums.a {
            da = da + o.da_in.clone();
        }
        let mut dq = g.matmul(o.a.clone());
        if sums.read {
            let x_t = match sums.transposed {
                true => o.x_start.clone(),
                false => o.x_start.clone().transpose(),
            };
            dq = dq + decay.since_start(o.dy.clone(), p).matmul(x_t);
        }
        if sums.q {
            dq = dq + o.dq_in.clone();
        }
        [du, da, dq]
    }

    /// `[∂U, ∂A, ∂Q]` (`[∂A, ∂Q]` when tied) from the tiles (emulated), in chunks.
    fn tiles(o: &Operands, decay: &Decay<5>, power: u32, sums: Sums) -> Vec<Tensor<5>> {
        let (layout, b) = gates_layout(&o.q, decay);
        let grads = Grads {
            layout,
            power,
            sums,
        };
        let [q, dy, a, u, t, x, dq_in, da_in, x_start] = [
            &o.q, &o.dy, &o.a, &o.u, &o.t, &o.x, &o.dq_in, &o.da_in, &o.x_start,
        ]
        .map(|t| blocks(t).into_dispatch());
        set_tensor_cores(TensorCores::Emulated);
        let (du, da, dq, _) = <Dispatch as MomentGrads>::moment_grads(
            q,
            dy,
            a,
            u,
            t,
            x,
            b.into_dispatch(),
            dq_in,
            da_in,
            x_start,
            grads,
        );
        // Fusion runs the custom op when its queue flushes.
        o.q.device().sync().expect("the device runs the kernel");
        set_tensor_cores(TensorCores::default());
        let [bs, h, n, c, _] = o.dy.dims();
        let grads = [du, da, dq].into_iter().skip(usize::from(sums.tied));
        grads
            .map(|x| {
                let x = Tensor::<3>::from_dispatch(x);
                let cols = x.dims()[2];
                x.reshape([bs, h, n, c, cols])
            })
            .collect()
    }

    /// The tiles (emulated on lavapipe) against the composed form: three row and column
    /// tiles a chunk (`Tᵀ` and `Gᵀ` from each tile's diagonal on, `G` up to it), `∂U` two
    /// tiles wide, with and without the sums in, tied, the read by rows and by columns,
    /// without decay, with gates per token (p = 2) and with a per-head decay (p = 3).
    #[test]
    fn the_tiles_are_the_composed_gradients() {
        let device = Device::wgpu(DeviceKind::DefaultDevice);
        let (bs, h, time, c, d) = (2, 2, 70, 48, 16);
        let chunks = Chunks::new(time, c);
        let normal = Distribution::Normal(0.0, 1.0);
        let uniform = Distribution::Uniform(-0.3, 0.0);
        let random =
            |width: usize| chunks.split(Tensor::<4>::random([bs, h, time, width], normal, &device));
        let per_token = Tensor::<3>::random([bs, h, time], uniform, &device);
        let per_head = Tensor::<3>::random([1, h, 1], uniform, &device).expand([1, h, time]);
        let sums = |q, a, tied, read, transposed| Sums {
            q,
            a,
            tied,
            read,
            transposed,
            gates: false,
        };
        let cases = [
            sums(false, false, false, false, false),
            sums(true, true, false, true, false),
            sums(true, false, false, true, true),
            sums(false, true, true, false, false),
            sums(true, true, true, true, true),
        ];
        for (log_g, power) in [(None, 1), (Some(per_token), 2), (Some(per_head), 3)] {
            let decay = chunks.decay(log_g.as_ref());
            for sums in cases {
                let n = if sums.tied { d } else { 2 * d };
                let a = random(d);
                let chunk_count = a.dims()[2];
                let state = |rows, cols| {
                    Tensor::<5>::random([bs, h, chunk_count, rows, cols], normal, &device)
                };
                let o = Operands {
                    q: random(d),
                    dy: random(n),
                    u: if sums.tied { a.clone() } else { random(n) },
                    a,
                    // T is zero above its diagonal, as the forward leaves it.
                    t: random(c).tril(0),
                    x: state(d, n),
                    dq_in: random(d),
                    da_in: random(d),
                    x_start: if sums.transposed {
                        state(n, d)
                    } else {
                        state(d, n)
                    },
                };
                let got = tiles(&o, &decay, power, sums);
                let want = composed(&o, &decay, power, sums);
                let errors: Vec<_> = got
                    .into_iter()
                    .zip(want.into_iter().skip(usize::from(sums.tied)))
                    .map(|(got, want)| relative_rms_error(got, want))
                    .collect();
                assert!(
                    errors.iter().all(|e| *e < 1e-5),
                    "power {power}, {sums:?}: {errors:?}"
                );
            }
        }
    }
}
