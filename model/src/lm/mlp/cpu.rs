//! The SwiGLU gate's CPU kernel on rows `[a | b]` of `2n` values: `y = silu(a) ⊙ b` with
//! `silu(a) = a σ(a)`, and its gradient `[∂a | ∂b]` with `∂a = g b σ(a) (1 + a (1 − σ(a)))`,
//! `∂b = g silu(a)`, one pass each.

#![allow(deprecated)] // the generated dispatch names NdArray, a supported CPU device

use crate::backend::autodiff::record;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::{Autodiff, Backend, backend_extension};

use burn::backend::TensorMetadata;
use burn::backend::tensor::FloatTensor;
use rayon::prelude::*;

use crate::backend::Host;
use crate::backend::simd::{self, multiversion, sigmoid};

multiversion! {
    /// `y = silu(a) ⊙ b` for every row `[a | b]` of `x`.
    fn gate(y: &mut [f32], x: &[f32], n: usize) {
        for (y, x) in y.chunks_exact_mut(n).zip(x.chunks_exact(2 * n)) {
            let (a, b) = x.split_at(n);
            for ((y, &a), &b) in y.iter_mut().zip(a).zip(b) {
                *y = a * sigmoid(a) * b;
            }
        }
    }
}

multiversion! {
    /// `[∂a | ∂b]` of every row of `x` from the rows of `g`.
    fn gate_backward(dx: &mut [f32], x: &[f32], g: &[f32], n: usize) {
        let rows = dx.chunks_exact_mut(2 * n).zip(x.chunks_exact(2 * n));
        for ((dx, x), g) in rows.zip(g.chunks_exact(n)) {
            let ((da, db), (a, b)) = (dx.split_at_mut(n), x.split_at(n));
            for i in 0..n {
                let s = sigmoid(a[i]);
                db[i] = g[i] * a[i] * s;
                da[i] = g[i] * b[i] * s * (1.0 + a[i] * (1.0 - s));
            }
        }
    }
}

/// `[x [.., 2n]]` → `y [.., n]`; saves `x`.
pub(crate) fn forward<B: Host>([x]: [FloatTensor<B>; 1]) -> (FloatTensor<B>, Vec<FloatTensor<B>>) {
    let mut shape = x.shape();
    let last = shape.num_dims() - 1;
    let n = shape[last] / 2;
    let y = {
        let x = B::values(&x);
        let mut y = vec![0.0; x.len() / 2];
        let rows = simd::rows_per_piece(2 * n);
        let pieces = y.par_chunks_mut(rows * n).zip(x.par_chunks(rows * 2 * n));
        simd::run(pieces, |(y, x)| gate(y, x, n));
        y
    };
    shape[last] = n;
    (B::tensor(y, shape), vec![x])
}

/// Saved `[x]` and `∂y [.., n]` → `[∂x [.., 2n]]`.
pub(crate) fn backward<B: Host>(
    saved: Vec<FloatTensor<B>>,
    grad: FloatTensor<B>,
) -> [FloatTensor<B>; 1] {
    let [x] = <[_; 1]>::try_from(saved).unwrap_or_else(|_| unreachable!("saved x"));
    let shape = x.shape();
    let n = shape[shape.num_dims() - 1] / 2;
    let (x, g) = (B::values(&x), B::values(&grad));
    let mut dx = vec![0.0; x.len()];
    let rows = simd::rows_per_piece(2 * n);
    let pieces = dx
        .par_chunks_mut(rows * 2 * n)
        .zip(x.par_chunks(rows * 2 * n))
        .zip(g.par_chunks(rows * n));
    simd::run(pieces, |((dx, x), g)| gate_backward(dx, x, g, n));
    [B::tensor(dx, shape)]
}

/// SwiGLU as a Burn backend extension: the CPU backends run its kernel, and their
/// autodiff wrapper records it as one graph node whose backward pass is the backward
/// kernel.
#[backend_extension(
    Autodiff,
    NdArray: cfg(feature = "ndarray"),
    Flex: cfg(feature = "flex")
)]
pub(crate) trait MlpCpuOps: Backend {
    /// `silu(a) ⊙ b` of `x = [a | b]`, [`super::swiglu`].
    fn swiglu(x: FloatTensor<Self>) -> FloatTensor<Self>;
}

impl<B: Host> MlpCpuOps for B {
    fn swiglu(x: FloatTensor<B>) -> FloatTensor<B> {
        forward::<B>([x]).0
    }
}

impl<B: Host, C: CheckpointStrategy> MlpCpuOps for Autodiff<B, C> {
    fn swiglu(x: FloatTensor<Self>) -> FloatTensor<Self> {
        record::<B, C, 1>([x], forward::<B>, backward::<B>)
    }
}
