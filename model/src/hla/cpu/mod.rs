//! What the CPU kernels of the chunk-parallel forms of every order ([`super::first`], [`super::second`],
//! [`super::third`], [`super::ahla`]) share on CPU devices: when they run, the walk over
//! the chunks of every sequence and head, the state's layout, and the one packed output
//! that carries the outputs and the final state through autodiff.
//!
//! A CPU kernel walks the chunks of each sequence and head in order and carries the state
//! from one chunk to the next (the recurrence over chunks, docs/math.md §5), each chunk's products
//! being small matmuls; sequences and heads run in parallel. Its backward pass walks the
//! chunks back, from the states saved at every chunk start, and gives the log gates their
//! gradient when they need one (the data-dependent decay, [`decay::DecayGrads`]).

mod decay;
mod driver;
mod ops;

pub(crate) use decay::{
    ChunkDecay, DecayGrads, Decays, Power, apply_mask, hadamard, row_dots, scale, scale_rows,
    scaled_rows, symmetrized,
};
pub(crate) use driver::{CpuChunked, backward_head, each_head, forward_head};
pub(crate) use ops::HlaCpuOps;

use crate::backend::gemm::{Layout, matmul};

/// One order's CPU kernels, for the drivers here that are written once for every order
/// (each order's `cpu::KERNELS`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct HeadKernels {
    /// One sequence and head forward: `o`, the final state (holding the initial state on
    /// entry, the state's parts one after the other) and every chunk's start state into
    /// `starts`.
    pub(crate) forward: fn(&ChunkSizes, &HeadInput, &mut [f32], &mut [f32], &mut [f32]),
    /// One sequence and head backward, from `∂o` and the saved chunk start states.
    pub(crate) backward: fn(&ChunkSizes, &HeadInput, &[f32], &[f32], &mut Grads),
    /// One sequence and head by the serial recurrence, `(x, d, dv, state, o)`: the final
    /// state into `state` (the initial one on entry) and every token's output into `o` (no
    /// gradient).
    pub(crate) serial: fn(&HeadInput, usize, usize, &mut [f32], &mut [f32]),
    /// Floats of one head's state for `(d, dv)`.
    pub(crate) state_len: fn(usize, usize) -> usize,
}

/// `D ⊙ (Q Kᵀ)` of a chunk's `c` queries and keys (`c × c`, `mask` = `D`): the decayed
/// scores every order's chunk step starts from.
#[inline(always)]
pub(crate) fn decayed_scores(q: &[f32], k: &[f32], mask: &[f32], c: usize, d: usize) -> Vec<f32> {
    let mut w = vec![0.0; c * c];
    let (q, k) = ((q, Layout::rows(d)), (k, Layout::transposed(d)));
    matmul((c, c, d), &mut w, q, k, false);
    apply_mask(&mut w, mask);
    w
}

/// The inclusive per-token rows a chunk step carries from a start state `x` (`d × cols`,
/// read through `x`'s layout): `[Q X, diag(a) Q X + W Y]`, e.g. `A = diag(a) Q Sᵀ + W K`
/// (second and third order) and `B = diag(a) Q P + W V` (third order, AHLA), with `Q X`
/// before the decay for the gates' gradient.
#[inline(always)]
pub(crate) fn state_rows(
    q: &[f32],
    x: (&[f32], Layout),
    (w, y): (&[f32], &[f32]),
    a: &[f32],
    (c, d, cols): (usize, usize, usize),
) -> [Vec<f32>; 2] {
    let mut qx = vec![0.0; c * cols];
    matmul((c, cols, d), &mut qx, (q, Layout::rows(d)), x, false);
    let mut rows = scaled_rows(&qx, cols, a);
    matmul(
        (c, cols, c),
        &mut rows,
        (w, Layout::rows(c)),
        (y, Layout::rows(cols)),
        true,
    );
    [qx, rows]
}

/// `y = M x` for a row-major `M [rows, x.len()]`.
#[inline(always)]
pub(crate) fn mat_vec(m: &[f32], x: &[f32], y: &mut [f32]) {
    for (y, row) in y.iter_mut().zip(m.chunks_exact(x.len())) {
        *y = crate::backend::simd::dot(row, x);
    }
}

