//! What the fused chunk-parallel forms of every order ([`super::first`], [`super::second`],
//! [`super::third`], [`super::ahla`]) share on CPU devices: when they run, the walk over
//! the chunks of every sequence and head, the state's layout, and the one packed output
//! that carries the outputs and the final state through autodiff.
//!
//! A fused form walks the chunks of each sequence and head in order and carries the state
//! from one chunk to the next (the recurrence over chunks, spec §5), each chunk's products
//! being small matmuls; sequences and heads run in parallel. Its backward pass walks the
//! chunks back, from the states saved at every chunk start, and gives the log gates their
//! gradient when they need one (the data-dependent decay, [`decay::DecayGrads`]).

mod decay;
mod op;
#[cfg(test)]
mod tests;

use burn::prelude::*;

use super::state::OrderState;
pub(crate) use super::state::{pack_state, state_len, state_parts, unpack_output, unpack_state};
use super::{HlaInput, HlaState, Order, ahla, first, second, third};
use crate::fused::gemm::{Layout, matmul};
pub(crate) use decay::{
    ChunkDecay, DecayGrads, Decays, Power, apply_mask, hadamard, row_dots, scale, scale_rows,
    scaled_rows,
};
pub(crate) use op::{Kernel, backward, forward};

/// Whether `input` takes a fused form: f32 on a CPU device and keys per head (not shared).
pub(crate) fn applies(input: &HlaInput) -> bool {
    crate::fused::applies(&input.q) && input.k.dims()[1] == input.q.dims()[1]
}

/// The fused form of an order's chunked form (`first::chunked`, …; same arguments and
/// results).
pub(crate) fn run<S: OrderState>(input: &HlaInput, state: S, chunk: usize) -> (Tensor<4>, S) {
    let tensors = state.into_state().tensors();
    let (o, parts) = chunked(S::ORDER, input, tensors, chunk);
    (o, S::from_state(HlaState::from_tensors(S::ORDER, parts)))
}

/// The fused form of `order`'s chunked form, from the state's tensors in the order of
/// [`super::HlaState::tensors`]: `o [batch, heads, time, dv]` and the final state's.
pub(crate) fn chunked(
    order: Order,
    input: &HlaInput,
    state: Vec<Tensor<4>>,
    chunk: usize,
) -> (Tensor<4>, Vec<Tensor<4>>) {
    use crate::fused::FusedOps;
    let log_g = input.gates_or_zeros();
    let kernel = Kernel {
        order,
        chunk,
        gates: log_g.is_tracked(),
    };
    let packed = <burn::backend::Dispatch as FusedOps>::hla_chunked(
        input.q.clone().into_dispatch(),
        input.k.clone().into_dispatch(),
        input.v.clone().into_dispatch(),
        log_g.into_dispatch(),
        pack_state(state).into_dispatch(),
        kernel,
    );
    unpack_output(Tensor::from_dispatch(packed), order, input)
}

/// The highest power of the decay `order`'s chunk step uses.
fn powers(order: Order) -> usize {
    match order {
        Order::First | Order::Asymmetric => 1,
        Order::Second => 2,
        Order::Third => 3,
    }
}

/// Decays for the chunks of `order`.
pub(crate) fn decays(order: Order) -> Decays {
    Decays::new(powers(order))
}

/// One sequence and head forward of `order`: `o`, the final state (holding the initial
/// state on entry, [`state_parts`] one after the other) and every chunk's start state into
/// `starts`.
pub(crate) fn forward_head(
    order: Order,
    n: &Sizes,
    x: &Head,
    state: &mut [f32],
    o: &mut [f32],
    starts: &mut [f32],
) {
    match order {
        Order::First => first::fused::forward_head(n, x, state, o, starts),
        Order::Second => second::fused::forward_head(n, x, state, o, starts),
        Order::Third => third::fused::forward_head(n, x, state, o, starts),
        Order::Asymmetric => ahla::fused::forward_head(n, x, state, o, starts),
    }
}

/// One sequence and head backward of `order`, from `∂o` (`g`) and the saved chunk start
/// states.
pub(crate) fn backward_head(
    order: Order,
    n: &Sizes,
    x: &Head,
    starts: &[f32],
    g: &[f32],
    out: &mut Grads,
) {
    match order {
        Order::First => first::fused::backward_head(n, x, starts, g, out),
        Order::Second => second::fused::backward_head(n, x, starts, g, out),
        Order::Third => third::fused::backward_head(n, x, starts, g, out),
        Order::Asymmetric => ahla::fused::backward_head(n, x, starts, g, out),
    }
}

/// One sequence and head of `order` by its serial recurrence, fused (the `fused_head` of
/// each order's `recurrent`): the final state into `state` (the initial one on entry) and
/// every token's output into `o` (no gradient).
pub(crate) fn serial_head(order: Order, n: &Sizes, x: &Head, state: &mut [f32], o: &mut [f32]) {
    let (d, dv) = (n.d, n.dv);
    match order {
        Order::First => first::recurrent::fused_head(x, d, dv, state, o),
        Order::Second => second::recurrent::fused_head(x, d, dv, state, o),
        Order::Third => third::recurrent::fused_head(x, d, dv, state, o),
        Order::Asymmetric => ahla::recurrent::fused_head(x, d, dv, state, o),
    }
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
        *y = crate::fused::simd::dot(row, x);
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
pub(crate) struct Head<'a> {
    pub(crate) q: &'a [f32],
    pub(crate) k: &'a [f32],
    pub(crate) v: &'a [f32],
    pub(crate) log_g: &'a [f32],
}

impl Head<'_> {
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

/// The sizes of a fused call.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Sizes {
    pub(crate) batch: usize,
    pub(crate) heads: usize,
    pub(crate) time: usize,
    pub(crate) d: usize,
    pub(crate) dv: usize,
    pub(crate) chunk: usize,
    /// Batch and heads of the gates (each 1 or the full size).
    pub(crate) gates: (usize, usize),
}

impl Sizes {
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
