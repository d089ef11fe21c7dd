//! RMSNorm's CPU kernel. Per row of `d` values, with `r = 1 / √(mean(x²) + ε)` and `x̂ = x r`:
//! `y = x̂ ⊙ γ`; backward, `∂x = r (g γ − x̂ · mean(g γ ⊙ x̂))` and `∂γ = Σ_rows g ⊙ x̂`.

#![allow(deprecated)] // the generated dispatch names NdArray, a supported CPU device

use crate::backend::autodiff::record;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::{Autodiff, Backend, backend_extension};

use burn::backend::TensorMetadata;
use burn::backend::tensor::FloatTensor;
use burn::tensor::Shape;
use rayon::prelude::*;

use crate::backend::Host;
use crate::backend::simd::{self, dot, multiversion};

multiversion! {
    /// `y` and `r` of every row of `x`.
    fn normalize(y: &mut [f32], r: &mut [f32], x: &[f32], gamma: &[f32], epsilon: f32) {
        let d = gamma.len();
        for ((y, r), x) in y.chunks_exact_mut(d).zip(r).zip(x.chunks_exact(d)) {
            *r = 1.0 / (dot(x, x) / d as f32 + epsilon).sqrt();
            for ((y, x), g) in y.iter_mut().zip(x).zip(gamma) {
                *y = x * *r * g;
            }
        }
    }
}

multiversion! {
    /// `∂x` of every row, and the rows' sum of `g ⊙ x̂` added to `d_gamma`.
    fn normalize_backward(
        dx: &mut [f32],
        d_gamma: &mut [f32],
        x: &[f32],
        g: &[f32],
        r: &[f32],
        gamma: &[f32],
    ) {
        let d = gamma.len();
        let (mut x_hat, mut g_gamma) = (vec![0.0; d], vec![0.0; d]);
        let rows = dx.chunks_exact_mut(d).zip(x.chunks_exact(d));
        for (((dx, x), g), &r) in rows.zip(g.chunks_exact(d)).zip(r) {
            for i in 0..d {
                x_hat[i] = x[i] * r;
                g_gamma[i] = g[i] * gamma[i];
                d_gamma[i] += g[i] * x_hat[i];
            }
            let mean = dot(&g_gamma, &x_hat) / d as f32;
            for i in 0..d {
                dx[i] = r * (g_gamma[i] - x_hat[i] * mean);
            }
        }
    }
}

/// `[x [.., d], γ [d]]` → `y`; saves `x`, `γ` and every row's `r` `[.., 1]`.
pub(crate) fn forward<B: Host>(
    [x, gamma]: [FloatTensor<B>; 2],
    epsilon: f64,
) -> (FloatTensor<B>, Vec<FloatTensor<B>>) {
    let shape = x.shape();
    let d = shape[shape.num_dims() - 1];
    let (y, r) = {
        let (x, gamma) = (B::values(&x), B::values(&gamma));
        let (mut y, mut r) = (vec![0.0; x.len()], vec![0.0; x.len() / d]);
        let rows = simd::rows_per_piece(d);
        let pieces = y
            .par_chunks_mut(rows * d)
            .zip(r.par_chunks_mut(rows))
            .zip(x.par_chunks(rows * d));
        simd::run(pieces, |((y, r), x)| {
            normalize(y, r, x, &gamma, epsilon as f32)
        });
        (y, r)
    };
    let mut row_shape = shape.clone();
    row_shape[shape.num_dims() - 1] = 1;
    let r = B::tensor(r, row_shape);
    (B::tensor(y, shape), vec![x, gamma, r])
}

/// Saved `[x, γ, r]` and `∂y` → `[∂x, ∂γ]`.
pub(crate) fn backward<B: Host>(
    saved: Vec<FloatTensor<B>>,
    grad: FloatTensor<B>,
) -> [FloatTensor<B>; 2] {
    let [x, gamma, r] =
        <[_; 3]>::try_from(saved).unwrap_or_else(|_| unreachable!("saved x, γ and r"));
    let shape = x.shape();
    let d = shape[shape.num_dims() - 1];
    let (x, gamma, r, g) = (
        B::values(&x),
        B::values(&gamma),
        B::values(&r),
        B::values(&grad),
    );
    let mut dx = vec![0.0; x.len()];
    let rows = simd::rows_per_piece(d);
    let partials: Vec<Vec<f32>> = dx
        .par_chunks_mut(rows * d)
        .zip(x.par_chunks(rows * d))
        .zip(g.par_chunks(rows * d))
        .zip(r.par_chunks(rows))
        .map(|(((dx, x), g), r)| {
            let mut d_gamma = vec![0.0; d];
            normalize_backward(dx, &mut d_gamma, x, g, r, &gamma);
            d_gamma
        })
        .collect();
    let mut d_gamma = vec![0.0; d];
    for partial in partials {
        for (total, p) in d_gamma.iter_mut().zip(partial) {
            *total += p;
        }
    }
    [B::tensor(dx, shape), B::tensor(d_gamma, Shape::new([d]))]
}

/// RMSNorm as a Burn backend extension: the CPU backends run its kernel, and their
/// autodiff wrapper records it as one graph node whose backward pass is the backward
/// kernel.
#[backend_extension(
    Autodiff,
    NdArray: cfg(feature = "ndarray"),
    Flex: cfg(feature = "flex")
)]
pub(crate) trait NormCpuOps: Backend {
    /// RMSNorm over the last dimension with gain `gamma`, [`super::rms_norm`].
    fn rms_norm(x: FloatTensor<Self>, gamma: FloatTensor<Self>, epsilon: f64) -> FloatTensor<Self>;
}

impl<B: Host> NormCpuOps for B {
    fn rms_norm(x: FloatTensor<B>, gamma: FloatTensor<B>, epsilon: f64) -> FloatTensor<B> {
        forward::<B>([x, gamma], epsilon).0
    }
}

impl<B: Host, C: CheckpointStrategy> NormCpuOps for Autodiff<B, C> {
    fn rms_norm(x: FloatTensor<Self>, gamma: FloatTensor<Self>, epsilon: f64) -> FloatTensor<Self> {
        record::<B, C, 2>(
            [x, gamma],
            |inputs| forward::<B>(inputs, epsilon),
            backward::<B>,
        )
    }
}
