//! Picking compute devices by name at run time: `flex`, `ndarray`, `wgpu`, `wgpu:N` (the
//! N-th discrete GPU), `cuda` and `cuda:N`, each usable when its backend was compiled in.

use std::fmt;
use std::str::FromStr;

use anyhow::Result;
use burn::prelude::*;

use super::usage::UsageError;

/// Backends this build understands, whether compiled in or not.
pub const NAMES: [&str; 4] = ["flex", "ndarray", "wgpu", "cuda"];

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

/// A device as a config or the command line names it; parsing checks the name only, so a
/// config can be checked on a machine that lacks the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Spec {
    Flex,
    NdArray,
    /// wgpu's default adapter, or the N-th discrete GPU.
    Wgpu(Option<usize>),
    /// The N-th CUDA device.
    Cuda(usize),
}

impl FromStr for Spec {
    type Err = String;

    fn from_str(name: &str) -> Result<Self, String> {
        let (backend, index) = match name.split_once(':') {
            Some((backend, index)) => {
                let index = index.parse::<usize>().map_err(|_| {
                    format!("device {name:?}: the index after ':' must be a number")
                })?;
                (backend, Some(index))
            }
            None => (name, None),
        };
        match (backend, index) {
            ("flex", None) => Ok(Self::Flex),
            ("ndarray", None) => Ok(Self::NdArray),
            ("wgpu", index) => Ok(Self::Wgpu(index)),
            ("cuda", index) => Ok(Self::Cuda(index.unwrap_or(0))),
            ("flex" | "ndarray", Some(_)) => {
                Err(format!("device {name:?}: {backend} has no device index"))
            }
            _ => Err(format!(
                "unknown device {name:?}; expected one of {} (wgpu and cuda take an index, \
                 e.g. cuda:1)",
                NAMES.join(", ")
            )),
        }
    }
}

impl fmt::Display for Spec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Flex => f.write_str("flex"),
            Self::NdArray => f.write_str("ndarray"),
            Self::Wgpu(None) => f.write_str("wgpu"),
            Self::Wgpu(Some(i)) => write!(f, "wgpu:{i}"),
            Self::Cuda(i) => write!(f, "cuda:{i}"),
        }
    }
}

impl Spec {
    pub fn is_cuda(&self) -> bool {
        matches!(self, Self::Cuda(_))
    }

    fn backend(&self) -> &'static str {
        match self {
            Self::Flex => "flex",
            Self::NdArray => "ndarray",
            Self::Wgpu(_) => "wgpu",
            Self::Cuda(_) => "cuda",
        }
    }

    /// The device, started now where starting can fail, so that a missing GPU is one
    /// message rather than a panic at the first tensor.
    pub fn init(&self) -> Result<Device> {
        match *self {
            #[cfg(feature = "flex")]
            Self::Flex => Ok(Device::flex()),
            #[cfg(feature = "ndarray")]
            #[allow(deprecated)]
            Self::NdArray => Ok(Device::ndarray()),
            #[cfg(feature = "wgpu")]
            Self::Wgpu(index) => wgpu(index),
            #[cfg(feature = "cuda")]
            Self::Cuda(index) => cuda(index),
            #[allow(unreachable_patterns)]
            _ => {
                let backend = self.backend();
                let error = anyhow::anyhow!(
                    "the {backend} device was not compiled into this build; rebuild with \
                     `--features {backend}`"
                );
                Err(UsageError::from(error).into())
            }
        }
    }
}

/// The device called `name`, if its backend was compiled in.
pub fn parse(name: &str) -> Result<Device> {
    spec(name)?.init()
}

/// The spec called `name`; a bad name is a usage error.
fn spec(name: &str) -> Result<Spec> {
    name.parse::<Spec>()
        .map_err(|e| UsageError::from(anyhow::anyhow!(e)).into())
}

/// The devices of a run: `names`, or the default device when there are none.
pub fn parse_all(names: &[String]) -> Result<Vec<Device>> {
    if names.is_empty() {
        return Ok(vec![parse(default_name())?]);
    }
    names.iter().map(|name| parse(name)).collect()
}

/// The GPU, started now: a machine without an adapter, or a bad
/// `CUBECL_WGPU_DEFAULT_DEVICE`, then gets one message instead of a panic at the first
/// tensor.
#[cfg(feature = "wgpu")]
fn wgpu(index: Option<usize>) -> Result<Device> {
    use burn::tensor::DeviceKind;
    use burn::tensor::wgpu::WgpuInitError;
    crate::output::wgpu_starting();
    let kind = index.map_or(DeviceKind::DefaultDevice, DeviceKind::DiscreteGpu);
    Device::wgpu_options()
        .device_kind(kind)
        .init()
        .map_err(|e| {
            let usage = matches!(e, WgpuInitError::InvalidConfiguration { .. });
            let error = anyhow::Error::new(e).context("cannot start the wgpu device");
            if usage {
                UsageError::from(error).into()
            } else {
                error
            }
        })
}

/// The CUDA device `index`, checked with one small tensor: CUDA starts lazily and panics
/// when the driver or the device is missing, which becomes one error here.
#[cfg(feature = "cuda")]
fn cuda(index: usize) -> Result<Device> {
    if !cuda_driver_loads() {
        anyhow::bail!(
            "cannot start the CUDA device cuda:{index}: no CUDA driver (libcuda.so.1 does not \
             load; it needs an NVIDIA GPU and its driver)"
        );
    }
    let device = Device::cuda(index);
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let started = std::panic::catch_unwind(|| {
        Tensor::<1>::zeros([1], &device).into_data();
    });
    std::panic::set_hook(hook);
    match started {
        Ok(()) => Ok(device),
        Err(payload) => {
            let reason = payload
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "unknown error".into());
            anyhow::bail!(
                "cannot start the CUDA device cuda:{index}: {reason} (it needs an NVIDIA GPU, \
                 its driver and the CUDA runtime libraries)"
            )
        }
    }
}

/// Whether the CUDA driver's library loads. cudarc loads it when the device first runs
/// something, on Burn's fusion thread, whose panic then surfaces as a missing tensor.
#[cfg(all(feature = "cuda", target_os = "linux", target_env = "gnu"))]
fn cuda_driver_loads() -> bool {
    // SAFETY: a NUL-terminated name; the library stays loaded for the device to use.
    unsafe { !libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_LAZY).is_null() }
}

/// Elsewhere the device's own start is the check.
#[cfg(all(feature = "cuda", not(all(target_os = "linux", target_env = "gnu"))))]
fn cuda_driver_loads() -> bool {
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_read_back() {
        for name in ["flex", "ndarray", "wgpu", "wgpu:1", "cuda:0", "cuda:3"] {
            assert_eq!(name.parse::<Spec>().unwrap().to_string(), name);
        }
        assert_eq!("cuda".parse::<Spec>(), Ok(Spec::Cuda(0)));
        for (bad, message) in [
            ("tpu", "unknown device \"tpu\""),
            ("cuda:x", "must be a number"),
            ("flex:1", "flex has no device index"),
        ] {
            let err = bad.parse::<Spec>().unwrap_err();
            assert!(err.contains(message), "{bad}: {err}");
        }
    }
}
