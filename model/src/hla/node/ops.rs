//! The node as a Burn backend extension: on an inner device one forward pass, and on an
//! autodiff device one graph node whose backward pass is the order's hand-written one.

#![allow(deprecated)] // the generated dispatch names NdArray, a supported CPU device

use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::tensor::FloatTensor;
use burn::backend::{Autodiff, Backend, backend_extension};

use super::{NodeChunked, backward, forward};
use crate::backend::autodiff::record_wanted;
use crate::backend::bridge::Inner;

/// The chunked HLA as one node, routed by the dispatch.
#[backend_extension(
    Autodiff,
    NdArray: cfg(feature = "ndarray"),
    Flex: cfg(feature = "flex"),
    Cube: cfg(gpu_kernels)
)]
pub(crate) trait HlaNodeOps: Backend {
    /// HLA by `node.kernels` in chunks of `node.chunk` from the state packed per head:
    /// the packed output and final state.
    fn hla_node(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        log_g: FloatTensor<Self>,
        state: FloatTensor<Self>,
        node: NodeChunked,
    ) -> FloatTensor<Self>;
}

impl<B: Inner> HlaNodeOps for B {
    fn hla_node(
        q: FloatTensor<B>,
        k: FloatTensor<B>,
        v: FloatTensor<B>,
        log_g: FloatTensor<B>,
        state: FloatTensor<B>,
        node: NodeChunked,
    ) -> FloatTensor<B> {
        forward::<B>([q, k, v, log_g, state], node, false).0
    }
}

impl<B: Inner, C: CheckpointStrategy> HlaNodeOps for Autodiff<B, C> {
    fn hla_node(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        log_g: FloatTensor<Self>,
        state: FloatTensor<Self>,
        node: NodeChunked,
    ) -> FloatTensor<Self> {
        record_wanted::<B, C, 5>(
            [q, k, v, log_g, state],
            |inputs, tracked| forward::<B>(inputs, node, tracked),
            move |saved, grad, wanted| backward::<B>(saved, grad, node, wanted),
        )
    }
}
