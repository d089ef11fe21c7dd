//! The scan that carries a state from chunk to chunk, forward and back
//! ([`super::Chunks::scan`], [`super::Chunks::scan_back`]): composed of Burn's ops, or as
//! one kernel on a GPU device ([`super::gpu`]) where no gradient is tracked.

use burn::prelude::*;

use super::pad_end;
use crate::hla::decay::{Decay, decay_between, mask_from};

/// [`super::Chunks::scan`] with the decay inside the chunks and its power `p` (the chunks'
/// log decay `log ρ^p` is `p` times the last cumulative log gate of each chunk).
pub(super) fn scan(
    initial: Option<Tensor<4>>,
    deltas: Tensor<5>,
    decay: &Decay<5>,
    p: u32,
) -> (Tensor<5>, Tensor<4>) {
    along_chunks(
        initial,
        deltas,
        (decay, p),
        false,
        |initial, deltas, log_rho| {
            match log_rho {
                None => {
                    // X_n = X_0 + Σ_{m<n} Δ_m; slicing a shifted cumsum would cost a full-size
                    // gradient buffer per slice.
                    let last = initial.clone() + deltas.clone().sum_dim(2).squeeze_dim(2);
                    let starts = deltas.clone().cumsum(2) - deltas + initial.unsqueeze_dim(2);
                    (starts, last)
                }
                Some(log_rho) => decayed_scan(initial, deltas, log_rho),
            }
        },
    )
}

/// [`super::Chunks::scan_back`] with the decay (as [`scan`]). `∂X_n = Σ_{m≥n}
/// (Π_{n≤l<m} ρ_l) y_m` over `y = [δ_0, …, δ_{N−1}, ∂X_N]`: the transpose of the forward
/// scan's mask. Past two blocks' worth of chunks, the forward scan runs on the chunks in
/// reverse (a flip costs a copy, which the shorter paths avoid).
pub(super) fn scan_back(
    last: Option<Tensor<4>>,
    deltas: Tensor<5>,
    decay: &Decay<5>,
    p: u32,
) -> (Tensor<5>, Tensor<4>) {
    along_chunks(last, deltas, (decay, p), true, |last, deltas, log_rho| {
        let n = deltas.dims()[2];
        match log_rho {
            None => {
                // ∂X_{n+1} = ∂X_N + Σ_{m>n} δ_m.
                let total = deltas.clone().sum_dim(2);
                let first = last.clone() + total.clone().squeeze_dim(2);
                (total - deltas.cumsum(2) + last.unsqueeze_dim(2), first)
            }
            Some(log_rho) if n <= 2 * SCAN_BLOCK => {
                let mask = scan_mask(log_rho).transpose();
                let y = Tensor::cat(vec![deltas, last.unsqueeze_dim(2)], 2);
                let after = mask.clone().narrow(2, 1, n).matmul(y.clone());
                (after, mask.narrow(2, 0, 1).matmul(y).squeeze_dim(2))
            }
            Some(log_rho) => {
                let (after, first) = decayed_scan(last, deltas.flip([2]), log_rho.flip([2]));
                (after.flip([2]), first)
            }
        }
    })
}

/// What both scans share: a state `x [b, h, rows, cols]` (zeros when `None`) and `deltas
/// [b, h, n, rows, cols]`, scanned by the GPU kernel where it applies ([`on_gpu`], back
/// when `reverse`; it reads the chunks' decay from the cumulative log gates, and `x` in
/// whatever layout it comes, such as a part of a packed state, or starts from zeros
/// without a tensor of them) and by `composed` elsewhere, on `x` and `deltas` flattened to
/// `[b, h, rows·cols]` and `[b, h, n, rows·cols]` with `log ρ^p [gb, gh, n, 1]`.
fn along_chunks(
    x: Option<Tensor<4>>,
    deltas: Tensor<5>,
    (decay, p): (&Decay<5>, u32),
    reverse: bool,
    composed: impl FnOnce(Tensor<3>, Tensor<4>, Option<Tensor<4>>) -> (Tensor<4>, Tensor<3>),
) -> (Tensor<5>, Tensor<4>) {
    #[cfg(gpu_kernels)]
    if let Some(scanned) = on_gpu(x.as_ref(), &deltas, decay.log_decay().as_ref(), p, reverse) {
        return scanned;
    }
    #[cfg(not(gpu_kernels))]
    let _ = reverse;
    let [b, h, n, rows, cols] = deltas.dims();
    let x = x.unwrap_or_else(|| Tensor::zeros([b, h, rows, cols], &deltas.device()));
    let log_rho = decay.log_rho(f64::from(p)).map(|r| {
        let [gb, gh, ..] = r.dims();
        r.reshape([gb, gh, n, 1])
    });
    let (states, end) = composed(
        x.reshape([b, h, rows * cols]),
        deltas.reshape([b, h, n, rows * cols]),
        log_rho,
    );
    (
        states.reshape([b, h, n, rows, cols]),
        end.reshape([b, h, rows, cols]),
    )
}

