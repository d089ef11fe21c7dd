//! What the GPU chunked forms of every order share on CubeCL devices (wgpu, cuda): one
//! kernel launch forward and one backward, in place of the composed form's hundreds of
//! small ops and their autodiff nodes.
//!
//! Each order's kernels (its `gpu` module) follow its CPU kernels equation by equation
//! from the [`blocks`] here: one cube per sequence and head walks its chunks in order (the
//! recurrence over chunks, docs/math.md §5) and carries the state; the forward pass saves
//! every chunk's start state, from which the backward pass walks the chunks back. This
//! module launches them for any order through the order's [`GpuKernels`]. The composed
//! form stays their test oracle and serves what the kernels do not cover (the router,
//! [`crate::hla::forward`], decides): the gates' gradient (the data-dependent decay) and
//! keys shared by the heads. No decay, the fixed decay (gates without a gradient) and the
//! masked denominator (one more value column) run here.

pub(crate) mod blocks;

mod ops;

pub(crate) use ops::HlaGpuOps;

use burn::backend::TensorMetadata;
use burn::tensor::{DType, Shape};
use burn_cubecl::cubecl::client::Client;
use burn_cubecl::cubecl::prelude::{CubeCount, CubeDim};
use burn_cubecl::ops::numeric::zeros_client;
use burn_cubecl::tensor::CubeTensor;

use crate::backend::gpu::{contiguous, cubes, empty, units};
use blocks::DimsLaunch;

/// What one call of the GPU chunked form computes.
#[derive(Clone, Copy, Debug)]
pub(crate) struct GpuChunked {
    pub(crate) kernels: GpuKernels,
    pub(crate) chunk: usize,
}

/// One order's GPU kernels, for the launches here that are written once for every order
/// (each order's `gpu::KERNELS`, made by [`gpu_kernels`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct GpuKernels {
    /// Launches the forward kernel on `[q, k, v, log g, state, packed, starts, workspace]`.
    pub(crate) forward: fn(Launch<8>),
    /// Launches the backward kernel on `[q, k, v, log g, starts, ∂packed, ∂q, ∂k, ∂v,
    /// ∂state, workspace]`.
    pub(crate) backward: fn(Launch<11>),
    /// Workspace floats of one cube for `(chunk, d, dv)`, forward and backward.
    pub(crate) workspace: fn(usize, usize, usize) -> [usize; 2],
    /// Floats of one head's state for `(d, dv)`.
    pub(crate) state_len: fn(usize, usize) -> usize,
}

/// One launch: its grid, its tensors in the kernel's order, and the sizes.
pub(crate) struct Launch<const N: usize> {
    pub(crate) client: Client,
    pub(crate) count: CubeCount,
    pub(crate) dim: CubeDim,
    pub(crate) tensors: [CubeTensor; N],
    pub(crate) dims: DimsLaunch,
}

/// An order's `KERNELS: GpuKernels` from the `forward` and `backward` kernels, the
/// `workspace` function of the module it is invoked in and the order's `state_len`.
macro_rules! gpu_kernels {
    ($state_len:path) => {
        /// This order's GPU kernels, for [`crate::hla::gpu`]'s launches.
        pub(crate) const KERNELS: $crate::hla::gpu::GpuKernels = $crate::hla::gpu::GpuKernels {
            forward: |l| {
                let [q, k, v, log_g, state, packed, starts, ws] = l.tensors;
                forward::launch(
                    &l.client,
                    l.count,
                    l.dim,
                    q.into_tensor_arg(),
                    k.into_tensor_arg(),
                    v.into_tensor_arg(),
                    log_g.into_tensor_arg(),
                    state.into_tensor_arg(),
                    packed.into_tensor_arg(),
                    starts.into_tensor_arg(),
                    ws.into_tensor_arg(),
                    l.dims,
                )
            },
            backward: |l| {
                let [q, k, v, log_g, starts, grad, dq, dk, dv, dstate, ws] = l.tensors;
                backward::launch(
                    &l.client,
                    l.count,
                    l.dim,
                    q.into_tensor_arg(),
                    k.into_tensor_arg(),
                    v.into_tensor_arg(),
                    log_g.into_tensor_arg(),
                    starts.into_tensor_arg(),
                    grad.into_tensor_arg(),
                    dq.into_tensor_arg(),
                    dk.into_tensor_arg(),
                    dv.into_tensor_arg(),
                    dstate.into_tensor_arg(),
                    ws.into_tensor_arg(),
                    l.dims,
                )
            },
            workspace,
            state_len: $state_len,
        };
    };
}
pub(crate) use gpu_kernels;

