//! [`super`]'s output step on the tensor cores: per chunk, `S = Q Rᵀ` tile by tile (those
//! on or below the diagonal), then `M = D^p ⊙ S` and `diag(a^p) Q` in place in shared
//! memory, then `Y = diag(a^p) Q X + M V` tile by tile, each tile's products one
//! accumulator ([`crate::backend::gpu::mma`]). One cube per chunk of every sequence and
//! head, each plane taking output tiles in turn; `Q` and `M` stay in shared memory, `R`,
//! `X` and `V` are read as fragments from global memory. The register-tile kernel
//! ([`super::kernel::output_kernel`]) is its oracle and runs wherever a device has no
//! tensor cores.

use burn_cubecl::cubecl;
use cubecl::prelude::*;

use crate::backend::gpu::mma::{Mma, Operand, Product, tile_product, tile_sum};
use crate::hla::chunks::fused::kernel::{Gates, copy_in, gate_start, log_decay};

/// Shared floats of [`output_tiles_kernel`]: `Q` and `M` of a chunk.
pub(crate) fn tiles_shared(c: usize, d: usize) -> usize {
    c * d + c * c
}

/// Whether a chunk of `c` tokens with `d`-wide queries and `dv`-wide values tiles into
/// `mma`'s fragments.
pub(crate) fn tiles_fit(mma: &Mma, c: usize, d: usize, dv: usize) -> bool {
    let whole = |n: usize, by: usize| n > 0 && n.is_multiple_of(by);
    whole(c, mma.m) && whole(c, mma.n) && whole(c, mma.k) && whole(d, mma.k) && whole(dv, mma.n)
}

/// `M = D^p ⊙ (Q Rᵀ)` (written when `scores`) and `Y = diag(a^p) Q X + M V` of every
/// chunk with `p = power` (`X` read from its transpose when `transposed`), one cube per
/// block, its planes taking tiles in turn.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn output_tiles_kernel(
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
    #[comptime] mma: Mma,
) {
    let block = CUBE_POS;
    // A grid spread over its axes may hold a few more cubes than blocks.
    if block * c * d >= q.len() {
        terminate!();
    }
    // A fragment's load and store take 32-byte aligned addresses (WMMA's 256 bits); every
    // tile starts a multiple of 8 floats in.
    let mut qs = Shared::<[f32]>::new_aligned_slice(comptime!(c * d), 32usize);
    let mut ms = Shared::<[f32]>::new_aligned_slice(comptime!(c * c), 32usize);
    let gate = gate_start(block, gates, c);
    copy_in(q, &mut qs, block * c * d, c * d);
    let planes = CUBE_DIM as usize / mma.plane;
    let plane = UNIT_POS as usize / mma.plane;

    // S = Q Rᵀ, Rᵀ read by columns from R's rows; tiles above the diagonal are masked.
    let row_tiles = comptime!(c / mma.m);
    let col_tiles = comptime!(c / mma.n);
    let mut t = plane;
    while t < row_tiles * col_tiles {
        let (i, j) = (t / col_tiles, t % col_tiles);
        if j * mma.n < (i + 1) * mma.m {
            let r_j = &r[(block * c + j * mma.n) * d..];
            let s_ij = Product::new(
                Operand::rows(&qs[i * mma.m * d..], d),
                Operand::cols(r_j, d),
                d,
            );
            let out = &mut ms[i * mma.m * c + j * mma.n..];
            tile_product(s_ij, out, c, mma);
        }
        t += planes;
    }
    sync_cube();
    mask_and_scale(
        b, gate, &mut qs, &mut ms, m, block, power, c, d, decayed, scores,
    );

    // Y = diag(a^p) Q X + M V; M's rows of a tile reach its own last token only.
    let col_tiles = comptime!(dv / mma.n);
    let mut t = plane;
    while t < row_tiles * col_tiles {
        let (i, j) = (t / col_tiles, t % col_tiles);
        // X [d, dv] by rows, or when transposed by columns: Xᵀ's rows.
        let x_stride = comptime!(if transposed { d } else { dv });
        let x_j = block * d * dv + j * mma.n * comptime!(if transposed { d } else { 1 });
        let x_j = Operand::new(&x[x_j..], x_stride, transposed);
        let q_x = Product::new(Operand::rows(&qs[i * mma.m * d..], d), x_j, d);
        let v_j = Operand::rows(&v[block * c * dv + j * mma.n..], dv);
        let m_v = Product::new(Operand::rows(&ms[i * mma.m * c..], c), v_j, (i + 1) * mma.m);
        let out = &mut y[(block * c + i * mma.m) * dv + j * mma.n..];
        tile_sum(q_x, m_v, out, dv, mma);
        t += planes;
    }
}

/// In shared memory, `M = D^p ⊙ S` (written to `m` when `scores`) and `diag(a^p) Q`,
/// then a barrier.
#[cube]
#[allow(clippy::too_many_arguments)]
fn mask_and_scale(
    b: &Tensor<f32>,
    gate: usize,
    qs: &mut Shared<[f32]>,
    ms: &mut Shared<[f32]>,
    m: &mut Tensor<f32>,
    block: usize,
    power: f32,
    #[comptime] c: usize,
    #[comptime] d: usize,
    #[comptime] decayed: bool,
    #[comptime] scores: bool,
) {
    mask_in_place(b, gate, ms, power, c, decayed);
    if scores {
        // Each unit reads back the values it masked.
        let mut at = UNIT_POS as usize;
        while at < c * c {
            m[block * c * c + at] = ms[at];
            at += CUBE_DIM as usize;
        }
    }
    scale_in_place(b, gate, qs, power, c, d, decayed, false);
    sync_cube();
}