/// The scan of `x [b, h, rows, cols]` over `deltas [b, h, n, rows, cols]` with the
/// cumulative log gates `b [gb, gh, n, c, 1]` and the decay's power `p` as one GPU kernel
/// ([`super::gpu`]), forward or back, where it applies: f32 on a CubeCL device that no
/// gradient tracks, with the GPU kernels or the nodes on, and buffers the kernel can
/// index; `None` elsewhere (the composed scan runs).
#[cfg(gpu_kernels)]
fn on_gpu(
    x: Option<&Tensor<4>>,
    deltas: &Tensor<5>,
    b: Option<&Tensor<5>>,
    p: u32,
    reverse: bool,
) -> Option<(Tensor<5>, Tensor<4>)> {
    use crate::backend::takes_gpu_step;
    let applies = x.is_none_or(takes_gpu_step)
        && takes_gpu_step(deltas)
        && b.is_none_or(takes_gpu_step)
        && crate::backend::gpu::fits(&deltas.device(), [deltas.shape().num_elements()]);
    applies.then(|| gpu_scan(x, deltas, b, p, reverse))
}

/// [`on_gpu`]'s kernel call, wherever the tensors are on a CubeCL device.
#[cfg(gpu_kernels)]
fn gpu_scan(
    x: Option<&Tensor<4>>,
    deltas: &Tensor<5>,
    gates: Option<&Tensor<5>>,
    power: u32,
    reverse: bool,
) -> (Tensor<5>, Tensor<4>) {
    use super::gpu::{Scan, ScanKernels};
    use burn::backend::Dispatch;
    let [b, h, n, rows, cols] = deltas.dims();
    let [gb, gh] = gates.map_or([1, 1], |g| [g.dims()[0], g.dims()[1]]);
    let scan = Scan {
        heads: h,
        gates: [gb, gh],
        decayed: gates.is_some(),
        power,
        reverse,
        zero_start: x.is_none(),
        end: [b, h, rows, cols],
    };
    // The kernel reads no gates without decay, and no start state from zeros: the updates
    // stand in.
    let flat = deltas.clone().reshape([b * h, n, rows * cols]);
    let gates = gates.map_or_else(
        || flat.clone().reshape([b * h, n * rows * cols]),
        |g| {
            let c = g.dims()[3];
            g.clone().reshape([gb * gh, n * c])
        },
    );
    let start = x.map_or_else(
        || flat.clone().into_dispatch(),
        |x| x.clone().into_dispatch(),
    );
    let (states, end) = <Dispatch as ScanKernels>::chunk_scan(
        start,
        flat.into_dispatch(),
        gates.into_dispatch(),
        scan,
    );
    (
        Tensor::<3>::from_dispatch(states).reshape([b, h, n, rows, cols]),
        Tensor::<4>::from_dispatch(end),
    )
}

/// Chunks per block of [`decayed_scan`]: its matmuls cost `SCAN_BLOCK` per chunk, column
/// and level, and each level leaves a block total per block to the next. Up to two blocks'
/// worth, one mask over all chunks is cheaper than the extra elementwise passes.
const SCAN_BLOCK: usize = 16;

