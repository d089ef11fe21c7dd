//! Picking the compute device by name at run time.

use anyhow::{Result, bail};
use burn::prelude::*;

/// Device names this build understands, whether compiled in or not.
pub const NAMES: [&str; 3] = ["flex", "ndarray", "wgpu"];

/// The first CPU device compiled in: flex (faster than ndarray on training steps and twice
/// as fast on matmuls, `hla bench --only train,matmul`), else ndarray (else wgpu).
pub fn default_name() -> &'static str {
    if cfg!(feature = "flex") {
        "flex"
    } else if cfg!(feature = "ndarray") {
        "ndarray"
    } else {
        "wgpu"
    }
}

/// The device called `name`, if its backend was compiled in.
pub fn parse(name: &str) -> Result<Device> {
    #[cfg(feature = "wgpu")]
    if name == "wgpu" {
        return wgpu();
    }
    pick(name).map_err(|e| crate::config::UsageError::from(e).into())
}

/// The GPU, started now: a machine without an adapter, or a bad
/// `CUBECL_WGPU_DEFAULT_DEVICE`, then gets one message instead of a panic at the first
/// tensor.
#[cfg(feature = "wgpu")]
fn wgpu() -> Result<Device> {
    use burn::tensor::wgpu::WgpuInitError;
    Device::wgpu_options().init().map_err(|e| {
        let usage = matches!(e, WgpuInitError::InvalidConfiguration { .. });
        let error = anyhow::Error::new(e).context("cannot start the wgpu device");
        if usage {
            crate::config::UsageError::from(error).into()
        } else {
            error
        }
    })
}

fn pick(name: &str) -> Result<Device> {
    match name {
        #[cfg(feature = "ndarray")]
        #[allow(deprecated)]
        "ndarray" => Ok(Device::ndarray()),
        #[cfg(feature = "flex")]
        "flex" => Ok(Device::flex()),
        known if NAMES.contains(&known) => bail!(
            "the {known} device was not compiled into this build; rebuild with `--features {known}`"
        ),
        unknown => bail!(
            "unknown device {unknown:?}; expected one of {}",
            NAMES.join(", ")
        ),
    }
}
