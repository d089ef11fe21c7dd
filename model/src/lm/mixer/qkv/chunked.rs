//! The recurrent mixer's CPU kernel in chunks: one kernel each way takes every head's slice of the tokens,
//! applies the feature map to q and k, and runs HLA of any order (or linear attention) in
//! chunks ([`crate::hla::cpu`]), with the gates' gradient when the decay is
//! data-dependent. With the masked denominator each head's v gets a column of
//! ones, as [`crate::hla::Output::augment`] does, so the denominator comes out as each
//! head's last output column (the state has the composed form's layout), and the kernel
//! divides by it ([`crate::hla::Output::finish`]).

#![allow(deprecated)] // the generated dispatch names NdArray, a supported CPU device

use crate::backend::autodiff::record;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::{Autodiff, Backend, backend_extension};

use burn::backend::TensorMetadata;
use burn::backend::tensor::FloatTensor;
use burn::prelude::*;
use burn::tensor::Shape;

use super::rows::{divide, divide_backward, map_rows, map_rows_backward};
use super::{head_rows, scatter, transpose};
use crate::backend::Host;
use crate::hla::cpu::{ChunkSizes, HeadInput, HeadKernels, backward_head, each_head, forward_head};
use crate::hla::{HlaState, Order};
use crate::hla::{pack_state, state_parts, unpack_state};
use crate::lm::FeatureMap;

/// What one call computes.
#[derive(Clone, Copy, Debug)]
pub(crate) struct QkvHla {
    pub(crate) order: Order,
    /// The order's CPU kernels.
    pub(crate) kernels: HeadKernels,
    pub(crate) heads: usize,
    pub(crate) map: FeatureMap,
    pub(crate) chunk: usize,
    /// Divide by the masked denominator, clamped at this epsilon: v gets a column of ones.
    pub(crate) denominator: Option<f32>,
    /// Whether the log gates need a gradient (the data-dependent decay).
    pub(crate) gates: bool,
}

impl QkvHla {
    /// The width of a head's values in the kernels: `dh`, and the ones column.
    pub(crate) fn dv(&self, dh: usize) -> usize {
        dh + usize::from(self.denominator.is_some())
    }

    /// One head's state as `[rows, cols]` parts ([`crate::hla::state_parts`]).
    pub(crate) fn state_parts(&self, dh: usize) -> Vec<[usize; 2]> {
        state_parts(self.order, dh, self.dv(dh))
    }

    /// Floats of one head's state.
    pub(crate) fn state_len(&self, dh: usize) -> usize {
        (self.kernels.state_len)(dh, self.dv(dh))
    }
}

/// `qkv [batch, time, 3·d]` (q, k, v, each head after head), log gates `[gb, gh, time]`
/// and the state before the tokens → `o [batch, time, d]` (divided by the denominator if
/// carried) and the state after them.
pub(crate) fn forward(
    qkv: Tensor<3>,
    log_g: Tensor<3>,
    state: HlaState,
    tokens: QkvHla,
) -> (Tensor<3>, HlaState) {
    let [b, t, channels] = qkv.dims();
    let (d, h) = (channels / 3, tokens.heads);
    let packed = <burn::backend::Dispatch as QkvChunkedCpuOps>::qkv_chunked(
        qkv.into_dispatch(),
        log_g.into_dispatch(),
        pack_state(state.tensors()).into_dispatch(),
        tokens,
    );
    let packed = Tensor::<1>::from_dispatch(packed);
    let o_len = b * t * d;
    let state = packed.clone().narrow(0, o_len, packed.dims()[0] - o_len);
    let parts = unpack_state(state, [b, h], &tokens.state_parts(d / h));
    let o = packed.narrow(0, 0, o_len).reshape([b, t, d]);
    (o, HlaState::from_tensors(tokens.order, parts))
}

/// One head's q, k (mapped) and v, each `[time, dh]`; with the raw q and k when `raw`.
pub(super) struct Gathered {
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    raw: Option<(Vec<f32>, Vec<f32>)>,
}

impl Gathered {
    /// The chunk kernels' view of this head, with its log gates.
    pub(super) fn head<'a>(&'a self, log_g: &'a [f32]) -> HeadInput<'a> {
        HeadInput {
            q: &self.q,
            k: &self.k,
            v: &self.v,
            log_g,
        }
    }
}