/// `X_{n+1} = ρ_n X_n + Δ_n` for `initial X_0 [b, h, cols]`, `deltas Δ [b, h, n, cols]` and
/// `log ρ [b or 1, h or 1, n, 1]`: returns `X_0 … X_{n−1}` `[b, h, n, cols]` and `X_n`
/// `[b, h, cols]`, with `X_n = Σ_{m<n} (Π_{m<l<n} ρ_l) Δ_m + (Π_{l<n} ρ_l) X_0`.
///
/// A few chunks take one matmul with the decay mask over `[X_0, Δ_0, …]`. More are cut into
/// blocks: one batched matmul takes each block's total update, the states at the blocks'
/// starts come from the same function applied to the totals, and a second batched matmul
/// gives every state from its block's start state and the updates before it in the block.
/// The work is linear in `n` where one mask over all chunks would be quadratic, and no
/// large tensor is sliced (a slice's gradient is a full-size buffer).
fn decayed_scan(
    initial: Tensor<3>,
    deltas: Tensor<4>,
    log_rho: Tensor<4>,
) -> (Tensor<4>, Tensor<3>) {
    let [b, h, n, cols] = deltas.dims();
    let [gb, gh, ..] = log_rho.dims();
    if n <= 2 * SCAN_BLOCK {
        // Row τ of the mask gives X_τ: element 0 is X_0, element m + 1 is Δ_m.
        let mask = scan_mask(log_rho);
        let x = Tensor::cat(vec![initial.unsqueeze_dim(2), deltas], 2);
        let starts = mask.clone().narrow(2, 0, n).matmul(x.clone());
        let last = mask.narrow(2, n, 1).matmul(x).squeeze_dim(2);
        return (starts, last);
    }
    let blocks = n.div_ceil(SCAN_BLOCK);
    let len = blocks * SCAN_BLOCK;
    // Padding: zero updates without decay after the last chunk, so X_n is unchanged.
    let deltas = pad_end(deltas, 2, len).reshape([b, h, blocks, SCAN_BLOCK, cols]);
    let log_rho = pad_end(log_rho, 2, len).reshape([gb, gh, blocks, SCAN_BLOCK, 1]);
    // Log decay from the block's start through ρ_i (`through`), and up to X_i (`before`).
    let through = log_rho.clone().cumsum(3);
    let before = through.clone() - log_rho;
    let whole = through.clone().narrow(3, SCAN_BLOCK - 1, 1);
    let to_end = (whole.clone() - through.clone()).exp().swap_dims(3, 4);
    let totals = to_end.matmul(deltas.clone()).reshape([b, h, blocks, cols]);
    let (block_starts, last) = decayed_scan(initial, totals, whole.reshape([gb, gh, blocks, 1]));
    // X_i inside a block: its start state decayed by exp(before_i), and every Δ_j (j < i)
    // by exp(before_i − through_j); one matmul with the start state as a column in front.
    let mask = Tensor::cat(
        vec![before.clone().exp(), decay_between(before, through, -1)],
        4,
    );
    let carried = Tensor::cat(vec![block_starts.unsqueeze_dim(3), deltas], 3);
    let starts = mask.matmul(carried).reshape([b, h, len, cols]);
    let starts = if len == n {
        starts
    } else {
        starts.narrow(2, 0, n)
    };
    (starts, last)
}

/// The one-matmul scan's mask over `[X_0, Δ_0, …, Δ_{n−1}]`, `[gb, gh, n + 1, n + 1]`,
/// from `log ρ [gb, gh, n, 1]`: entry `(τ, σ)` is the decay from element `σ` to `X_τ`,
/// `Π_{σ≤l<τ} ρ_l` (the scan back uses its transpose).
fn scan_mask(log_rho: Tensor<4>) -> Tensor<4> {
    let [gb, gh, ..] = log_rho.dims();
    let none = Tensor::zeros([gb, gh, 1, 1], &log_rho.device());
    mask_from(Tensor::cat(vec![none, log_rho], 2).cumsum(2))
}

/// The serial recurrence `X_{m+1} = ρ_m X_m + Δ_m` on host values, the scans' oracle:
/// `x0 [seqs, cols]`, `deltas [seqs, n, cols]`, `log ρ [rows, n]` with `gate(seq)` the
/// row of a sequence, run back from the last chunk when `reverse`. Returns the state
/// every chunk starts from (back: the state after it) and the end state.
#[cfg(all(test, any(feature = "ndarray", feature = "wgpu")))]
fn recurrence(
    [x0, deltas, log_rho]: [&[f32]; 3],
    [n, cols]: [usize; 2],
    gate: impl Fn(usize) -> usize,
    reverse: bool,
) -> (Vec<f32>, Vec<f32>) {
    let (mut states, mut end) = (vec![0.0; deltas.len()], vec![0.0; x0.len()]);
    for seq in 0..x0.len() / cols {
        for c in 0..cols {
            let mut x = x0[seq * cols + c];
            for i in 0..n {
                let m = if reverse { n - 1 - i } else { i };
                let at = (seq * n + m) * cols + c;
                states[at] = x;
                x = log_rho[gate(seq) * n + m].exp() * x + deltas[at];
            }
            end[seq * cols + c] = x;
        }
    }
    (states, end)
}

#[cfg(all(test, feature = "ndarray"))]
mod tests {
    use burn::tensor::{Distribution, TensorData};

    use super::*;
    use crate::agreement::relative_rms_error;

