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
//! as [`set_kernels`] says: by default the CPU kernels only (see [`Kernels`] for why).

#[cfg(any(cpu_kernels, gpu_kernels))]
pub(crate) mod autodiff;
#[cfg(any(cpu_kernels, gpu_kernels))]
pub(crate) mod bridge;
#[cfg(gpu_kernels)]
pub mod cost;
#[cfg(cpu_kernels)]
pub(crate) mod gemm;
#[cfg(gpu_kernels)]
pub(crate) mod gpu;
#[cfg(cpu_kernels)]
mod host;
pub(crate) mod simd;

use std::sync::atomic::{AtomicU8, Ordering};

use burn::prelude::*;
use burn::tensor::DType;

#[cfg(gpu_kernels)]
#[doc(hidden)]
pub use gpu::{cap_grid_axis, cap_unit_rows, guard::Scope as GuardScope, plan_multiprocessors};
#[cfg(cpu_kernels)]
pub(crate) use host::Host;

/// Which hand-written kernels run in place of the composed forms.
///
/// By default ([`Kernels::Auto`]) a CPU device runs the CPU kernels and a GPU device the
/// chunked HLA's node and the attention's kernels, the forms the cost model (`hla bench
/// --only cost`) puts ahead of the composed forms on a GPU until one is measured: at
/// flash-linear-attention's shape (B4 T2048 H16 d128) hla2's node launches 10 kernels
/// against 139 and moves 3.71 GB against 9.75 forward and backward. The chunked HLA's GPU
/// kernels are off: on an NVIDIA H200
/// (experiments/bench/gpu-cuda and gpu-wgpu), at that shape, their forward+backward took 14
/// to 36 times as long as the composed forms, which run on Burn's autotuned tiled matmuls,
/// on cuda and on wgpu alike. They stay as the base of faster kernels, and the bench and
/// the tests turn them on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Kernels {
    /// Every op runs its composed form.
    None,
    /// The CPU kernels on CPU devices; on GPU devices the nodes (as [`Kernels::Nodes`])
    /// and the attention's kernels, every other op composed.
    #[default]
    Auto,
    /// The CPU kernels on CPU devices, the GPU kernels on GPU devices.
    All,
    /// Every op with a node (the chunked HLA of every order, `crate::hla::node`) runs
    /// it, on every device (on a CubeCL device, its scans over the chunks as one kernel
    /// each): to measure the nodes against the composed forms and the kernels. Other ops
    /// as with [`Kernels::Auto`].
    Nodes,
}

static KERNELS: AtomicU8 = AtomicU8::new(Kernels::Auto as u8);

/// Sets which hand-written kernels run, process-wide (to measure what they gain, or to
/// rule them out).
pub fn set_kernels(kernels: Kernels) {
    KERNELS.store(kernels as u8, Ordering::Relaxed);
}

/// Which hand-written kernels run.
pub fn kernels() -> Kernels {
    match KERNELS.load(Ordering::Relaxed) {
        0 => Kernels::None,
        1 => Kernels::Auto,
        2 => Kernels::All,
        _ => Kernels::Nodes,
    }
}

/// Where the GPU kernels' tile products run (those written for them: the node's passes
/// over the chunks, its output step, hla2's moments and the backward's moment products;
/// the attention's tiles).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TensorCores {
    /// On the tensor cores where the device has them (TF32 `cmma`: CUDA from sm_80 on),
    /// elsewhere the register-tile kernels.
    #[default]
    Device,
    /// The register-tile kernels everywhere: to measure what the tensor cores gain.
    Off,
    /// Emulated where the device has no tensor cores (each unit computes the values its
    /// lane's fragments would hold): the tests check the tiling on lavapipe with it.
    Emulated,
}

static TENSOR_CORES: AtomicU8 = AtomicU8::new(TensorCores::Device as u8);

/// Sets where the GPU kernels' tile products run, process-wide.
pub fn set_tensor_cores(tensor_cores: TensorCores) {
    TENSOR_CORES.store(tensor_cores as u8, Ordering::Relaxed);
}

/// Where the GPU kernels' tile products run.
pub fn tensor_cores() -> TensorCores {
    match TENSOR_CORES.load(Ordering::Relaxed) {
        0 => TensorCores::Device,
        1 => TensorCores::Off,
        _ => TensorCores::Emulated,
    }
}

/// Whether an op on `x` takes its CPU kernel: f32 on a CPU device, CPU kernels on.
pub(crate) fn takes_cpu_kernel<const D: usize>(x: &Tensor<D>) -> bool {
    kernels() != Kernels::None && x.dtype() == DType::F32 && on_cpu(&x.device())
}

