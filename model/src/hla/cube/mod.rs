//! The chunk-parallel forms of every order on CubeCL devices (wgpu, cuda): one kernel
//! launch forward and one backward, in place of the composed form's hundreds of small ops
//! and their autodiff nodes.
//!
//! Each order's kernels ([`super::first::cube`], [`super::second::cube`],
//! [`super::third::cube`], [`super::ahla::cube`]) follow its CPU fused form
//! ([`super::first::fused`], …) equation by equation: one cube per sequence and head walks
//! its chunks in order (the recurrence over chunks, spec §5) and carries the state; the
//! forward pass saves every chunk's start state, from which the backward pass walks the
//! chunks back. The composed form stays their test oracle and serves what the kernels do
//! not cover: the gates' gradient (the data-dependent decay) and keys shared by the heads.
//! No decay, the fixed decay (gates without a gradient) and the masked denominator (one
//! more value column) run here.

pub(crate) mod blocks;

use burn::backend::TensorMetadata;
use burn::prelude::*;
use burn::tensor::{DType, Shape};
use burn_cubecl::cubecl::prelude::{CubeCount, CubeDim};
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::ops::numeric::zeros_client;
use burn_cubecl::tensor::CubeTensor;

use super::state::{OrderState, state_len, unpack_output};
use super::{HlaInput, HlaState, Order, ahla, first, second, third};
use crate::fused::cube::{empty, units};
use blocks::DimsLaunch;

/// What one kernel call computes.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Kernel {
    pub(crate) order: Order,
    pub(crate) chunk: usize,
}

/// Whether the chunked form of `input` runs these kernels: f32 on a CubeCL device with the
/// kernels on, keys per head, and gates without a gradient.
pub(crate) fn applies(input: &HlaInput) -> bool {
    crate::fused::applies_on_cube(&input.q)
        && input.k.dims()[1] == input.q.dims()[1]
        && input.log_g.as_ref().is_none_or(|g| !g.is_tracked())
}

/// The kernels' form of an order's chunked form (`first::chunked`, …; same arguments and
/// results).
pub(crate) fn run<S: OrderState>(input: &HlaInput, state: S, chunk: usize) -> (Tensor<4>, S) {
    use crate::fused::cube::CubeOps;
    let order = S::ORDER;
    let state = state.into_state().tensors();
    let packed = <burn::backend::Dispatch as CubeOps>::hla_chunked(
        input.q.clone().into_dispatch(),
        input.k.clone().into_dispatch(),
        input.v.clone().into_dispatch(),
        input.gates_or_zeros().into_dispatch(),
        super::state::pack_state(state).into_dispatch(),
        Kernel { order, chunk },
    );
    let (o, parts) = unpack_output(Tensor::from_dispatch(packed), order, input);
    (o, S::from_state(HlaState::from_tensors(order, parts)))
}

/// The sizes of a call, from `q`, `v` and the gates `[gb, gh, time]`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Sizes {
    sequences: usize,
    heads: usize,
    time: usize,
    d: usize,
    dv: usize,
    chunk: usize,
    chunks: usize,
    /// Floats of one head's state.
    len: usize,
}

impl Sizes {
    pub(crate) fn new(q: &Shape, v: &Shape, kernel: Kernel) -> Self {
        let ([b, heads, time, d], dv) = (q.dims::<4>(), v[3]);
        Self {
            sequences: b * heads,
            heads,
            time,
            d,
            dv,
            chunk: kernel.chunk,
            chunks: time.div_ceil(kernel.chunk),
            len: state_len(kernel.order, d, dv),
        }
    }

    /// The kernels' sizes, for gates `[gb, gh, time]`.
    fn dims(&self, [gb, gh]: [usize; 2]) -> DimsLaunch {
        DimsLaunch::new(self.time, self.d, self.dv, self.chunk, self.heads, gb, gh)
    }

    /// Floats of the packed `[o, final state]`.
    pub(crate) fn packed(&self) -> usize {
        self.sequences * (self.time * self.dv + self.len)
    }

    /// Floats of the state of every sequence and head.
    pub(crate) fn state(&self) -> usize {
        self.sequences * self.len
    }

    /// Floats of every chunk's start state.
    pub(crate) fn starts(&self) -> usize {
        self.sequences * self.chunks * self.len
    }
}