    /// The scan against the serial recurrence `X_{n+1} = ρ_n X_n + Δ_n`: one mask (1, 32
    /// chunks), blocks with a ragged last one (33), two levels without padding (512) and
    /// three levels (600).
    #[test]
    fn decayed_scan_is_the_recurrence() {
        #[allow(deprecated)]
        let device = Device::ndarray();
        let (b, cols) = (2, 3);
        let host = |t: Tensor<4>| t.into_data().try_to_vec::<f32>().unwrap();
        for n in [1, 2 * SCAN_BLOCK, 2 * SCAN_BLOCK + 1, 512, 600] {
            let normal = Distribution::Normal(0.0, 1.0);
            let initial = Tensor::<4>::random([b, 1, 1, cols], normal, &device);
            let deltas = Tensor::<4>::random([b, 1, n, cols], normal, &device);
            let log_rho =
                Tensor::<4>::random([1, 1, n, 1], Distribution::Uniform(-1.0, 0.0), &device);
            let (starts, last) = decayed_scan(
                initial.clone().squeeze_dim(2),
                deltas.clone(),
                log_rho.clone(),
            );
            let (x0, d, l) = (host(initial), host(deltas), host(log_rho));
            let (want_starts, want_last) = recurrence([&x0, &d, &l], [n, cols], |_| 0, false);
            let want = |v: Vec<f32>, shape: [usize; 4]| {
                Tensor::<4>::from_data(TensorData::new(v, shape), &device)
            };
            let errors = [
                relative_rms_error(starts, want(want_starts, [b, 1, n, cols])),
                relative_rms_error(last.unsqueeze_dim(2), want(want_last, [b, 1, 1, cols])),
            ];
            assert!(
                errors.iter().all(|e| *e < 1e-5),
                "n = {n}: relative RMS errors {errors:?}"
            );
        }
    }
}

#[cfg(all(test, feature = "wgpu"))]
mod gpu_tests {
    use burn::tensor::{Distribution, TensorData};

    use super::*;
    use crate::agreement::relative_rms_error;

    /// The scan kernel against the recurrence, forward and back, over 1, 3 and 40 chunks of
    /// 4 tokens with the decay's power 2 (`log ρ = 2 b_last`): without decay, and with
    /// gates per sequence and head, shared by the batch, and shared by the heads; from a
    /// start state and from zeros.
    #[test]
    fn the_gpu_scan_is_the_recurrence() {
        let (device, _bounds) = crate::testing::guarded_wgpu();
        let (b, h, cols, c, p) = (2, 3, 5, 4, 2);
        let normal = Distribution::Normal(0.0, 1.0);
        for n in [1, 3, 40] {
            for gates in [None, Some([b, h]), Some([1, h]), Some([b, 1])] {
                for (reverse, zero) in [(false, false), (true, false), (false, true), (true, true)]
                {
                    // The state a transposed view (as a part of a packed state is a
                    // view): the kernel reads it through its strides.
                    let x0 = match zero {
                        false => Tensor::<4>::random([b, h, cols, 1], normal, &device),
                        true => Tensor::zeros([b, h, cols, 1], &device),
                    }
                    .swap_dims(2, 3);
                    let deltas = Tensor::<5>::random([b, h, n, 1, cols], normal, &device);
                    let cumulative = gates.map(|[gb, gh]| {
                        let uniform = Distribution::Uniform(-0.5, 0.0);
                        Tensor::<5>::random([gb, gh, n, c, 1], uniform, &device).cumsum(3)
                    });
                    let (states, end) = gpu_scan(
                        (!zero).then_some(&x0),
                        &deltas,
                        cumulative.as_ref(),
                        p,
                        reverse,
                    );
                    let states = states.squeeze_dim(3);
                    let [gb, gh] = gates.unwrap_or([1, 1]);
                    let host = |t: Tensor<4>| t.into_data().try_to_vec::<f32>().unwrap();
                    let l = cumulative.map_or(vec![0.0; n], |g| {
                        host(g.narrow(3, c - 1, 1).squeeze_dim(4) * f64::from(p))
                    });
                    let gate = |seq: usize| {
                        let row = if gb > 1 { (seq / h) * gh } else { 0 };
                        row + if gh > 1 { seq % h } else { 0 }
                    };
                    let (want_states, want_end) = recurrence(
                        [&host(x0), &host(deltas.squeeze_dim(3)), &l],
                        [n, cols],
                        gate,
                        reverse,
                    );
                    let want = |v: Vec<f32>, shape: [usize; 4]| {
                        Tensor::<4>::from_data(TensorData::new(v, shape), &device)
                    };
                    let errors = [
                        relative_rms_error(states, want(want_states, [b, h, n, cols])),
                        relative_rms_error(end, want(want_end, [b, h, 1, cols])),
                    ];
                    assert!(
                        errors.iter().all(|e| *e < 1e-5),
                        "n {n}, gates {gates:?}, reverse {reverse}, zero start {zero}: relative RMS {errors:?}"
                    );
                }
            }
        }
    }
}
