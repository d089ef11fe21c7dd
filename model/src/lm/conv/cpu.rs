//! The short convolution's CPU kernel and its SiLU. With the window `w` (the history, then the
//! input) and `p_t = Σ_j W_j ⊙ w_{t+j}`: `y_t = silu(p_t)`; backward, with
//! `q_t = g_t ⊙ silu'(p_t)`, `∂w_τ = Σ_j W_j ⊙ q_{τ−j}` and `∂W_j = Σ_t w_{t+j} ⊙ q_t`.
//! The window is never built: its rows are read from the history and the input where
//! they are, and an empty history stands for zeros.

#![allow(deprecated)] // the generated dispatch names NdArray, a supported CPU device

use crate::backend::autodiff::record;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::{Autodiff, Backend, backend_extension};

use burn::backend::TensorMetadata;
use burn::backend::tensor::FloatTensor;
use burn::tensor::Shape;
use rayon::prelude::*;

use crate::backend::Host;
use crate::backend::simd::{self, multiversion, sigmoid};

/// The sizes of one call.
struct ConvSizes {
    batch: usize,
    time: usize,
    channels: usize,
    kernel: usize,
    /// Rows of history per sequence: `kernel − 1`, or 0 for zeros.
    history: usize,
}

impl ConvSizes {
    fn of(x: &Shape, history: &Shape, weight: &Shape) -> Self {
        Self {
            batch: x[0],
            time: x[1],
            channels: x[2],
            kernel: weight[0],
            history: history[1],
        }
    }

    /// Window rows per sequence.
    fn window(&self) -> usize {
        self.time + self.kernel - 1
    }
}

/// The window rows of one sequence: the history (or zeros), then the input.
struct Window<'a> {
    x: &'a [f32],
    history: &'a [f32],
    zeros: Vec<f32>,
    n: &'a ConvSizes,
}

impl<'a> Window<'a> {
    fn new(x: &'a [f32], history: &'a [f32], n: &'a ConvSizes) -> Self {
        let zeros = vec![0.0; n.channels];
        Self {
            x,
            history,
            zeros,
            n,
        }
    }

    /// Window row `tau` of `sequence`.
    #[inline(always)]
    fn row(&self, sequence: usize, tau: usize) -> &[f32] {
        let (n, c) = (self.n, self.n.channels);
        let lead = n.kernel - 1;
        if tau >= lead {
            &self.x[(sequence * n.time + tau - lead) * c..][..c]
        } else if n.history > 0 {
            &self.history[(sequence * lead + tau) * c..][..c]
        } else {
            &self.zeros
        }
    }
}

/// `p_t` into `out` for output row `t` of `sequence`.
#[inline(always)]
fn pre_activation(out: &mut [f32], w: &Window, weight: &[f32], sequence: usize, t: usize) {
    out.fill(0.0);
    for (j, wj) in weight.chunks_exact(out.len()).enumerate() {
        for ((o, x), wj) in out.iter_mut().zip(w.row(sequence, t + j)).zip(wj) {
            *o += x * wj;
        }
    }
}

multiversion! {
    /// `y` for the output rows from `first` on (sequence-major).
    fn convolve_rows(y: &mut [f32], w: &Window, weight: &[f32], first: usize) {
        let n = w.n;
        for (i, y) in y.chunks_exact_mut(n.channels).enumerate() {
            let row = first + i;
            pre_activation(y, w, weight, row / n.time, row % n.time);
            for v in y.iter_mut() {
                *v *= sigmoid(*v);
            }
        }
    }
}

multiversion! {
    /// `q = g ⊙ silu'(p)` for the output rows from `first` on, and their share of `∂W`
    /// added to `dw`.
    fn scale_rows(q: &mut [f32], dw: &mut [f32], g: &[f32], w: &Window, weight: &[f32], first: usize) {
        let (n, c) = (w.n, w.n.channels);
        for (i, (q, g)) in q.chunks_exact_mut(c).zip(g.chunks_exact(c)).enumerate() {
            let (sequence, t) = ((first + i) / n.time, (first + i) % n.time);
            pre_activation(q, w, weight, sequence, t);
            for (q, g) in q.iter_mut().zip(g) {
                let s = sigmoid(*q);
                *q = g * s * (1.0 + *q * (1.0 - s));
            }
            for (j, dw) in dw.chunks_exact_mut(c).enumerate() {
                for ((dw, x), q) in dw.iter_mut().zip(w.row(sequence, t + j)).zip(q.iter()) {
                    *dw += x * q;
                }
            }
        }
    }
}

multiversion! {
    /// `∂window_τ = Σ_j W_j ⊙ q_{τ−j}` for the window rows from `first` on (sequence-major),
    /// over the outputs `τ − j` that exist.
    fn window_grad_rows(dx: &mut [f32], q: &[f32], weight: &[f32], n: &ConvSizes, first: usize) {
        let c = n.channels;
        for (i, dx) in dx.chunks_exact_mut(c).enumerate() {
            let row = first + i;
            let (sequence, tau) = (row / n.window(), row % n.window());
            let earliest = (tau + 1).saturating_sub(n.kernel);
            for t in earliest..tau.min(n.time - 1) + 1 {
                let q = &q[(sequence * n.time + t) * c..][..c];
                let w = &weight[(tau - t) * c..][..c];
                for ((dx, q), w) in dx.iter_mut().zip(q).zip(w) {
                    *dx += q * w;
                }
            }
        }
    }
}

