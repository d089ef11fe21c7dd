//! Helpers for the crate's unit tests.

use burn::prelude::*;

/// The CPU devices compiled in, with autodiff.
pub(crate) fn cpu_devices() -> Vec<Device> {
    vec![
        #[cfg(feature = "ndarray")]
        #[allow(deprecated)]
        Device::ndarray().autodiff(),
        #[cfg(feature = "flex")]
        Device::flex().autodiff(),
    ]
}

/// The default wgpu device, with every kernel's buffers guarded until the scope drops
/// (it panics there if a kernel wrote out of bounds): keep it alive through the test.
#[cfg(feature = "wgpu")]
pub(crate) fn guarded_wgpu() -> (Device, crate::backend::gpu::guard::Scope) {
    let device = Device::wgpu(burn::tensor::DeviceKind::DefaultDevice);
    (device, crate::backend::gpu::guard::Scope::new())
}
