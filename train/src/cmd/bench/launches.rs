//! Kernel launches per training step on a GPU device (wgpu, cuda): what a fused kernel
//! saves there is launches (and passes over memory), counted by cubecl's launch observer.

use burn::prelude::*;

/// Runs `work` and counts the kernels it launched on a cubecl device: `None` on the CPU
/// devices, which launch none. `work` must end with a device sync (Burn's fusion queues
/// launches and runs them later, on its own thread, which the observer sees as well).
#[cfg(any(feature = "wgpu", feature = "cuda"))]
pub(super) fn count<T>(device: &Device, work: impl FnOnce() -> T) -> (T, Option<usize>) {
    use burn::backend::DispatchDevice;
    use cubecl::logging::{LaunchObservation, LaunchObserver};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    struct Counter(AtomicUsize);
    impl LaunchObserver for Counter {
        fn launched(&self, _kernel: &'static str) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    if !matches!(
        device.clone().inner().as_dispatch(),
        DispatchDevice::Cube(_)
    ) {
        return (work(), None);
    }
    let counter = Arc::new(Counter(AtomicUsize::new(0)));
    let observation = LaunchObservation::new(counter.clone());
    let out = work();
    drop(observation);
    (out, Some(counter.0.load(Ordering::Relaxed)))
}

/// No GPU device compiled in: nothing launches kernels.
#[cfg(not(any(feature = "wgpu", feature = "cuda")))]
pub(super) fn count<T>(_device: &Device, work: impl FnOnce() -> T) -> (T, Option<usize>) {
    (work(), None)
}