/// `[x [batch, time, channels], history [batch, kernel − 1 or 0, channels], W [kernel,
/// channels]]` → `y [batch, time, channels]`; saves the inputs.
pub(crate) fn forward<B: Host>(
    [x, history, weight]: [FloatTensor<B>; 3],
) -> (FloatTensor<B>, Vec<FloatTensor<B>>) {
    let n = ConvSizes::of(&x.shape(), &history.shape(), &weight.shape());
    let y = {
        let (xv, hv, w) = (B::values(&x), B::values(&history), B::values(&weight));
        let window = Window::new(&xv, &hv, &n);
        let c = n.channels;
        let mut y = vec![0.0; n.batch * n.time * c];
        let rows = simd::rows_per_piece(c * n.kernel);
        simd::run(y.par_chunks_mut(rows * c).enumerate(), |(piece, y)| {
            convolve_rows(y, &window, &w, piece * rows)
        });
        y
    };
    let shape = Shape::new([n.batch, n.time, n.channels]);
    (B::tensor(y, shape), vec![x, history, weight])
}

/// Saved `[x, history, W]` and `∂y` → `[∂x, ∂history, ∂W]`.
pub(crate) fn backward<B: Host>(
    saved: Vec<FloatTensor<B>>,
    grad: FloatTensor<B>,
) -> [FloatTensor<B>; 3] {
    let [x, history, weight] =
        <[_; 3]>::try_from(saved).unwrap_or_else(|_| unreachable!("saved x, history and W"));
    let (x_shape, history_shape, weight_shape) = (x.shape(), history.shape(), weight.shape());
    let n = ConvSizes::of(&x_shape, &history_shape, &weight_shape);
    let (xv, hv, w, g) = (
        B::values(&x),
        B::values(&history),
        B::values(&weight),
        B::values(&grad),
    );
    let window = Window::new(&xv, &hv, &n);
    let c = n.channels;
    // q = g ⊙ silu'(p), and each piece's share of ∂W.
    let mut q = vec![0.0; n.batch * n.time * c];
    let rows = simd::rows_per_piece(c * n.kernel);
    let partials: Vec<Vec<f32>> = q
        .par_chunks_mut(rows * c)
        .zip(g.par_chunks(rows * c))
        .enumerate()
        .map(|(piece, (q, g))| {
            let mut dw = vec![0.0; n.kernel * c];
            scale_rows(q, &mut dw, g, &window, &w, piece * rows);
            dw
        })
        .collect();
    let mut dw = vec![0.0; n.kernel * c];
    for partial in partials {
        for (total, p) in dw.iter_mut().zip(partial) {
            *total += p;
        }
    }
    let mut d_window = vec![0.0; n.batch * n.window() * c];
    simd::run(
        d_window.par_chunks_mut(rows * c).enumerate(),
        |(piece, dx)| window_grad_rows(dx, &q, &w, &n, piece * rows),
    );
    // The window's gradient split back into the history's and the input's.
    let lead = n.kernel - 1;
    let (mut dx, mut dh) = (Vec::with_capacity(xv.len()), Vec::with_capacity(hv.len()));
    for sequence in d_window.chunks_exact(n.window() * c) {
        let (before, input) = sequence.split_at(lead * c);
        if n.history > 0 {
            dh.extend_from_slice(before);
        }
        dx.extend_from_slice(input);
    }
    [
        B::tensor(dx, x_shape),
        B::tensor(dh, history_shape),
        B::tensor(dw, weight_shape),
    ]
}

/// The short convolution as a Burn backend extension: the CPU backends run its kernel, and their
/// autodiff wrapper records it as one graph node whose backward pass is the backward
/// kernel.
#[backend_extension(
    Autodiff,
    NdArray: cfg(feature = "ndarray"),
    Flex: cfg(feature = "flex")
)]
pub(crate) trait ConvCpuOps: Backend {
    /// The short causal convolution and its SiLU over `history` (empty: zeros) then `x`,
    /// [`super::convolve`].
    fn short_conv(
        x: FloatTensor<Self>,
        history: FloatTensor<Self>,
        weight: FloatTensor<Self>,
    ) -> FloatTensor<Self>;
}

impl<B: Host> ConvCpuOps for B {
    fn short_conv(
        x: FloatTensor<B>,
        history: FloatTensor<B>,
        weight: FloatTensor<B>,
    ) -> FloatTensor<B> {
        forward::<B>([x, history, weight]).0
    }
}

impl<B: Host, C: CheckpointStrategy> ConvCpuOps for Autodiff<B, C> {
    fn short_conv(
        x: FloatTensor<Self>,
        history: FloatTensor<Self>,
        weight: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        record::<B, C, 3>([x, history, weight], forward::<B>, backward::<B>)
    }
}
