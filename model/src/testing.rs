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
