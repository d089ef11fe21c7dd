//! The layout shared by the chunk-parallel forms: a sequence `[batch, heads, time, n]` as
//! `[batch, heads, chunks, chunk, n]`, so the work inside every chunk is one batched
//! matmul over all chunks, and the scan that carries a state from chunk to chunk.
//!
//! The last chunk is padded at the end with zero queries, keys and values and with gates
//! of 1: padded keys add nothing to any state and padded gates decay nothing, so the
//! final state is the state after the last real token.

use burn::prelude::*;

use super::HlaInput;
use super::decay::{Decay, decay_between, mask_from};

/// An input laid out in chunks (`[b, h, chunks, chunk, n]`), with the decay inside each.
pub(crate) struct Chunked {
    pub(crate) chunks: Chunks,
    pub(crate) decay: Decay<5>,
    pub(crate) q: Tensor<5>,
    pub(crate) k: Tensor<5>,
    pub(crate) v: Tensor<5>,
}

impl Chunked {
    pub(crate) fn new(input: &HlaInput, chunk: usize) -> Self {
        let chunks = Chunks::new(input.time(), chunk);
        Self {
            decay: chunks.decay(input.log_g.as_ref()),
            q: chunks.split(input.q.clone()),
            k: chunks.split(input.k.clone()),
            v: chunks.split(input.v.clone()),
            chunks,
        }
    }
}

pub(crate) struct Chunks {
    time: usize,
    size: usize,
    count: usize,
}

impl Chunks {
    pub(crate) fn new(time: usize, size: usize) -> Self {
        assert!(size > 0, "the chunk size must be at least 1");
        assert!(time > 0, "a chunked call needs at least one token");
        Self {
            time,
            size,
            count: time.div_ceil(size),
        }
    }

    /// `[b, h, time, n]` → `[b, h, chunks, chunk, n]`.
    pub(crate) fn split(&self, x: Tensor<4>) -> Tensor<5> {
        let [b, h, _, n] = x.dims();
        self.pad(x, 2).reshape([b, h, self.count, self.size, n])
    }

    /// `[b, h, chunks, chunk, n]` → `[b, h, time, n]`.
    pub(crate) fn merge(&self, x: Tensor<5>) -> Tensor<4> {
        let [b, h, _, _, n] = x.dims();
        let x = x.reshape([b, h, self.count * self.size, n]);
        // Without padding, skip the narrow: its backward fills a full-size zero gradient.
        if self.padding() == 0 {
            x
        } else {
            x.narrow(2, 0, self.time)
        }
    }

    /// The decay inside each chunk, from `log_g [b or 1, h or 1, time]`.
    pub(crate) fn decay(&self, log_g: Option<&Tensor<3>>) -> Decay<5> {
        Decay::from_log_gates(log_g.map(|g| {
            let [b, h, _] = g.dims();
            self.pad(g.clone(), 2)
                .reshape([b, h, self.count, self.size, 1])
        }))
    }

    /// The states at the start of every chunk, `[b, h, chunks, rows, cols]`, and after the
    /// last one, `[b, h, rows, cols]`, of `X_{n+1} = ρ_n^p X_n + Δ_n` from `X_0 = initial`,
    /// given every chunk's contribution `deltas [b, h, chunks, rows, cols]`: a cumulative
    /// sum along the chunk axis (decayed with gates, [`decayed_scan`]) instead of a loop
    /// over chunks.
    pub(crate) fn scan(
        &self,
        initial: Tensor<4>,
        deltas: Tensor<5>,
        decay: &Decay<5>,
        p: f64,
    ) -> (Tensor<5>, Tensor<4>) {
        scan(initial, deltas, decay.log_rho(p))
    }

    /// The same scan run from the last chunk back, as a backward pass carries a state's
    /// gradient: with `∂X_N = last` and every chunk's direct contribution `deltas` to the
    /// gradient of its start state, `∂X_n = ρ_n^p ∂X_{n+1} + δ_n`. Returns the gradient of
    /// the state after every chunk, `∂X_{n+1}` `[b, h, chunks, rows, cols]`, and of the
    /// initial state, `∂X_0` `[b, h, rows, cols]`.
    pub(crate) fn scan_back(
        &self,
        last: Tensor<4>,
        deltas: Tensor<5>,
        decay: &Decay<5>,
        p: f64,
    ) -> (Tensor<5>, Tensor<4>) {
        scan_back(last, deltas, decay.log_rho(p))
    }

    /// Tokens of padding after the last real one.
    fn padding(&self) -> usize {
        self.count * self.size - self.time
    }

