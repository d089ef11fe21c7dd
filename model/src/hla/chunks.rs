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
    /// With `Δ_{−1} = X_0`, `X_{n+1} = Σ_{m≤n} (Π_{m<l≤n} ρ_l^p) Δ_m`: the decay mask of
    /// the chunk axis applied by one matmul (a cumulative sum without gates), instead of a
    /// loop over chunks.
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
                let mask = chunk_axis_mask(log_rho);
                mask.matmul(x.reshape([b, h, n, rows * cols]))
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
        let missing = self.padding();
        if missing == 0 {
            return x;
        }
        let mut shape = x.dims();
        shape[dim] = missing;
        let zeros = Tensor::zeros(shape, &x.device());
        Tensor::cat(vec![x, zeros], dim)
    }
}

/// `D_{nm} = Π_{m<l≤n} ρ_l` over the chunk axis with one more element in front (no decay
/// into it), `[.., chunks + 1, chunks + 1]`, from `log_rho [.., chunks, 1, 1]`.
fn chunk_axis_mask(log_rho: Tensor<5>) -> Tensor<4> {
    let [b, h, n, _, _] = log_rho.dims();
    let none = Tensor::zeros([b, h, 1], &log_rho.device());
    let log_rho = Tensor::cat(vec![none, log_rho.reshape([b, h, n])], 2);
    mask_from(log_rho.cumsum(2).unsqueeze_dim(3))
}