/// Whether an op on `x` with a node takes it: f32, [`Kernels::Nodes`], or by default on a
/// GPU device.
pub(crate) fn takes_node<const D: usize>(x: &Tensor<D>) -> bool {
    let on = match kernels() {
        Kernels::Nodes => true,
        Kernels::Auto => on_gpu(&x.device()),
        Kernels::None | Kernels::All => false,
    };
    on && x.dtype() == DType::F32
}

/// Whether an op on `x` takes its GPU kernel: f32 on a CubeCL device, GPU kernels on.
#[cfg(gpu_kernels)]
pub(crate) fn takes_gpu_kernel<const D: usize>(x: &Tensor<D>) -> bool {
    kernels() == Kernels::All && x.dtype() == DType::F32 && on_gpu(&x.device())
}

/// Whether the causal attention on `x` takes its GPU kernels: f32 on a CubeCL device,
/// unless the composed forms are asked for; the cost model puts them ahead of the
/// composed form (FlashAttention-2's tiling: at B4 T2048 H16 d128, 4 launches against 38
/// and 7.5 GB against 34.2, forward and backward).
#[cfg(gpu_kernels)]
pub(crate) fn takes_attention_kernel<const D: usize>(x: &Tensor<D>) -> bool {
    kernels() != Kernels::None && x.dtype() == DType::F32 && on_gpu(&x.device())
}

/// Whether an untracked step on `x` inside a pass (the node's scans) takes its GPU kernel:
/// f32 on a CubeCL device without autodiff (the steps have no backward pass; an untracked
/// tensor on an autodiff device, such as fixed gates, stays composed), with the GPU
/// kernels or the nodes on (by default, on a GPU device).
#[cfg(gpu_kernels)]
pub(crate) fn takes_gpu_step<const D: usize>(x: &Tensor<D>) -> bool {
    let device = x.device();
    kernels() != Kernels::None
        && x.dtype() == DType::F32
        && !device.is_autodiff()
        && on_gpu(&device)
}

/// Whether Burn runs `device`'s f32 matmuls on TF32 tensor cores: its CubeCL matmul
/// stages f32 operands as tf32 wherever the device supports that type (cuda, on NVIDIA
/// GPUs from Ampere on), keeping 10 of their 23 mantissa bits, so results differ from f32
/// arithmetic by about 1e-4 to 1e-3 (relative RMS 3e-4 between the HLA forms on an H200).
pub fn tf32_matmuls(device: &Device) -> bool {
    #[cfg(gpu_kernels)]
    return gpu::tf32_matmuls(device);
    #[cfg(not(gpu_kernels))]
    {
        let _ = device;
        false
    }
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

#[cfg(all(test, feature = "wgpu"))]
mod tests {
    use super::*;

    /// By default a GPU device (with autodiff too) takes the nodes and the attention's
    /// kernels, the chunked HLA's GPU kernels only when turned on, a CPU device none of
    /// them; a wgpu device (Vulkan: no TF32 type) keeps f32 matmuls in f32.
    #[test]
    fn gpu_devices_take_the_nodes_and_the_kernels_when_turned_on() {
        let gpu = Device::wgpu(burn::tensor::DeviceKind::DefaultDevice);
        let x = Tensor::<1>::zeros([4], &gpu);
        let tracked = Tensor::<1>::zeros([4], &gpu.clone().autodiff());
        let cpu = Tensor::<1>::zeros([4], &Device::flex());
        assert_eq!(kernels(), Kernels::Auto);
        let auto = [takes_node(&x), takes_node(&tracked), takes_node(&cpu)];
        let attention = [
            takes_attention_kernel(&tracked),
            takes_attention_kernel(&cpu),
        ];
        let steps = [takes_gpu_step(&x), takes_gpu_kernel(&x)];
        set_kernels(Kernels::All);
        let all = [takes_gpu_kernel(&x), takes_node(&x)];
        set_kernels(Kernels::None);
        let none = [
            takes_node(&x),
            takes_gpu_step(&x),
            takes_attention_kernel(&x),
        ];
        set_kernels(Kernels::default());
        assert_eq!(auto, [true, true, false]);
        assert_eq!(attention, [true, false]);
        assert_eq!(steps, [true, false]);
        assert_eq!(all, [true, false]);
        assert_eq!(none, [false, false, false]);
        assert!(!tf32_matmuls(&gpu));
    }
}
