//! The CPU chunked form ([`super::driver`]) as a Burn backend extension.

#![allow(deprecated)] // the generated dispatch names NdArray, a supported CPU device

use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::tensor::FloatTensor;
use burn::backend::{Autodiff, Backend, backend_extension};

use super::driver::{CpuChunked, backward, forward};
use crate::backend::Host;
use crate::backend::autodiff::record;

/// The chunked HLA as a Burn backend extension: the CPU backends run its kernel, and their
/// autodiff wrapper records it as one graph node whose backward pass is the backward
/// kernel.
#[backend_extension(
    Autodiff,
    NdArray: cfg(feature = "ndarray"),
    Flex: cfg(feature = "flex")
)]
pub(crate) trait HlaCpuOps: Backend {
    /// HLA by `kernel.kernels` in chunks of `kernel.chunk` from the state packed per head:
    /// the packed output and final state.
    fn hla_chunked(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        log_g: FloatTensor<Self>,
        state: FloatTensor<Self>,
        kernel: CpuChunked,
    ) -> FloatTensor<Self>;
}

impl<B: Host> HlaCpuOps for B {
    fn hla_chunked(
        q: FloatTensor<B>,
        k: FloatTensor<B>,
        v: FloatTensor<B>,
        log_g: FloatTensor<B>,
        state: FloatTensor<B>,
        kernel: CpuChunked,
    ) -> FloatTensor<B> {
        forward::<B>([q, k, v, log_g, state], kernel).0
    }
}

impl<B: Host, C: CheckpointStrategy> HlaCpuOps for Autodiff<B, C> {
    fn hla_chunked(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        log_g: FloatTensor<Self>,
        state: FloatTensor<Self>,
        kernel: CpuChunked,
    ) -> FloatTensor<Self> {
        record::<B, C, 5>(
            [q, k, v, log_g, state],
            |inputs| forward::<B>(inputs, kernel),
            move |saved, grad| backward::<B>(saved, grad, kernel),
        )
    }
}