/// `y = xᵀ M` for a row-major `M [x.len(), y.len()]`.
#[inline(always)]
pub(crate) fn vec_mat(x: &[f32], m: &[f32], y: &mut [f32]) {
    y.fill(0.0);
    for (&x, row) in x.iter().zip(m.chunks_exact(y.len())) {
        y.iter_mut().zip(row).for_each(|(y, &m)| *y += x * m);
    }
}

/// One sequence and head's gradients: of q, k, v, of the state (the final state's on
/// entry, the initial state's on return) and, when asked for, of the log gates.
pub(crate) struct Grads<'a> {
    pub(crate) q: &'a mut [f32],
    pub(crate) k: &'a mut [f32],
    pub(crate) v: &'a mut [f32],
    pub(crate) state: &'a mut [f32],
    pub(crate) gates: Option<&'a mut [f32]>,
}

/// One sequence and head's inputs: `q`, `k` `[time, d]`, `v` `[time, dv]` row-major and
/// the log gates `[time]`.
pub(crate) struct HeadInput<'a> {
    pub(crate) q: &'a [f32],
    pub(crate) k: &'a [f32],
    pub(crate) v: &'a [f32],
    pub(crate) log_g: &'a [f32],
}

impl HeadInput<'_> {
    /// `q`, `k`, `v` of the `c` tokens from `c0`.
    #[inline(always)]
    pub(crate) fn chunk(
        &self,
        (c0, c): (usize, usize),
        d: usize,
        dv: usize,
    ) -> (&[f32], &[f32], &[f32]) {
        (
            &self.q[c0 * d..][..c * d],
            &self.k[c0 * d..][..c * d],
            &self.v[c0 * dv..][..c * dv],
        )
    }
}

/// The sizes of a CPU kernel call.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ChunkSizes {
    pub(crate) batch: usize,
    pub(crate) heads: usize,
    pub(crate) time: usize,
    pub(crate) d: usize,
    pub(crate) dv: usize,
    pub(crate) chunk: usize,
    /// Batch and heads of the gates (each 1 or the full size).
    pub(crate) gates: (usize, usize),
}

impl ChunkSizes {
    pub(crate) fn new(q: &[usize], v: &[usize], gates: &[usize], chunk: usize) -> Self {
        Self {
            batch: q[0],
            heads: q[1],
            time: q[2],
            d: q[3],
            dv: v[3],
            chunk,
            gates: (gates[0], gates[1]),
        }
    }

    /// Sequences × heads.
    pub(crate) fn sequences(&self) -> usize {
        self.batch * self.heads
    }

    pub(crate) fn chunks(&self) -> usize {
        self.time.div_ceil(self.chunk)
    }

    /// The log gates `[time]` of sequence-and-head `i` in `log_g [gb, gh, time]`.
    pub(crate) fn gates_of<'a>(&self, log_g: &'a [f32], i: usize) -> &'a [f32] {
        &log_g[self.gate_row(i) * self.time..][..self.time]
    }

    /// The row of `log_g [gb, gh, time]` that sequence-and-head `i` reads.
    pub(crate) fn gate_row(&self, i: usize) -> usize {
        let (b, h) = (i / self.heads, i % self.heads);
        let (gb, gh) = self.gates;
        (if gb > 1 { b } else { 0 }) * gh + if gh > 1 { h } else { 0 }
    }

    /// The gradient of `log_g [gb, gh, time]` from every sequence-and-head's, `[sequences,
    /// time]`: summed over the rows a head shares (gates broadcast over batch or heads).
    pub(crate) fn gate_sums(&self, per_head: &[f32]) -> Vec<f32> {
        let (gb, gh) = self.gates;
        let mut out = vec![0.0; gb * gh * self.time];
        for (i, grads) in per_head.chunks_exact(self.time).enumerate() {
            let row = &mut out[self.gate_row(i) * self.time..][..self.time];
            row.iter_mut().zip(grads).for_each(|(o, g)| *o += g);
        }
        out
    }

    /// The chunks of one sequence as `(first token, tokens)`.
    pub(crate) fn spans(&self) -> impl DoubleEndedIterator<Item = (usize, usize)> + use<> {
        let (time, chunk) = (self.time, self.chunk);
        (0..time.div_ceil(chunk)).map(move |n| (n * chunk, chunk.min(time - n * chunk)))
    }
}
