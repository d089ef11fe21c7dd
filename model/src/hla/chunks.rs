//! The layout shared by the chunk-parallel forms: a sequence `[batch, heads, time, n]` as
//! `[batch, heads, chunks, chunk, n]`, so the work inside every chunk is one batched
//! matmul over all chunks, and the scan that carries a state from chunk to chunk.
//!
//! The last chunk is padded at the end with zero queries, keys and values and with gates
//! of 1: padded keys add nothing to any state and padded gates decay nothing, so the
//! final state is the state after the last real token.

use burn::prelude::*;

use super::decay::Decay;

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
        x.reshape([b, h, self.count * self.size, n])
            .narrow(2, 0, self.time)
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
    /// A scan in log₂(chunks) steps of whole-tensor operations (Hillis–Steele on the affine
    /// maps `X ↦ ρ_n^p X + Δ_n`): no per-chunk loop, and the backward pass stays as cheap.
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
            Some(log_rho) => affine_scan(x, log_rho),
        };
        let starts = x.clone().narrow(2, 0, self.count);
        let last = x.narrow(2, self.count, 1).squeeze_dim(2);
        (starts, last)
    }

    /// Zero padding at the end of `dim` up to a whole number of chunks.
    fn pad<const D: usize>(&self, x: Tensor<D>, dim: usize) -> Tensor<D> {
        let missing = self.count * self.size - self.time;
        if missing == 0 {
            return x;
        }
        let mut shape = x.dims();
        shape[dim] = missing;
        let zeros = Tensor::zeros(shape, &x.device());
        Tensor::cat(vec![x, zeros], dim)
    }
}

/// Inclusive scan `x_n ← ρ_n x_{n−1} + x_n` along dimension 2, with
/// `log_rho [.., len − 1, 1, 1]` the decay into every element after the first.
/// After the step with offset `s`, element `n` holds the composition of the maps of the
/// `2s` elements ending at `n`, applied to zero, and `log_a` their summed decay.
fn affine_scan(x: Tensor<5>, log_rho: Tensor<5>) -> Tensor<5> {
    let len = x.dims()[2];
    let mut log_a = shift(log_rho, 1, len);
    let mut x = x;
    let mut s = 1;
    while s < len {
        x = x.clone() + log_a.clone().exp() * shift(x, s, len);
        log_a = log_a.clone() + shift(log_a, s, len);
        s *= 2;
    }
    x
}

/// `y_n = x_{n−s}` for `n < len` along dimension 2, zero for `n < s`.
fn shift(x: Tensor<5>, s: usize, len: usize) -> Tensor<5> {
    let mut shape = x.dims();
    shape[2] = s;
    let zeros = Tensor::zeros(shape, &x.device());
    Tensor::cat(vec![zeros, x.narrow(2, 0, len - s)], 2)
}
