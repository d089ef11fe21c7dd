//! The projection's CPU kernel: `y = x W` (or `x Wᵀ` for a weight stored `[d_out, d_in]`), and its
//! gradients `∂x = g Wᵀ` and `∂W = xᵀ g` (stored transposed: `gᵀ x`), each one matmul.

#![allow(deprecated)] // the generated dispatch names NdArray, a supported CPU device

use crate::backend::autodiff::record;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::{Autodiff, Backend, backend_extension};

use burn::backend::TensorMetadata;
use burn::backend::tensor::FloatTensor;
use burn::tensor::Shape;

use crate::backend::Host;
use crate::backend::gemm::{Layout, matmul};

/// Rows, input and output width of `x [rows, d_in]` and the weight.
fn sizes(x: &Shape, weight: &Shape, transposed: bool) -> (usize, usize, usize) {
    let d_out = if transposed { weight[0] } else { weight[1] };
    (x[0], x[1], d_out)
}

/// The weight as the `d_in × d_out` right operand of `x W`.
fn weight_layout(d_in: usize, d_out: usize, transposed: bool) -> Layout {
    if transposed {
        Layout::transposed(d_in)
    } else {
        Layout::rows(d_out)
    }
}

/// `[x [rows, d_in], W]` → `y [rows, d_out]`; saves both.
pub(crate) fn forward<B: Host, const TRANSPOSED: bool>(
    [x, weight]: [FloatTensor<B>; 2],
) -> (FloatTensor<B>, Vec<FloatTensor<B>>) {
    let (rows, d_in, d_out) = sizes(&x.shape(), &weight.shape(), TRANSPOSED);
    let y = {
        let (xv, wv) = (B::values(&x), B::values(&weight));
        let mut y = vec![0.0; rows * d_out];
        let w = (&wv[..], weight_layout(d_in, d_out, TRANSPOSED));
        matmul(
            (rows, d_out, d_in),
            &mut y,
            (&xv, Layout::rows(d_in)),
            w,
            false,
        );
        y
    };
    (B::tensor(y, Shape::new([rows, d_out])), vec![x, weight])
}

/// Saved `[x, W]` and `∂y` → `[∂x, ∂W]`.
pub(crate) fn backward<B: Host, const TRANSPOSED: bool>(
    saved: Vec<FloatTensor<B>>,
    grad: FloatTensor<B>,
) -> [FloatTensor<B>; 2] {
    let [x, weight] = <[_; 2]>::try_from(saved).unwrap_or_else(|_| unreachable!("saved x and W"));
    let (x_shape, w_shape) = (x.shape(), weight.shape());
    let (rows, d_in, d_out) = sizes(&x_shape, &w_shape, TRANSPOSED);
    let (xv, wv, g) = (B::values(&x), B::values(&weight), B::values(&grad));
    // ∂x = g Wᵀ: Wᵀ is `d_out × d_in`, the stored weight read the other way round.
    let w_t = if TRANSPOSED {
        Layout::rows(d_in)
    } else {
        Layout::transposed(d_out)
    };
    let mut dx = vec![0.0; rows * d_in];
    matmul(
        (rows, d_in, d_out),
        &mut dx,
        (&g, Layout::rows(d_out)),
        (&wv, w_t),
        false,
    );
    let mut dw = vec![0.0; d_in * d_out];
    if TRANSPOSED {
        // ∂W [d_out, d_in] = gᵀ x.
        let (g_t, x) = (
            (&g[..], Layout::transposed(d_out)),
            (&xv[..], Layout::rows(d_in)),
        );
        matmul((d_out, d_in, rows), &mut dw, g_t, x, false);
    } else {
        // ∂W [d_in, d_out] = xᵀ g.
        let (x_t, g) = (
            (&xv[..], Layout::transposed(d_in)),
            (&g[..], Layout::rows(d_out)),
        );
        matmul((d_in, d_out, rows), &mut dw, x_t, g, false);
    }
    [B::tensor(dx, x_shape), B::tensor(dw, w_shape)]
}

/// The projection as a Burn backend extension: the CPU backends run its kernel, and their
/// autodiff wrapper records it as one graph node whose backward pass is the backward
/// kernel.
#[backend_extension(
    Autodiff,
    NdArray: cfg(feature = "ndarray"),
    Flex: cfg(feature = "flex")
)]
pub(crate) trait LinearCpuOps: Backend {
    /// `x W` for `x [rows, d_in]`, or `x Wᵀ` when `transposed`, [`super::project`].
    fn project(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        transposed: bool,
    ) -> FloatTensor<Self>;
}

impl<B: Host> LinearCpuOps for B {
    fn project(x: FloatTensor<B>, weight: FloatTensor<B>, transposed: bool) -> FloatTensor<B> {
        if transposed {
            forward::<B, true>([x, weight]).0
        } else {
            forward::<B, false>([x, weight]).0
        }
    }
}

impl<B: Host, C: CheckpointStrategy> LinearCpuOps for Autodiff<B, C> {
    fn project(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        transposed: bool,
    ) -> FloatTensor<Self> {
        if transposed {
            record::<B, C, 2>([x, weight], forward::<B, true>, backward::<B, true>)
        } else {
            record::<B, C, 2>([x, weight], forward::<B, false>, backward::<B, false>)
        }
    }
}
