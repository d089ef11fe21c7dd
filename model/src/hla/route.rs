//! The router of the chunked form: for every order, which of its chunked forms runs. The
//! CPU kernels run for f32 on a CPU device, the GPU kernels for f32 on a CubeCL device
//! (gates without a gradient) where every buffer of the call fits the device, both with
//! keys per head and as [`crate::backend::set_kernels`] allows (by default the CPU
//! kernels only); elsewhere the order's composed form.

use burn::prelude::*;

use super::HlaInput;
#[cfg(any(cpu_kernels, gpu_kernels))]
use super::packing::{head_len, pack_state, unpack_output};
use super::state::{Operator, zeros};

/// The chunked form of `O` from `state` (zeros when `None`): `chunk` tokens per chunk;
/// `o [batch, heads, time, dv]` and, when `keep`, the final state (the node makes no
/// final state it need not return).
pub(crate) fn chunked<O: Operator>(
    input: &HlaInput,
    state: Option<O::State>,
    chunk: usize,
    keep: bool,
) -> (Tensor<4>, Option<O::State>) {
    let kept = |(o, state)| (o, keep.then_some(state));
    #[cfg(any(cpu_kernels, gpu_kernels))]
    if keys_per_head(input) && crate::backend::takes_node(&input.q) {
        return on_node::<O>(input, state, chunk, keep);
    }
    #[cfg(cpu_kernels)]
    if keys_per_head(input) && crate::backend::takes_cpu_kernel(&input.q) {
        return kept(on_cpu::<O>(input, state, chunk));
    }
    #[cfg(gpu_kernels)]
    if keys_per_head(input)
        && crate::backend::takes_gpu_kernel(&input.q)
        && input.log_g.as_ref().is_none_or(|g| !g.is_tracked())
    {
        let kernel = super::gpu::GpuChunked {
            kernels: O::GPU,
            chunk,
        };
        let (q, v) = (input.q.shape(), input.v.shape());
        if super::gpu::fits(&input.q.device(), &q, &v, kernel) {
            return kept(on_gpu::<O>(input, state, kernel));
        }
    }
    kept(O::chunked(
        input,
        state.unwrap_or_else(|| zeros::<O>(input)),
        chunk,
    ))
}

/// Whether every head has its own keys (the kernels do not take keys shared by the heads).
#[cfg(any(cpu_kernels, gpu_kernels))]
fn keys_per_head(input: &HlaInput) -> bool {
    input.k.dims()[1] == input.q.dims()[1]
}

/// The CPU kernels' chunked form of `O` (the same arguments and results as
/// [`chunked`]).
#[cfg(cpu_kernels)]
pub(crate) fn on_cpu<O: Operator>(
    input: &HlaInput,
    state: Option<O::State>,
    chunk: usize,
) -> (Tensor<4>, O::State) {
    use super::cpu::{CpuChunked, HlaCpuOps};
    let log_g = input.gates_or_zeros();
    let kernel = CpuChunked {
        kernels: O::CPU,
        chunk,
        gates: log_g.is_tracked(),
    };
    let packed = <burn::backend::Dispatch as HlaCpuOps>::hla_chunked(
        input.q.clone().into_dispatch(),
        input.k.clone().into_dispatch(),
        input.v.clone().into_dispatch(),
        log_g.into_dispatch(),
        packed::<O>(input, state).into_dispatch(),
        kernel,
    );
    finish::<O>(Tensor::from_dispatch(packed), input)
}

/// The GPU kernels' chunked form of `O` (as [`on_cpu`]).
#[cfg(gpu_kernels)]
fn on_gpu<O: Operator>(
    input: &HlaInput,
    state: Option<O::State>,
    kernel: super::gpu::GpuChunked,
) -> (Tensor<4>, O::State) {
    use super::gpu::HlaGpuOps;
    let packed = <burn::backend::Dispatch as HlaGpuOps>::hla_chunked(
        input.q.clone().into_dispatch(),
        input.k.clone().into_dispatch(),
        input.v.clone().into_dispatch(),
        input.gates_or_zeros().into_dispatch(),
        packed::<O>(input, state).into_dispatch(),
        kernel,
    );
    finish::<O>(Tensor::from_dispatch(packed), input)
}

/// The chunked form of `O` as one autodiff node ([`super::node`]; the same arguments and
/// results as [`chunked`]): a zero state is no tensor (the node's scans start from zeros),
/// and without `keep` the node's output is `o` alone.
#[cfg(any(cpu_kernels, gpu_kernels))]
pub(crate) fn on_node<O: Operator>(
    input: &HlaInput,
    state: Option<O::State>,
    chunk: usize,
    keep: bool,
) -> (Tensor<4>, Option<O::State>) {
    use super::node::{HlaNodeOps, NodeChunked};
    let log_g = input.gates_or_zeros();
    let node = NodeChunked {
        kernels: O::NODE,
        chunk,
        decay: input.log_g.is_some(),
        gates: log_g.is_tracked(),
        start: state.is_some(),
        keep,
    };
    let state = match state {
        Some(state) => pack_state(O::tensors(&state)),
        // The node reads no zero state: a tensor of one float stands in.
        None => Tensor::empty([1], &input.q.device()),
    };
    let out = <burn::backend::Dispatch as HlaNodeOps>::hla_node(
        input.q.clone().into_dispatch(),
        input.k.clone().into_dispatch(),
        input.v.clone().into_dispatch(),
        log_g.into_dispatch(),
        state.into_dispatch(),
        node,
    );
    match keep {
        true => {
            let (o, state) = finish::<O>(Tensor::from_dispatch(out), input);
            (o, Some(state))
        }
        false => (Tensor::from_dispatch(out), None),
    }
}

/// `state` packed per head ([`pack_state`]) for the kernels; a zero state as one buffer
/// of zeros, where its parts would be one each and a copy to pack them (every head has
/// its own keys here, so every part has the query's heads).
#[cfg(any(cpu_kernels, gpu_kernels))]
fn packed<O: Operator>(input: &HlaInput, state: Option<O::State>) -> Tensor<1> {
    match state {
        Some(state) => pack_state(O::tensors(&state)),
        None => {
            let [b, h, _, d] = input.q.dims();
            let len = head_len(&O::state_parts(d, input.v.dims()[3]));
            Tensor::zeros([b * h * len], &input.q.device())
        }
    }
}

/// A kernel's packed `[o, final state]` as `o` and `O`'s state.
#[cfg(any(cpu_kernels, gpu_kernels))]
fn finish<O: Operator>(packed: Tensor<1>, input: &HlaInput) -> (Tensor<4>, O::State) {
    let (d, dv) = (input.q.dims()[3], input.v.dims()[3]);
    let (o, parts) = unpack_output(packed, &O::state_parts(d, dv), input);
    (o, O::from_tensors(parts))
}
