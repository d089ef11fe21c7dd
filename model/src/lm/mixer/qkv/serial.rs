//! The mixer's CPU kernel of the serial recurrence, for evaluation and generation (no gradient):
//! each head's tokens one after the other (each order's `cpu::serial_head`), the
//! state updated in place. Decoding touches the whole state at every token, so the state
//! stays packed between calls (`[state | o]`, the buffer of the previous call's output) and
//! is never copied.

#![allow(deprecated)] // the generated dispatch names NdArray, a supported CPU device

use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::{Autodiff, Backend, backend_extension};

use burn::backend::TensorMetadata;
use burn::backend::tensor::FloatTensor;
use burn::prelude::*;
use burn::tensor::Shape;
use rayon::prelude::*;

use super::chunked::{QkvHla, gather, sizes};
use super::rows::divide;
use super::{scatter, transpose};
use crate::backend::Host;
use crate::backend::simd::PIECE;

/// `qkv [batch, time, 3·d]`, log gates `[gb, gh, time]` and `packed`, whose first
/// `batch · heads · state_len` floats are the state before the tokens (the rest is ignored:
/// the previous call's output) → `o [batch, time, d]` and the packed `[state | o]` after
/// them, for the next call.
pub(crate) fn forward(
    qkv: Tensor<3>,
    log_g: Tensor<3>,
    packed: Tensor<1>,
    tokens: QkvHla,
) -> (Tensor<3>, Tensor<1>) {
    let [b, t, channels] = qkv.dims();
    let d = channels / 3;
    let packed = <burn::backend::Dispatch as QkvSerialCpuOps>::qkv_serial(
        qkv.into_dispatch(),
        log_g.into_dispatch(),
        packed.into_dispatch(),
        tokens,
    );
    let packed = Tensor::<1>::from_dispatch(packed);
    let o_len = b * t * d;
    let o = packed.clone().narrow(0, packed.dims()[0] - o_len, o_len);
    (o.reshape([b, t, d]), packed)
}

/// [`forward`] on the inner backend: the state's buffer is taken over (no copy when nothing
/// else holds it) and updated in place, the outputs written after it.
pub(crate) fn kernel<B: Host>(
    [qkv, log_g, packed]: [FloatTensor<B>; 3],
    tokens: QkvHla,
) -> FloatTensor<B> {
    let (n, d) = sizes(&qkv.shape(), &log_g.shape(), &tokens);
    let (dh, dv) = (n.d, n.dv);
    let len = tokens.state_len(dh);
    let mut values = B::into_values(packed);
    values.truncate(n.sequences() * len);
    let o = {
        let (x, g) = (B::values(&qkv), B::values(&log_g));
        let head = |(i, state): (usize, &mut [f32])| {
            let at = (i / n.heads, i % n.heads);
            let x = gather(&x, at, (n.time, d, dh), &tokens, false);
            let mut o = vec![0.0; n.time * dv];
            let head = x.head(n.gates_of(&g, i));
            (tokens.kernels.serial)(&head, n.d, n.dv, state, &mut o);
            match tokens.denominator {
                Some(eps) => [divide(&o, dh, eps).0],
                None => [o],
            }
        };
        // One token of one sequence (generation) is not worth the handoff to the pool.
        let heads: Vec<[Vec<f32>; 1]> = if values.len() * n.time < PIECE {
            values.chunks_mut(len).enumerate().map(head).collect()
        } else {
            values.par_chunks_mut(len).enumerate().map(head).collect()
        };
        let [o] = transpose(heads);
        let mut out = vec![0.0; n.batch * n.time * d];
        scatter(&mut out, &[&o], (n.time, d, dh));
        out
    };
    values.extend(o);
    let len = values.len();
    B::tensor(values, Shape::new([len]))
}

/// The serial mixer from qkv as a Burn backend extension: the CPU backends run its kernel, and their
/// autodiff wrapper runs it on the inner tensors (no gradient flows through it).
#[backend_extension(
    Autodiff,
    NdArray: cfg(feature = "ndarray"),
    Flex: cfg(feature = "flex")
)]
pub(crate) trait QkvSerialCpuOps: Backend {
    /// The recurrent mixer by the serial recurrence, the state updated in place: the packed
    /// `[state | o]` ([`forward`]; no gradient flows through it).
    fn qkv_serial(
        qkv: FloatTensor<Self>,
        log_g: FloatTensor<Self>,
        packed: FloatTensor<Self>,
        tokens: QkvHla,
    ) -> FloatTensor<Self>;
}

impl<B: Host> QkvSerialCpuOps for B {
    fn qkv_serial(
        qkv: FloatTensor<B>,
        log_g: FloatTensor<B>,
        packed: FloatTensor<B>,
        t: QkvHla,
    ) -> FloatTensor<B> {
        kernel::<B>([qkv, log_g, packed], t)
    }
}

impl<B: Host, C: CheckpointStrategy> QkvSerialCpuOps for Autodiff<B, C> {
    fn qkv_serial(
        qkv: FloatTensor<Self>,
        log_g: FloatTensor<Self>,
        packed: FloatTensor<Self>,
        t: QkvHla,
    ) -> FloatTensor<Self> {
        let inner = [qkv, log_g, packed].map(|t| t.into_primitive());
        <FloatTensor<Self>>::new(kernel::<B>(inner, t))
    }
}
