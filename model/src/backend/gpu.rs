//! What every GPU kernel's launch needs from a CubeCL device: how many units a cube may
//! have, and uninitialised contiguous buffers.

use burn::tensor::{DType, Shape};
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;

/// Units per cube: wgpu's portable limit, or the device's own where it is lower.
pub(crate) fn units(like: &CubeTensor) -> u32 {
    like.client.properties().hardware.max_cube_dim.0.min(256)
}

/// An uninitialised contiguous f32 tensor on `like`'s device (the kernels index their
/// outputs as contiguous).
pub(crate) fn empty<const D: usize>(like: &CubeTensor, dims: [usize; D]) -> CubeTensor {
    let (client, device) = (like.client.clone(), like.device.clone());
    empty_device_contiguous_dtype(client, device, Shape::new(dims), DType::F32)
}