/// `D^p ⊙ S` in place of `S [c, c]` in shared memory (zero above the diagonal), every
/// unit taking every `CUBE_DIM`-th value.
#[cube]
pub(crate) fn mask_in_place(
    b: &Tensor<f32>,
    gate: usize,
    s: &mut Shared<[f32]>,
    power: f32,
    #[comptime] c: usize,
    #[comptime] decayed: bool,
) {
    let mut at = UNIT_POS as usize;
    while at < c * c {
        let (tau, sigma) = (at / c, at % c);
        let mut value = 0.0f32;
        if sigma <= tau {
            let b_tau = log_decay(b, gate, tau, decayed);
            let b_sigma = log_decay(b, gate, sigma, decayed);
            value = (power * (b_tau - b_sigma)).exp() * s[at];
        }
        s[at] = value;
        at += CUBE_DIM as usize;
    }
}

/// Row `τ` of `x [c, width]` in shared memory times `a^p_τ`, or `e^p_τ` when
/// `until_end`, every unit taking every `CUBE_DIM`-th value.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn scale_in_place(
    b: &Tensor<f32>,
    gate: usize,
    x: &mut Shared<[f32]>,
    power: f32,
    #[comptime] c: usize,
    #[comptime] width: usize,
    #[comptime] decayed: bool,
    #[comptime] until_end: bool,
) {
    let mut from = 0.0f32;
    if until_end {
        from = log_decay(b, gate, c - 1, decayed);
    }
    let mut at = UNIT_POS as usize;
    while at < c * width {
        let b_tau = log_decay(b, gate, at / width, decayed);
        let mut log = b_tau;
        if until_end {
            log = from - b_tau;
        }
        x[at] *= (power * log).exp();
        at += CUBE_DIM as usize;
    }
}

#[cfg(all(test, feature = "wgpu"))]
mod tests {
    use burn::backend::Dispatch;
    use burn::prelude::*;
    use burn::tensor::Distribution;

    use crate::agreement::relative_rms_error;
    use crate::backend::{TensorCores, set_tensor_cores};
    use crate::hla::chunks::Chunks;
    use crate::hla::chunks::fused::{ChunkOutput, Output, blocks, gates_layout};

    /// The tiles (emulated on lavapipe) against the register-tile kernel: two row tiles a
    /// chunk (a tile above the diagonal skipped, `M V` cut at each tile's last token), two
    /// column tiles of `Y`, `X` by rows and by columns (not symmetric, so the layouts
    /// differ), `M` written and not, without decay, with gates per token (p = 2) and with
    /// a per-head decay (p = 3).
    #[test]
    fn the_tiles_are_the_register_kernels_output() {
        let (device, _bounds) = crate::testing::guarded_wgpu();
        let (bs, h, time, c, d, dv) = (2, 3, 50, 32, 16, 32);
        let chunks = Chunks::new(time, c);
        let normal = Distribution::Normal(0.0, 1.0);
        let uniform = Distribution::Uniform(-0.3, 0.0);
        let random = |shape: [usize; 4]| Tensor::<4>::random(shape, normal, &device);
        let [q, r] = [0, 1].map(|_| chunks.split(random([bs, h, time, d])));
        let v = chunks.split(random([bs, h, time, dv]));
        let n = q.dims()[2];
        let per_token = Tensor::<3>::random([bs, h, time], uniform, &device);
        let per_head = Tensor::<3>::random([1, h, 1], uniform, &device).expand([1, h, time]);
        for (log_g, power) in [(None, 1), (Some(per_token), 2), (Some(per_head), 3)] {
            let decay = chunks.decay(log_g.as_ref());
            for (scores, transposed) in [(true, false), (false, true), (true, true)] {
                let x = match transposed {
                    false => Tensor::<5>::random([bs, h, n, d, dv], normal, &device),
                    true => Tensor::<5>::random([bs, h, n, dv, d], normal, &device),
                };
                // The kernels themselves: the process-wide switch that routes the forms to
                // them stays as the other tests expect it.
                let run = |tiles: bool| {
                    let (layout, b) = gates_layout(&q, &decay);
                    let call = Output {
                        layout,
                        power,
                        scores,
                        transposed,
                    };
                    let [q, r, v, x] = [&q, &r, &v, &x].map(|t| blocks(t).into_dispatch());
                    let cores = match tiles {
                        true => TensorCores::Emulated,
                        false => TensorCores::Off,
                    };
                    set_tensor_cores(cores);
                    let (m, y) = <Dispatch as ChunkOutput>::chunk_output(
                        q,
                        r,
                        v,
                        x,
                        b.into_dispatch(),
                        call,
                    );
                    let out = [m, y].map(Tensor::<3>::from_dispatch);
                    // Fusion runs the custom op when its queue flushes.
                    device.sync().expect("the device runs the kernel");
                    set_tensor_cores(TensorCores::default());
                    out
                };
                let ([m, y], [want_m, want_y]) = (run(true), run(false));
                let mut errors = vec![relative_rms_error(y, want_y)];
                if scores {
                    errors.push(relative_rms_error(m, want_m));
                }
                assert!(
                    errors.iter().all(|e| *e < 1e-5),
                    "power {power}, scores {scores}, transposed {transposed}: {errors:?}"
                );
            }
        }
    }
}