/// Head `at = (sequence, head)` of `qkv`, its q and k through the feature map and its v
/// with the ones column of the denominator.
pub(super) fn gather(
    qkv: &[f32],
    at: (usize, usize),
    sizes: (usize, usize, usize),
    tokens: &QkvHla,
    raw: bool,
) -> Gathered {
    let (time, _, dh) = sizes;
    let rows = |part: usize| head_rows(qkv, at, (part, 3), sizes);
    let (q_raw, k_raw, mut v) = (rows(0), rows(1), rows(2));
    if tokens.denominator.is_some() {
        v = v
            .chunks_exact(dh)
            .flat_map(|row| row.iter().chain([&1.0]))
            .copied()
            .collect();
    }
    let mapped = |x: &[f32], query: bool| {
        let mut y = vec![0.0; time * dh];
        map_rows(tokens.map, query, x, &mut y, dh);
        y
    };
    let (q, k) = (mapped(&q_raw, true), mapped(&k_raw, false));
    Gathered {
        q,
        k,
        v,
        raw: raw.then_some((q_raw, k_raw)),
    }
}

/// The sizes of a call on `qkv [batch, time, 3·d]`.
pub(super) fn sizes(qkv: &Shape, gates: &Shape, tokens: &QkvHla) -> (ChunkSizes, usize) {
    let d = qkv[2] / 3;
    let dh = d / tokens.heads;
    let q = [qkv[0], tokens.heads, qkv[1], dh];
    let v = [qkv[0], tokens.heads, qkv[1], tokens.dv(dh)];
    (ChunkSizes::new(&q, &v, gates, tokens.chunk), d)
}

/// `[qkv, log g, state₀]` (the state packed per head) → packed `[o [batch, time, d],
/// state]`; saves `qkv`, the gates and every chunk's start state, and with the denominator
/// `o` and the denominators `[batch, heads, time]`.
pub(crate) fn kernel_forward<B: Host>(
    [qkv, log_g, state0]: [FloatTensor<B>; 3],
    tokens: QkvHla,
) -> (FloatTensor<B>, Vec<FloatTensor<B>>) {
    let (n, d) = sizes(&qkv.shape(), &log_g.shape(), &tokens);
    let (dh, _dv) = (n.d, n.dv);
    let len = tokens.state_len(dh);
    let (packed, starts, den) = {
        let values = [&qkv, &log_g, &state0].map(|t| B::values(t));
        let [x, g, state0] = &values;
        let heads: Vec<[Vec<f32>; 4]> = each_head(&n, |i| {
            let at = (i / n.heads, i % n.heads);
            let x = gather(x, at, (n.time, d, dh), &tokens, false);
            let head = x.head(n.gates_of(g, i));
            let out = forward_head(&tokens.kernels, &n, &head, &state0[i * len..][..len]);
            let (o, den) = match tokens.denominator {
                Some(eps) => divide(&out.o, dh, eps),
                None => (out.o, Vec::new()),
            };
            [o, out.state, out.starts, den]
        });
        let [o, state, starts, den] = transpose(heads);
        let mut packed = vec![0.0; n.batch * n.time * d];
        scatter(&mut packed, &[&o], (n.time, d, dh));
        packed.extend(state.concat());
        (packed, starts.concat(), den.concat())
    };
    let flat = |x: Vec<f32>| {
        let len = x.len();
        B::tensor(x, Shape::new([len]))
    };
    let (packed, mut saved) = (flat(packed), vec![qkv, log_g, flat(starts)]);
    if tokens.denominator.is_some() {
        // The packed output leads with `o`, which the backward pass reads.
        saved.extend([packed.clone(), flat(den)]);
    }
    (packed, saved)
}

