//! Fused CPU kernels with hand-written backward passes.
//!
//! Burn runs a composed op (RMSNorm, SwiGLU, the short convolution, …) as one backend op per
//! elementwise step, each a pass over memory that autodiff records, and whose backward
//! pass is several more. On the CPU backends (ndarray, flex) such an op here is one kernel
//! forward and one backward, over the tensors' host memory, vectorized for the CPU it runs
//! on and split over the rayon pool ([`simd`]). Each kernel lives beside the composed form it
//! replaces, which stays as its test oracle and serves every other device (wgpu).
//!
//! [`applies`] routes: a fused op runs for f32 tensors on a CPU device while
//! [`set_enabled`] has not turned the kernels off. On CubeCL devices (wgpu, cuda) the
//! chunk-parallel HLA forms of every order and the causal attention run their GPU kernels
//! ([`cube`], [`crate::hla::cube`]) under the same switch (`applies_on_cube`).

#[cfg(any(
    feature = "ndarray",
    feature = "flex",
    feature = "wgpu",
    feature = "cuda"
))]
mod autodiff;
#[cfg(any(feature = "wgpu", feature = "cuda"))]
pub(crate) mod cube;
#[cfg(any(feature = "ndarray", feature = "flex"))]
pub(crate) mod gemm;
#[cfg(any(feature = "ndarray", feature = "flex"))]
mod host;
#[cfg(any(feature = "ndarray", feature = "flex"))]
mod ops;
pub(crate) mod simd;
#[cfg(all(test, any(feature = "ndarray", feature = "flex")))]
pub(crate) mod tests;

use std::sync::atomic::{AtomicBool, Ordering};

use burn::prelude::*;
use burn::tensor::DType;

#[cfg(any(feature = "ndarray", feature = "flex"))]
pub(crate) use host::Host;
#[cfg(any(feature = "ndarray", feature = "flex"))]
pub(crate) use ops::FusedOps;

static ENABLED: AtomicBool = AtomicBool::new(true);

/// Turns the fused kernels on (the default) or off: off, every op runs its composed form
/// (to measure what the kernels gain, or to rule them out).
pub fn set_enabled(enabled: bool) {
    ENABLED.store(enabled, Ordering::Relaxed);
}

/// Whether the fused kernels are on.
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// Whether an op on `x` takes its fused kernel: f32 on a CPU device, kernels on.
pub(crate) fn applies<const D: usize>(x: &Tensor<D>) -> bool {
    enabled() && x.dtype() == DType::F32 && on_host(&x.device())
}

/// Whether an op on `x` takes its GPU kernel: f32 on a CubeCL device, kernels on.
#[cfg(any(feature = "wgpu", feature = "cuda"))]
pub(crate) fn applies_on_cube<const D: usize>(x: &Tensor<D>) -> bool {
    enabled() && x.dtype() == DType::F32 && on_cube(&x.device())
}

/// Whether `device` has the fused kernels (the CPU devices); the others run every op's
/// composed form.
pub fn on_host(device: &Device) -> bool {
    use burn::backend::DispatchDevice;
    match device.clone().inner().as_dispatch() {
        #[cfg(feature = "ndarray")]
        DispatchDevice::NdArray(_) => true,
        #[cfg(feature = "flex")]
        DispatchDevice::Flex(_) => true,
        _ => false,
    }
}

/// Whether `device` is a CubeCL device (wgpu, cuda), which runs the GPU kernels
/// ([`crate::hla::cube`]).
pub fn on_cube(device: &Device) -> bool {
    match device.clone().inner().as_dispatch() {
        #[cfg(any(feature = "wgpu", feature = "cuda"))]
        burn::backend::DispatchDevice::Cube(_) => true,
        _ => false,
    }
}