    /// Zero padding at the end of `dim` up to a whole number of chunks.
    fn pad<const D: usize>(&self, x: Tensor<D>, dim: usize) -> Tensor<D> {
        pad_end(x, dim, self.count * self.size)
    }
}

/// [`Chunks::scan`] with the chunks' log decay `log ρ^p [b or 1, h or 1, chunks, 1, 1]`
/// (`None`: no decay).
fn scan(
    initial: Tensor<4>,
    deltas: Tensor<5>,
    log_rho: Option<Tensor<5>>,
) -> (Tensor<5>, Tensor<4>) {
    let [b, h, n, rows, cols] = deltas.dims();
    let initial = initial.reshape([b, h, rows * cols]);
    let deltas = deltas.reshape([b, h, n, rows * cols]);
    let (starts, last) = match log_rho {
        None => {
            // X_n = X_0 + Σ_{m<n} Δ_m; slicing a shifted cumsum would cost a full-size
            // gradient buffer per slice.
            let last = initial.clone() + deltas.clone().sum_dim(2).squeeze_dim(2);
            let starts = deltas.clone().cumsum(2) - deltas + initial.unsqueeze_dim(2);
            (starts, last)
        }
        Some(log_rho) => {
            let [gb, gh, ..] = log_rho.dims();
            decayed_scan(initial, deltas, log_rho.reshape([gb, gh, n, 1]))
        }
    };
    (
        starts.reshape([b, h, n, rows, cols]),
        last.reshape([b, h, rows, cols]),
    )
}

/// [`Chunks::scan_back`] with the chunks' log decay (as [`scan`]). `∂X_n = Σ_{m≥n}
/// (Π_{n≤l<m} ρ_l) y_m` over `y = [δ_0, …, δ_{N−1}, ∂X_N]`: the transpose of the forward
/// scan's mask. Past two blocks' worth of chunks, the forward scan runs on the chunks in
/// reverse (a flip costs a copy, which the shorter paths avoid).
fn scan_back(
    last: Tensor<4>,
    deltas: Tensor<5>,
    log_rho: Option<Tensor<5>>,
) -> (Tensor<5>, Tensor<4>) {
    let [b, h, n, rows, cols] = deltas.dims();
    let last = last.reshape([b, h, rows * cols]);
    let deltas = deltas.reshape([b, h, n, rows * cols]);
    let (after, first) = match log_rho {
        None => {
            // ∂X_{n+1} = ∂X_N + Σ_{m>n} δ_m.
            let total = deltas.clone().sum_dim(2);
            let first = last.clone() + total.clone().squeeze_dim(2);
            (total - deltas.cumsum(2) + last.unsqueeze_dim(2), first)
        }
        Some(log_rho) if n <= 2 * SCAN_BLOCK => {
            let [gb, gh, ..] = log_rho.dims();
            let mask = scan_mask(log_rho.reshape([gb, gh, n, 1])).transpose();
            let y = Tensor::cat(vec![deltas, last.unsqueeze_dim(2)], 2);
            let after = mask.clone().narrow(2, 1, n).matmul(y.clone());
            (after, mask.narrow(2, 0, 1).matmul(y).squeeze_dim(2))
        }
        Some(log_rho) => {
            let [gb, gh, ..] = log_rho.dims();
            let log_rho = log_rho.reshape([gb, gh, n, 1]).flip([2]);
            let (after, first) = decayed_scan(last, deltas.flip([2]), log_rho);
            (after.flip([2]), first)
        }
    };
    (
        after.reshape([b, h, n, rows, cols]),
        first.reshape([b, h, rows, cols]),
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

/// Zero padding at the end of `dim` up to `len`.
fn pad_end<const D: usize>(x: Tensor<D>, dim: usize, len: usize) -> Tensor<D> {
    let mut shape = x.dims();
    let missing = len - shape[dim];
    if missing == 0 {
        return x;
    }
    shape[dim] = missing;
    let zeros = Tensor::zeros(shape, &x.device());
    Tensor::cat(vec![x, zeros], dim)
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
            let (mut want_starts, mut want_last) = (vec![0.0; b * n * cols], vec![0.0; b * cols]);
            for batch in 0..b {
                for c in 0..cols {
                    let mut x = x0[batch * cols + c];
                    for (m, l) in l.iter().enumerate() {
                        let at = (batch * n + m) * cols + c;
                        want_starts[at] = x;
                        x = l.exp() * x + d[at];
                    }
                    want_last[batch * cols + c] = x;
                }
            }
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