/// The sizes of a call, from `q`, `v` and the gates `[gb, gh, time]`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct LaunchSizes {
    sequences: usize,
    heads: usize,
    time: usize,
    d: usize,
    dv: usize,
    chunk: usize,
    chunks: usize,
    /// Floats of one head's state.
    len: usize,
    /// Workspace floats of one cube, forward and backward.
    workspace: [usize; 2],
}

impl LaunchSizes {
    pub(crate) fn new(q: &Shape, v: &Shape, kernel: GpuChunked) -> Self {
        let ([b, heads, time, d], dv) = (q.dims::<4>(), v[3]);
        Self {
            sequences: b * heads,
            heads,
            time,
            d,
            dv,
            chunk: kernel.chunk,
            chunks: time.div_ceil(kernel.chunk),
            len: (kernel.kernels.state_len)(d, dv),
            workspace: (kernel.kernels.workspace)(kernel.chunk, d, dv),
        }
    }

    /// Floats of every buffer the forward and backward kernels bind: `q` and `k`, `v`,
    /// the packed output, the chunks' start states, a state, the two workspaces.
    fn buffers(&self) -> [usize; 7] {
        let per_sequence = |n: usize| self.sequences.saturating_mul(n);
        let [forward, backward] = self.workspace;
        [
            per_sequence(self.time * self.d),
            per_sequence(self.time * self.dv),
            self.packed(),
            self.starts(),
            self.state(),
            per_sequence(forward),
            per_sequence(backward),
        ]
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

/// Whether the kernels can take a call with `q` and `v` of these shapes on `device`:
/// every buffer they bind fits it ([`crate::backend::gpu::fits`]).
pub(crate) fn fits(
    device: &burn::prelude::Device,
    q: &Shape,
    v: &Shape,
    kernel: GpuChunked,
) -> bool {
    crate::backend::gpu::fits(device, LaunchSizes::new(q, v, kernel).buffers())
}

/// One cube per sequence and head.
fn grid(like: &CubeTensor, n: &LaunchSizes) -> (CubeCount, CubeDim) {
    let dim = CubeDim::new_1d(units(like));
    (cubes(like, n.sequences), dim)
}

/// `[q, k, v, log g [gb, gh, time], state]` (the state packed per head) → the packed
/// `[o, final state]` and every chunk's start state.
pub(crate) fn forward(inputs: [CubeTensor; 5], kernel: GpuChunked) -> (CubeTensor, CubeTensor) {
    let [q, k, v, log_g, state] = inputs.map(contiguous);
    let n = LaunchSizes::new(&q.shape(), &v.shape(), kernel);
    let [gb, gh, _] = log_g.shape().dims::<3>();
    let (packed, starts) = (empty(&q, [n.packed()]), empty(&q, [n.starts()]));
    let ws = empty(&q, [n.sequences, n.workspace[0]]);
    let ((count, dim), client) = (grid(&q, &n), q.client.clone());
    (kernel.kernels.forward)(Launch {
        client,
        count,
        dim,
        tensors: [q, k, v, log_g, state, packed.clone(), starts.clone(), ws],
        dims: n.dims([gb, gh]),
    });
    (packed, starts)
}

/// Saved `[q, k, v, log g, starts]` and the packed gradient `[∂o, ∂state]` → `[∂q, ∂k,
/// ∂v, ∂log g, ∂state₀]` (the gates' gradient zero: the router sends gates with a gradient to the composed
/// form).
pub(crate) fn backward(
    saved: [CubeTensor; 5],
    grad: CubeTensor,
    kernel: GpuChunked,
) -> [CubeTensor; 5] {
    let [q, k, v, log_g, starts] = saved.map(contiguous);
    let grad = contiguous(grad);
    let n = LaunchSizes::new(&q.shape(), &v.shape(), kernel);
    let g_shape = log_g.shape();
    let [gb, gh, _] = g_shape.dims::<3>();
    let (dq, dk) = (
        empty(&q, q.shape().dims::<4>()),
        empty(&q, k.shape().dims::<4>()),
    );
    let (dv, dstate) = (empty(&q, v.shape().dims::<4>()), empty(&q, [n.state()]));
    let ws = empty(&q, [n.sequences, n.workspace[1]]);
    let ((count, dim), client) = (grid(&q, &n), q.client.clone());
    (kernel.kernels.backward)(Launch {
        client: client.clone(),
        count,
        dim,
        tensors: [
            q,
            k,
            v,
            log_g,
            starts,
            grad,
            dq.clone(),
            dk.clone(),
            dv.clone(),
            dstate.clone(),
            ws,
        ],
        dims: n.dims([gb, gh]),
    });
    let dlog_g = zeros_client(client, dq.device.clone(), g_shape, DType::F32);
    [dq, dk, dv, dlog_g, dstate]
}
