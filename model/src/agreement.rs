//! How forms are compared: the relative RMS error of flash-linear-attention's tests.

use burn::prelude::*;

/// `rms(a − b) / rms(b)`; the plain RMS of `a − b` when `b` is all zeros.
pub fn relative_rms_error<const D: usize>(a: Tensor<D>, b: Tensor<D>) -> f64 {
    let diff: f64 = (a - b.clone()).square().sum().into_scalar::<f32>().into();
    let norm: f64 = b.square().sum().into_scalar::<f32>().into();
    if norm == 0.0 {
        diff.sqrt()
    } else {
        (diff / norm).sqrt()
    }
}
