//! The causal attention's GPU kernels ([`kernel`]) as Burn backend extensions, in two
//! layers. [`AttentionGpuKernels`] is one launch per method on Burn's CubeCL backend; on
//! the fusion backend every GPU device runs (`Cube = Fusion<CubeBackend>`) each call is
//! queued as one custom op. [`AttentionGpuOps`] is what the model calls: the dispatch
//! routes a GPU tensor to it, and its autodiff wrapper records one graph node whose
//! backward pass is the backward kernel.

pub(crate) mod kernel;
mod launch;
mod plan;
pub(crate) mod tile_grads;
pub(crate) mod tiles;

pub(crate) use plan::{Pass, Plan, tensor_tiles};

use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::fusion::custom::TensorSpec;
use burn::backend::tensor::FloatTensor;
use burn::backend::{Autodiff, Backend, Cube, backend_extension};
use burn::prelude::*;
use burn::tensor::Shape;
use burn_cubecl::CubeBackend;

use crate::backend::autodiff::record;

/// Kernel launches on a CubeCL backend (shapes are [`launch::forward`]'s and
/// [`launch::backward`]'s; every tensor is f32).
#[backend_extension(Cube, Fusion)]
pub(crate) trait AttentionGpuKernels: Backend {
    /// Causal attention of queries from position `start`: `o` and every query's
    /// log-sum-exp.
    #[fusion(meta = forward_specs)]
    fn attention_forward(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        start: usize,
    ) -> (FloatTensor<Self>, FloatTensor<Self>);

    /// Its backward pass: `(∂q, ∂k, ∂v)`.
    #[fusion(meta = |q, k, v, _o, _lse, _grad, _start| (q.clone(), k.clone(), v.clone()))]
    fn attention_backward(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        o: FloatTensor<Self>,
        lse: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        start: usize,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>);
}

/// Whether the kernels can take `q`, `k`, `v`: every buffer they bind (these, `o`, the
/// log-sum-exp) fits the device ([`crate::backend::gpu::fits`]) and a tile of a few rows
/// fits its shared memory ([`plan::tile_rows`]).
pub(crate) fn fits(q: &Tensor<4>, k: &Tensor<4>, v: &Tensor<4>) -> bool {
    let ([b, h, queries, d], dv) = (q.dims(), v.dims()[3]);
    let rows = b * h * queries;
    let buffers = [q, k, v].map(|x| x.shape().num_elements());
    let device = q.device();
    crate::backend::gpu::shared_bytes(&device)
        .is_some_and(|shared| plan::tile_rows(shared, d, dv).is_some())
        && crate::backend::gpu::fits(&device, buffers.into_iter().chain([rows * dv, rows]))
}

/// The outputs of [`AttentionGpuKernels::attention_forward`] for its inputs.
fn forward_specs(
    q: &TensorSpec,
    _k: &TensorSpec,
    v: &TensorSpec,
    _start: &usize,
) -> (TensorSpec, TensorSpec) {
    let mut o = q.shape.clone();
    o[3] = v.shape[3];
    let rows = q.shape[0] * q.shape[1] * q.shape[2];
    (
        TensorSpec::new(o, q.dtype),
        TensorSpec::new(Shape::new([rows]), q.dtype),
    )
}

impl AttentionGpuKernels for CubeBackend {
    fn attention_forward(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        start: usize,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        launch::forward([q, k, v], start)
    }

    fn attention_backward(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        o: FloatTensor<Self>,
        lse: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        start: usize,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        let [dq, dk, dv] = launch::backward([q, k, v, o, lse], grad, start);
        (dq, dk, dv)
    }
}

/// Causal attention with its GPU kernels, routed by the dispatch.
#[backend_extension(Autodiff, Cube)]
pub(crate) trait AttentionGpuOps: Backend {
    /// Causal attention of queries from position `start`, [`super::causal_attention`].
    fn attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        start: usize,
    ) -> FloatTensor<Self>;
}

impl AttentionGpuOps for Cube {
    fn attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        start: usize,
    ) -> FloatTensor<Self> {
        Self::attention_forward(q, k, v, start).0
    }
}

impl<C: CheckpointStrategy> AttentionGpuOps for Autodiff<Cube, C> {
    fn attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        start: usize,
    ) -> FloatTensor<Self> {
        record::<Cube, C, 3>(
            [q, k, v],
            |[q, k, v]| {
                let (o, lse) = Cube::attention_forward(q.clone(), k.clone(), v.clone(), start);
                (o.clone(), vec![q, k, v, o, lse])
            },
            move |saved, grad| {
                let [q, k, v, o, lse] = <[_; 5]>::try_from(saved)
                    .unwrap_or_else(|_| unreachable!("saved q, k, v, o and lse"));
                let (dq, dk, dv) = Cube::attention_backward(q, k, v, o, lse, grad, start);
                [dq, dk, dv]
            },
        )
    }
}
