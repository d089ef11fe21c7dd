//! The GPU chunked form as Burn backend extensions, in two layers. [`HlaGpuKernels`] is
//! one launch per method on Burn's CubeCL backend; on the fusion backend every GPU device
//! runs (`Cube = Fusion<CubeBackend>`) each call is queued as one custom op.
//! [`HlaGpuOps`] is what the router calls: the dispatch routes a GPU tensor to it, and its
//! autodiff wrapper records one graph node whose backward pass is the backward kernel.

use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::fusion::custom::TensorSpec;
use burn::backend::tensor::FloatTensor;
use burn::backend::{Autodiff, Backend, Cube, backend_extension};
use burn::tensor::Shape;
use burn_cubecl::CubeBackend;

use super::{GpuChunked, LaunchSizes, backward, forward};
use crate::backend::autodiff::record;

/// Kernel launches on a CubeCL backend. Shapes are [`forward`]'s and [`backward`]'s;
/// every tensor is f32.
#[backend_extension(Cube, Fusion)]
pub(crate) trait HlaGpuKernels: Backend {
    /// The chunked HLA of `kernel`: the packed `[o, final state]` and every chunk's start
    /// state.
    #[fusion(meta = forward_specs)]
    fn hla_forward(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        log_g: FloatTensor<Self>,
        state: FloatTensor<Self>,
        kernel: GpuChunked,
    ) -> (FloatTensor<Self>, FloatTensor<Self>);

    /// Its backward pass: `(∂q, ∂k, ∂v, ∂log g, ∂state₀)`.
    #[allow(clippy::type_complexity)]
    #[fusion(meta = backward_specs)]
    fn hla_backward(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        log_g: FloatTensor<Self>,
        starts: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        kernel: GpuChunked,
    ) -> (
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
    );
}

/// The outputs of [`HlaGpuKernels::hla_forward`] for its inputs.
fn forward_specs(
    q: &TensorSpec,
    _k: &TensorSpec,
    v: &TensorSpec,
    _log_g: &TensorSpec,
    _state: &TensorSpec,
    kernel: &GpuChunked,
) -> (TensorSpec, TensorSpec) {
    let n = LaunchSizes::new(&q.shape, &v.shape, *kernel);
    let spec = |len| TensorSpec::new(Shape::new([len]), q.dtype);
    (spec(n.packed()), spec(n.starts()))
}

/// The outputs of [`HlaGpuKernels::hla_backward`] for its inputs.
fn backward_specs(
    q: &TensorSpec,
    k: &TensorSpec,
    v: &TensorSpec,
    log_g: &TensorSpec,
    _starts: &TensorSpec,
    _grad: &TensorSpec,
    kernel: &GpuChunked,
) -> (TensorSpec, TensorSpec, TensorSpec, TensorSpec, TensorSpec) {
    let n = LaunchSizes::new(&q.shape, &v.shape, *kernel);
    let state = TensorSpec::new(Shape::new([n.state()]), q.dtype);
    (q.clone(), k.clone(), v.clone(), log_g.clone(), state)
}

impl HlaGpuKernels for CubeBackend {
    fn hla_forward(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        log_g: FloatTensor<Self>,
        state: FloatTensor<Self>,
        kernel: GpuChunked,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        forward([q, k, v, log_g, state], kernel)
    }

    fn hla_backward(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        log_g: FloatTensor<Self>,
        starts: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        kernel: GpuChunked,
    ) -> (
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
    ) {
        let [dq, dk, dv, dg, ds] = backward([q, k, v, log_g, starts], grad, kernel);
        (dq, dk, dv, dg, ds)
    }
}

/// The chunked HLA with its GPU kernels, routed by the dispatch.
#[backend_extension(Autodiff, Cube)]
pub(crate) trait HlaGpuOps: Backend {
    /// HLA by `kernel.kernels` in chunks of `kernel.chunk` from the state packed per head:
    /// the packed output and final state.
    fn hla_chunked(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        log_g: FloatTensor<Self>,
        state: FloatTensor<Self>,
        kernel: GpuChunked,
    ) -> FloatTensor<Self>;
}

impl HlaGpuOps for Cube {
    fn hla_chunked(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        log_g: FloatTensor<Self>,
        state: FloatTensor<Self>,
        kernel: GpuChunked,
    ) -> FloatTensor<Self> {
        Self::hla_forward(q, k, v, log_g, state, kernel).0
    }
}

impl<C: CheckpointStrategy> HlaGpuOps for Autodiff<Cube, C> {
    fn hla_chunked(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        log_g: FloatTensor<Self>,
        state: FloatTensor<Self>,
        kernel: GpuChunked,
    ) -> FloatTensor<Self> {
        record::<Cube, C, 5>(
            [q, k, v, log_g, state],
            |[q, k, v, log_g, state]| {
                let mut saved = vec![q.clone(), k.clone(), v.clone(), log_g.clone()];
                let (packed, starts) = Cube::hla_forward(q, k, v, log_g, state, kernel);
                saved.push(starts);
                (packed, saved)
            },
            move |saved, grad| {
                let [q, k, v, log_g, starts] = <[_; 5]>::try_from(saved)
                    .unwrap_or_else(|_| unreachable!("saved q, k, v, log g and the starts"));
                let (dq, dk, dv, dg, ds) = Cube::hla_backward(q, k, v, log_g, starts, grad, kernel);
                [dq, dk, dv, dg, ds]
            },
        )
    }
}
