//! The GPU kernels (the chunked HLA forms, causal attention) as Burn backend extensions,
//! in two layers.
//!
//! [`CubeKernels`] is one launch per method on Burn's CubeCL backend; on the fusion
//! backend every GPU device runs (`Cube = Fusion<CubeBackend>`) each call is queued as
//! one custom op. [`CubeOps`] is what models call: the dispatch routes a GPU tensor to
//! it, and its autodiff wrapper records one graph node whose backward pass is the
//! backward kernel (the CPU fused ops' [`super::autodiff::record`]).

use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::fusion::custom::TensorSpec;
use burn::backend::tensor::FloatTensor;
use burn::backend::{Autodiff, Backend, Cube, backend_extension};
use burn::tensor::{DType, Shape};
use burn_cubecl::CubeBackend;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;

use super::autodiff::record;
use crate::hla::cube::{self as hla_cube, Kernel, Sizes};
use crate::lm::attention;

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

/// Kernel launches on a CubeCL backend. Shapes are [`hla_cube::forward`]'s and
/// [`hla_cube::backward`]'s; every tensor is f32.
#[backend_extension(Cube, Fusion)]
pub(crate) trait CubeKernels: Backend {
    /// The chunked HLA of `kernel`: the packed `[o, final state]` and every chunk's start
    /// state.
    #[fusion(meta = forward_specs)]
    fn hla_forward(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        log_g: FloatTensor<Self>,
        state: FloatTensor<Self>,
        kernel: Kernel,
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
        kernel: Kernel,
    ) -> (
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
    );

    /// Causal attention of queries from position `start`: `o` and every query's
    /// log-sum-exp ([`attention::cube`]).
    #[fusion(meta = attention_specs)]
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

/// The outputs of [`CubeKernels::attention_forward`] for its inputs.
fn attention_specs(
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

/// The outputs of [`CubeKernels::hla_forward`] for its inputs.
fn forward_specs(
    q: &TensorSpec,
    _k: &TensorSpec,
    v: &TensorSpec,
    _log_g: &TensorSpec,
    _state: &TensorSpec,
    kernel: &Kernel,
) -> (TensorSpec, TensorSpec) {
    let n = Sizes::new(&q.shape, &v.shape, *kernel);
    let spec = |len| TensorSpec::new(Shape::new([len]), q.dtype);
    (spec(n.packed()), spec(n.starts()))
}

/// The outputs of [`CubeKernels::hla_backward`] for its inputs.
fn backward_specs(
    q: &TensorSpec,
    k: &TensorSpec,
    v: &TensorSpec,
    log_g: &TensorSpec,
    _starts: &TensorSpec,
    _grad: &TensorSpec,
    kernel: &Kernel,
) -> (TensorSpec, TensorSpec, TensorSpec, TensorSpec, TensorSpec) {
    let n = Sizes::new(&q.shape, &v.shape, *kernel);
    let state = TensorSpec::new(Shape::new([n.state()]), q.dtype);
    (q.clone(), k.clone(), v.clone(), log_g.clone(), state)
}

impl CubeKernels for CubeBackend {
    fn hla_forward(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        log_g: FloatTensor<Self>,
        state: FloatTensor<Self>,
        kernel: Kernel,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        hla_cube::forward([q, k, v, log_g, state], kernel)
    }

    fn hla_backward(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        log_g: FloatTensor<Self>,
        starts: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        kernel: Kernel,
    ) -> (
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
    ) {
        let [dq, dk, dv, dg, ds] = hla_cube::backward([q, k, v, log_g, starts], grad, kernel);
        (dq, dk, dv, dg, ds)
    }

    fn attention_forward(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        start: usize,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        attention::cube::forward([q, k, v], start)
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
        let [dq, dk, dv] = attention::cube::backward([q, k, v, o, lse], grad, start);
        (dq, dk, dv)
    }
}

/// Ops with a GPU kernel, routed by the dispatch (shapes are the callers').
#[backend_extension(Autodiff, Cube)]
pub(crate) trait CubeOps: Backend {
    /// HLA of `kernel.order` in chunks of `kernel.chunk` from the state packed per head:
    /// the packed output and final state ([`crate::hla::cube`]).
    fn hla_chunked(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        log_g: FloatTensor<Self>,
        state: FloatTensor<Self>,
        kernel: Kernel,
    ) -> FloatTensor<Self>;

    /// Causal attention of queries from position `start`,
    /// [`attention::causal_attention`].
    fn attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        start: usize,
    ) -> FloatTensor<Self>;
}

impl CubeOps for Cube {
    fn hla_chunked(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        log_g: FloatTensor<Self>,
        state: FloatTensor<Self>,
        kernel: Kernel,
    ) -> FloatTensor<Self> {
        Self::hla_forward(q, k, v, log_g, state, kernel).0
    }

    fn attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        start: usize,
    ) -> FloatTensor<Self> {
        Self::attention_forward(q, k, v, start).0
    }
}

impl<C: CheckpointStrategy> CubeOps for Autodiff<Cube, C> {
    fn hla_chunked(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        log_g: FloatTensor<Self>,
        state: FloatTensor<Self>,
        kernel: Kernel,
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
