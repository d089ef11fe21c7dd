//! Backend machinery every kernel shares, and nothing else from the crate: recording a
//! kernel on the autodiff graph ([`autodiff`]), the host view of a CPU tensor ([`Host`]),
//! SIMD helpers ([`simd`]), the CPU matmul ([`gemm`]), GPU buffers ([`gpu`]), and the
//! switch that says which device takes which route.
//!
//! Burn runs a composed op (RMSNorm, SwiGLU, the short convolution, …) as one backend op
//! per elementwise step, each a pass over memory that autodiff records, and whose backward
//! pass is several more. Where a hand-written kernel exists, it runs instead: one kernel
//! forward and one backward. Each kernel lives beside the composed form it replaces, which
//! stays as its test oracle and serves every other device, and each op declares its own
//! backend extension beside its kernel:
//!
//! * the CPU kernels run for f32 tensors on a CPU device ([`takes_cpu_kernel`]: ndarray,
//!   flex), over the tensors' host memory, vectorized and split over the rayon pool;
//! * the GPU kernels run for f32 tensors on a CubeCL device ([`takes_gpu_kernel`]: wgpu,
//!   cuda);
//!
//! both while [`set_enabled`] has not turned the kernels off.

#[cfg(any(cpu_kernels, gpu_kernels))]
pub(crate) mod autodiff;
#[cfg(cpu_kernels)]
pub(crate) mod gemm;
#[cfg(gpu_kernels)]
pub(crate) mod gpu;
#[cfg(cpu_kernels)]
mod host;
pub(crate) mod simd;

use std::sync::atomic::{AtomicBool, Ordering};

use burn::prelude::*;
use burn::tensor::DType;

#[cfg(gpu_kernels)]
#[doc(hidden)]
pub use gpu::cap_grid_axis;
#[cfg(cpu_kernels)]
pub(crate) use host::Host;

static ENABLED: AtomicBool = AtomicBool::new(true);

/// Turns the hand-written kernels, CPU and GPU, on (the default) or off: off, every op runs
/// its composed form (to measure what the kernels gain, or to rule them out).
pub fn set_enabled(enabled: bool) {
    ENABLED.store(enabled, Ordering::Relaxed);
}

/// Whether the hand-written kernels are on.
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// Whether an op on `x` takes its CPU kernel: f32 on a CPU device, kernels on.
pub(crate) fn takes_cpu_kernel<const D: usize>(x: &Tensor<D>) -> bool {
    enabled() && x.dtype() == DType::F32 && on_cpu(&x.device())
}

/// Whether an op on `x` takes its GPU kernel: f32 on a CubeCL device, kernels on.
#[cfg(gpu_kernels)]
pub(crate) fn takes_gpu_kernel<const D: usize>(x: &Tensor<D>) -> bool {
    enabled() && x.dtype() == DType::F32 && on_gpu(&x.device())
}

/// Whether `device` is a CPU device (ndarray, flex), which has the CPU kernels.
pub fn on_cpu(device: &Device) -> bool {
    use burn::backend::DispatchDevice;
    match device.clone().inner().as_dispatch() {
        #[cfg(feature = "ndarray")]
        DispatchDevice::NdArray(_) => true,
        #[cfg(feature = "flex")]
        DispatchDevice::Flex(_) => true,
        _ => false,
    }
}

/// Whether `device` is a CubeCL device (wgpu, cuda), which has the GPU kernels.
pub fn on_gpu(device: &Device) -> bool {
    match device.clone().inner().as_dispatch() {
        #[cfg(gpu_kernels)]
        burn::backend::DispatchDevice::Cube(_) => true,
        _ => false,
    }
}