/// Workspace floats of one cube of `kernel`, forward and backward.
fn workspace(kernel: Kernel, n: &Sizes) -> [usize; 2] {
    let (c, d, dv) = (kernel.chunk, n.d, n.dv);
    match kernel.order {
        Order::First => first::cube::workspace(c, d, dv),
        Order::Second => second::cube::workspace(c, d, dv),
        Order::Third => third::cube::workspace(c, d, dv),
        Order::Asymmetric => ahla::cube::workspace(c, d, dv),
    }
}

/// One cube per sequence and head.
fn grid(like: &CubeTensor, n: &Sizes) -> (CubeCount, CubeDim) {
    (
        CubeCount::Static(n.sequences as u32, 1, 1),
        CubeDim::new_1d(units(like)),
    )
}

/// `[q, k, v, log g [gb, gh, time], state]` (the state packed per head) → the packed
/// `[o, final state]` and every chunk's start state.
pub(crate) fn forward(inputs: [CubeTensor; 5], kernel: Kernel) -> (CubeTensor, CubeTensor) {
    let [q, k, v, log_g, state] = inputs.map(into_contiguous);
    let n = Sizes::new(&q.shape(), &v.shape(), kernel);
    let [gb, gh, _] = log_g.shape().dims::<3>();
    let (packed, starts) = (empty(&q, [n.packed()]), empty(&q, [n.starts()]));
    let ws = empty(&q, [n.sequences, workspace(kernel, &n)[0]]);
    let ((count, dim), client) = (grid(&q, &n), q.client.clone());
    let dims = n.dims([gb, gh]);
    macro_rules! launch {
        ($order:ident) => {
            $order::cube::forward::launch(
                &client,
                count,
                dim,
                q.into_tensor_arg(),
                k.into_tensor_arg(),
                v.into_tensor_arg(),
                log_g.into_tensor_arg(),
                state.into_tensor_arg(),
                packed.clone().into_tensor_arg(),
                starts.clone().into_tensor_arg(),
                ws.into_tensor_arg(),
                dims,
            )
        };
    }
    match kernel.order {
        Order::First => launch!(first),
        Order::Second => launch!(second),
        Order::Third => launch!(third),
        Order::Asymmetric => launch!(ahla),
    }
    (packed, starts)
}

/// Saved `[q, k, v, log g, starts]` and the packed gradient `[∂o, ∂state]` → `[∂q, ∂k,
/// ∂v, ∂log g, ∂state₀]` (the gates' gradient zero: see [`applies`]).
pub(crate) fn backward(
    saved: [CubeTensor; 5],
    grad: CubeTensor,
    kernel: Kernel,
) -> [CubeTensor; 5] {
    let [q, k, v, log_g, starts] = saved.map(into_contiguous);
    let grad = into_contiguous(grad);
    let n = Sizes::new(&q.shape(), &v.shape(), kernel);
    let g_shape = log_g.shape();
    let [gb, gh, _] = g_shape.dims::<3>();
    let (dq, dk) = (
        empty(&q, q.shape().dims::<4>()),
        empty(&q, k.shape().dims::<4>()),
    );
    let (dv, dstate) = (empty(&q, v.shape().dims::<4>()), empty(&q, [n.state()]));
    let ws = empty(&q, [n.sequences, workspace(kernel, &n)[1]]);
    let ((count, dim), client) = (grid(&q, &n), q.client.clone());
    let dims = n.dims([gb, gh]);
    macro_rules! launch {
        ($order:ident) => {
            $order::cube::backward::launch(
                &client,
                count,
                dim,
                q.into_tensor_arg(),
                k.into_tensor_arg(),
                v.into_tensor_arg(),
                log_g.into_tensor_arg(),
                starts.into_tensor_arg(),
                grad.into_tensor_arg(),
                dq.clone().into_tensor_arg(),
                dk.clone().into_tensor_arg(),
                dv.clone().into_tensor_arg(),
                dstate.clone().into_tensor_arg(),
                ws.into_tensor_arg(),
                dims,
            )
        };
    }
    match kernel.order {
        Order::First => launch!(first),
        Order::Second => launch!(second),
        Order::Third => launch!(third),
        Order::Asymmetric => launch!(ahla),
    }
    let dlog_g = zeros_client(client, dq.device.clone(), g_shape, DType::F32);
    [dq, dk, dv, dlog_g, dstate]
}
