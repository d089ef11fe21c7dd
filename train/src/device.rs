//! Picking the compute device by name at run time.

use anyhow::{Result, bail};
use burn::prelude::*;

/// Device names this build understands, whether compiled in or not.
pub const NAMES: [&str; 3] = ["ndarray", "flex", "wgpu"];

/// The first CPU device compiled in: ndarray, else flex (else wgpu).
pub fn default_name() -> &'static str {
    if cfg!(feature = "ndarray") {
        "ndarray"
    } else if cfg!(feature = "flex") {
        "flex"
    } else {
        "wgpu"
    }
}

/// The device called `name`, if its backend was compiled in.
pub fn parse(name: &str) -> Result<Device> {
    pick(name).map_err(|e| crate::config::UsageError::from(e).into())
}

fn pick(name: &str) -> Result<Device> {
    match name {
        #[cfg(feature = "ndarray")]
        #[allow(deprecated)]
        "ndarray" => Ok(Device::ndarray()),
        #[cfg(feature = "flex")]
        "flex" => Ok(Device::flex()),
        #[cfg(feature = "wgpu")]
        "wgpu" => Ok(Device::wgpu(burn::tensor::DeviceKind::DefaultDevice)),
        known if NAMES.contains(&known) => bail!(
            "the {known} device was not compiled into this build; rebuild with `--features {known}`"
        ),
        unknown => bail!(
            "unknown device {unknown:?}; expected one of {}",
            NAMES.join(", ")
        ),
    }
}
