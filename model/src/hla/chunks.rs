//! The layout shared by the chunk-parallel forms: a sequence `[batch, heads, time, n]` as
//! `[batch, heads, chunks, chunk, n]`, so the work inside every chunk is one batched
//! matmul over all chunks, and the scan that carries a state from chunk to chunk.
//!
//! The last chunk is padded at the end with zero queries, keys and values and with gates
//! of 1: padded keys add nothing to any state and padded gates decay nothing, so the
//! final state is the state after the last real token.

use burn::prelude::*;

use super::HlaInput;
use super::decay::{Decay, mask_from};

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
    /// given every chunk's contribution `deltas [b, h, chunks, rows, cols]`.
    ///
    /// With `Δ_{−1} = X_0`, `X_{n+1} = Σ_{m≤n} (Π_{m<l≤n} ρ_l^p) Δ_m`: a cumulative sum
    /// along the chunk axis (decayed with gates, [`decayed_cumsum`]) instead of a loop
    /// over chunks.
    pub(crate) fn scan(
        &self,
        initial: Tensor<4>,
        deltas: Tensor<5>,
        decay: &Decay<5>,
        p: f64,
    ) -> (Tensor<5>, Tensor<4>) {
        // Element 0 is X_0 itself; element n + 1 becomes X_{n+1}.
        let x = Tensor::cat(vec![initial.unsqueeze_dim(2), deltas], 2);
        let x = match decay.log_rho(p) {
            None => x.cumsum(2),
            Some(log_rho) => {
                let [b, h, n, rows, cols] = x.dims();
                let [gb, gh, ..] = log_rho.dims();
                // No decay into element 0, the initial state.
                let none = Tensor::zeros([gb, gh, 1], &log_rho.device());
                let log_rho = Tensor::cat(vec![none, log_rho.reshape([gb, gh, self.count])], 2);
                decayed_cumsum(x.reshape([b, h, n, rows * cols]), log_rho.unsqueeze_dim(3))
                    .reshape([b, h, n, rows, cols])
            }
        };
        let starts = x.clone().narrow(2, 0, self.count);
        let last = x.narrow(2, self.count, 1).squeeze_dim(2);
        (starts, last)
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

/// Elements per block of [`decayed_cumsum`]: its matmuls cost `n · SCAN_BLOCK` per column
/// and level, and each level leaves `n / SCAN_BLOCK` elements to the next. Up to two blocks'
/// worth, one mask over all elements is cheaper than the extra elementwise passes.
const SCAN_BLOCK: usize = 16;

/// `P_j = λ_j P_{j−1} + x_j` along dim 2 of `x [b, h, n, cols]` (`P_{−1} = 0`), from
/// `log λ [b or 1, h or 1, n, 1]`: `P_j = Σ_{m≤j} (Π_{m<l≤j} λ_l) x_m`.
///
/// For a few elements that is one matmul with the decay mask. Longer inputs are
/// cut into blocks: one batched matmul scans inside every block, the blocks' totals are
/// scanned by the same function, and each block then adds its predecessors' total decayed
/// to every element. The work is linear in `n` where one mask over all of it would be
/// quadratic.
fn decayed_cumsum(x: Tensor<4>, log_lambda: Tensor<4>) -> Tensor<4> {
    let [b, h, n, cols] = x.dims();
    if n <= 2 * SCAN_BLOCK {
        return mask_from(log_lambda.cumsum(2)).matmul(x);
    }
    let blocks = n.div_ceil(SCAN_BLOCK);
    let [gb, gh, ..] = log_lambda.dims();
    // Padding: zero elements without decay, after the last real one.
    let x = pad_end(x, 2, blocks * SCAN_BLOCK).reshape([b, h, blocks, SCAN_BLOCK, cols]);
    let log_lambda =
        pad_end(log_lambda, 2, blocks * SCAN_BLOCK).reshape([gb, gh, blocks, SCAN_BLOCK, 1]);
    // Decay from each block's start (its first element's λ included) to each element.
    let within = log_lambda.cumsum(3);
    let inside = mask_from(within.clone()).matmul(x);
    let last = SCAN_BLOCK - 1;
    let totals = inside
        .clone()
        .narrow(3, last, 1)
        .reshape([b, h, blocks, cols]);
    let whole = within
        .clone()
        .narrow(3, last, 1)
        .reshape([gb, gh, blocks, 1]);
    let ends = decayed_cumsum(totals, whole);
    let before = Tensor::cat(
        vec![
            Tensor::zeros([b, h, 1, cols], &ends.device()),
            ends.narrow(2, 0, blocks - 1),
        ],
        2,
    );
    let p = inside + within.exp() * before.unsqueeze_dim(3);
    let p = p.reshape([b, h, blocks * SCAN_BLOCK, cols]);
    if blocks * SCAN_BLOCK == n {
        p
    } else {
        p.narrow(2, 0, n)
    }
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
    use crate::compare::relative_rms_error;

    /// The blocked scan against the serial recurrence, at lengths of one block, one more
    /// than a block (ragged) and three levels of blocks.
    #[test]
    fn decayed_cumsum_is_the_recurrence() {
        #[allow(deprecated)]
        let device = Device::ndarray();
        let (b, cols) = (2, 3);
        for n in [1, 2 * SCAN_BLOCK, 2 * SCAN_BLOCK + 1, 600] {
            let x = Tensor::<4>::random([b, 1, n, cols], Distribution::Normal(0.0, 1.0), &device);
            let log_lambda =
                Tensor::<4>::random([1, 1, n, 1], Distribution::Uniform(-1.0, 0.0), &device);
            let got = decayed_cumsum(x.clone(), log_lambda.clone());
            let x = x.into_data().try_to_vec::<f32>().unwrap();
            let log_lambda = log_lambda.into_data().try_to_vec::<f32>().unwrap();
            let mut want = vec![0.0f32; x.len()];
            for batch in 0..b {
                let mut p = vec![0.0f32; cols];
                for (j, l) in log_lambda.iter().enumerate() {
                    for (c, p) in p.iter_mut().enumerate() {
                        let at = (batch * n + j) * cols + c;
                        *p = l.exp() * *p + x[at];
                        want[at] = *p;
                    }
                }
            }
            let want = Tensor::<4>::from_data(TensorData::new(want, [b, 1, n, cols]), &device);
            let error = relative_rms_error(got, want);
            assert!(error < 1e-5, "n = {n}: relative RMS error {error:e}");
        }
    }
}