/// Saved `[qkv, log g, starts]` (and `[packed output, den]`) and the packed gradient →
/// `[∂qkv, ∂log g, ∂state₀]` (zero gates' gradient unless `tokens.gates`).
pub(crate) fn kernel_backward<B: Host>(
    saved: Vec<FloatTensor<B>>,
    grad: FloatTensor<B>,
    tokens: QkvHla,
) -> [FloatTensor<B>; 3] {
    let mut saved = saved.into_iter();
    let mut next = || {
        saved
            .next()
            .unwrap_or_else(|| unreachable!("saved by the forward"))
    };
    let [qkv, log_g, starts] = [next(), next(), next()];
    let divided = tokens.denominator.map(|eps| (next(), next(), eps));
    let divided = (divided.as_ref()).map(|(o, den, eps)| (B::values(o), B::values(den), *eps));
    let (qkv_shape, g_shape) = (qkv.shape(), log_g.shape());
    let (n, d) = sizes(&qkv_shape, &g_shape, &tokens);
    let (dh, dv) = (n.d, n.dv);
    let len = tokens.state_len(dh);
    let values = [&qkv, &log_g, &starts, &grad].map(|t| B::values(t));
    let [x, g, sv, grad] = &values;
    let (g_o, g_state) = grad.split_at(n.batch * n.time * d);
    let start_len = n.chunks() * len;
    let heads: Vec<[Vec<f32>; 5]> = each_head(&n, |i| {
        let at = (i / n.heads, i % n.heads);
        let x = gather(x, at, (n.time, d, dh), &tokens, true);
        let head = x.head(n.gates_of(g, i));
        let g_head = head_rows(g_o, at, (0, 1), (n.time, d, dh));
        let g_head = match &divided {
            Some((o, den, eps)) => {
                let y = head_rows(o, at, (0, 1), (n.time, d, dh));
                divide_backward(&g_head, &y, &den[i * n.time..][..n.time], dh, *eps)
            }
            None => g_head,
        };
        let starts = &sv[i * start_len..][..start_len];
        let g = (&g_head[..], &g_state[i * len..][..len]);
        let grads = backward_head(&tokens.kernels, &n, &head, starts, g, tokens.gates);
        let (q_raw, k_raw) = x.raw.expect("gathered with the raw rows");
        let unmap = |raw: &[f32], y: &[f32], dy: &[f32], query: bool| {
            let mut dx = vec![0.0; dy.len()];
            map_rows_backward(tokens.map, query, raw, y, dy, &mut dx, dh);
            dx
        };
        let dq = unmap(&q_raw, &x.q, &grads.q, true);
        let dk = unmap(&k_raw, &x.k, &grads.k, false);
        // The ones column is a constant: its gradient goes nowhere.
        let d_v = grads
            .v
            .chunks_exact(dv)
            .flat_map(|row| &row[..dh])
            .copied()
            .collect();
        [dq, dk, d_v, grads.state, grads.gates]
    });
    let [dq, dk, d_v, d_state, dg] = transpose(heads);
    let mut dqkv = vec![0.0; x.len()];
    scatter(&mut dqkv, &[&dq, &dk, &d_v], (n.time, d, dh));
    let dg = match tokens.gates {
        true => n.gate_sums(&dg.concat()),
        false => vec![0.0; g.len()],
    };
    let d_state = d_state.concat();
    let state_len = d_state.len();
    [
        B::tensor(dqkv, qkv_shape),
        B::tensor(dg, g_shape),
        B::tensor(d_state, Shape::new([state_len])),
    ]
}

/// The chunked mixer from qkv as a Burn backend extension: the CPU backends run its kernel, and their
/// autodiff wrapper records it as one graph node whose backward pass is the backward
/// kernel.
#[backend_extension(
    Autodiff,
    NdArray: cfg(feature = "ndarray"),
    Flex: cfg(feature = "flex")
)]
pub(crate) trait QkvChunkedCpuOps: Backend {
    /// The recurrent mixer from `qkv [batch, time, 3·d]`: the packed output and final
    /// state ([`forward`]).
    fn qkv_chunked(
        qkv: FloatTensor<Self>,
        log_g: FloatTensor<Self>,
        state: FloatTensor<Self>,
        tokens: QkvHla,
    ) -> FloatTensor<Self>;
}

impl<B: Host> QkvChunkedCpuOps for B {
    fn qkv_chunked(
        qkv: FloatTensor<B>,
        log_g: FloatTensor<B>,
        state: FloatTensor<B>,
        t: QkvHla,
    ) -> FloatTensor<B> {
        kernel_forward::<B>([qkv, log_g, state], t).0
    }
}

impl<B: Host, C: CheckpointStrategy> QkvChunkedCpuOps for Autodiff<B, C> {
    fn qkv_chunked(
        qkv: FloatTensor<Self>,
        log_g: FloatTensor<Self>,
        state: FloatTensor<Self>,
        t: QkvHla,
    ) -> FloatTensor<Self> {
        record::<B, C, 3>(
            [qkv, log_g, state],
            |inputs| kernel_forward::<B>(inputs, t),
            move |saved, grad| kernel_backward::<B>(saved, grad, t),
        )
    }
}
