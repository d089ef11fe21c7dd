//! The layout shared by the chunk-parallel forms: a sequence `[batch, heads, time, n]` as
//! `[batch, heads, chunks, chunk, n]`, so the work inside every chunk is one batched
//! matmul over all chunks, and the scan that carries a state from chunk to chunk.
//!
//! The last chunk is padded at the end with zero queries, keys and values and with gates
//! of 1: padded keys add nothing to any state and padded gates decay nothing, so the
//! final state is the state after the last real token.

#[cfg(gpu_kernels)]
pub(crate) mod fused;
#[cfg(gpu_kernels)]
pub(crate) mod gates;
#[cfg(gpu_kernels)]
pub(crate) mod gpu;
mod scan;

use burn::prelude::*;

use super::HlaInput;
use super::decay::Decay;
use scan::{scan, scan_back};

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
        let decay = chunks.decay(input.log_g.as_ref());
        Self::with_decay(input, chunks, decay)
    }

    /// With the decay inside each chunk already made (by the forward pass, for the
    /// backward's).
    pub(crate) fn with_decay(input: &HlaInput, chunks: Chunks, decay: Decay<5>) -> Self {
        Self {
            decay,
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

    /// The decay inside each chunk, from `log_g [b or 1, h or 1, time]`: its cumulative log
    /// gates by one kernel on a GPU device where no gradient is tracked ([`gates`]).
    pub(crate) fn decay(&self, log_g: Option<&Tensor<3>>) -> Decay<5> {
        #[cfg(gpu_kernels)]
        if let Some(b) = log_g.and_then(|g| gates::cumulative(g, self.size)) {
            return Decay::from_cumulative(b);
        }
        Decay::from_log_gates(log_g.map(|g| self.gates(g)))
    }

    /// `log_g [b or 1, h or 1, time]` in chunks, `[.., chunks, chunk, 1]`, padded with 0
    /// (gates of 1).
    fn gates(&self, log_g: &Tensor<3>) -> Tensor<5> {
        let [b, h, _] = log_g.dims();
        self.pad(log_g.clone(), 2)
            .reshape([b, h, self.count, self.size, 1])
    }

    /// The states at the start of every chunk, `[b, h, chunks, rows, cols]`, and after the
    /// last one, `[b, h, rows, cols]`, of `X_{n+1} = ρ_n^p X_n + Δ_n` from `X_0 = initial`
    /// (zeros when `None`: the GPU kernel then reads none), given every chunk's
    /// contribution `deltas [b, h, chunks, rows, cols]`: a cumulative sum along the chunk
    /// axis (decayed with gates, [`decayed_scan`]) instead of a loop over chunks.
    pub(crate) fn scan(
        &self,
        initial: Option<Tensor<4>>,
        deltas: Tensor<5>,
        decay: &Decay<5>,
        p: u32,
    ) -> (Tensor<5>, Tensor<4>) {
        scan(initial, deltas, decay, p)
    }

    /// The states of `X ← ρ^p X + Kᵀ diag(e^p) U` over the chunks (`k [b, h, chunks, c,
    /// d]`, `u [.., c, n]`) from `initial` (zeros when `None`), as [`Chunks::scan`] gives
    /// them: every chunk's update and the scan, in one GPU kernel where it applies
    /// ([`fused::pass`]: the node's forward pass on a GPU device, no tensor of the updates
    /// between them), else the composed update and scan.
    pub(crate) fn pass(
        &self,
        initial: Option<Tensor<4>>,
        (k, u): (&Tensor<5>, &Tensor<5>),
        decay: &Decay<5>,
        p: u32,
    ) -> (Tensor<5>, Tensor<4>) {
        #[cfg(gpu_kernels)]
        if let Some(passed) = fused::pass::pass(initial.as_ref(), [k, u], (decay, p)) {
            return passed;
        }
        let updates = k
            .clone()
            .transpose()
            .matmul(decay.until_end(u.clone(), f64::from(p)));
        self.scan(initial, updates, decay, p)
    }

    /// The same scan run from the last chunk back, as a backward pass carries a state's
    /// gradient: with `∂X_N = last` (zeros when `None`: the final state has no gradient)
    /// and every chunk's direct contribution `deltas` to the gradient of its start state,
    /// `∂X_n = ρ_n^p ∂X_{n+1} + δ_n`. Returns the gradient of the state after every chunk,
    /// `∂X_{n+1}` `[b, h, chunks, rows, cols]`, and of the initial state, `∂X_0` `[b, h,
    /// rows, cols]`.
    pub(crate) fn scan_back(
        &self,
        last: Option<Tensor<4>>,
        deltas: Tensor<5>,
        decay: &Decay<5>,
        p: u32,
    ) -> (Tensor<5>, Tensor<4>) {
        scan_back(last, deltas, decay, p)
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

/// `M = D^p ⊙ (Q Rᵀ)` (when `scores`) and `Y = diag(a^p) Q X + M V` of every chunk, from
/// `[q, r, v, x]` (`x` the state at every chunk's start; `Xᵀ`, read where it lies, when
/// `transposed`) and `power = p`, by the GPU kernel ([`fused`]) where it applies (the
/// node's forward pass on a GPU device); `None` elsewhere (the composed steps run).
pub(crate) fn fused_output(
    qrvx: [&Tensor<5>; 4],
    decay: &Decay<5>,
    power: u32,
    (scores, transposed): (bool, bool),
) -> Option<(Option<Tensor<5>>, Tensor<5>)> {
    #[cfg(gpu_kernels)]
    return fused::output(qrvx, decay, power, (scores, transposed));
    #[cfg(not(gpu_kernels))]
    {
        let _ = (qrvx, decay, power, scores, transposed);
        None
    }
}

/// A state's `N` tensors, each `None` (zeros, which the scans need not read) without a
/// state.
///
/// # Panics
///
/// If the state has not `N` tensors: its order's layout says how many.
pub(crate) fn state_or_zeros<const N: usize>(
    state: Option<Vec<Tensor<4>>>,
) -> [Option<Tensor<4>>; N] {
    match state {
        None => std::array::from_fn(|_| None),
        Some(parts) => {
            let len = parts.len();
            <[Tensor<4>; N]>::try_from(parts)
                .unwrap_or_else(|_| unreachable!("{N} state tensors, got {len}"))
                .map(Some)
        }
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
