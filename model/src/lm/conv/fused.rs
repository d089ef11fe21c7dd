//! The fused short convolution and its SiLU. With the window `w` (the history, then the
//! input) and `p_t = Σ_j W_j ⊙ w_{t+j}`: `y_t = silu(p_t)`; backward, with
//! `q_t = g_t ⊙ silu'(p_t)`, `∂w_τ = Σ_j W_j ⊙ q_{τ−j}` and `∂W_j = Σ_t w_{t+j} ⊙ q_t`.

use burn::backend::TensorMetadata;
use burn::backend::tensor::FloatTensor;
use burn::tensor::Shape;
use rayon::prelude::*;

use crate::fused::Host;
use crate::fused::simd::{self, multiversion, sigmoid};

/// The sizes of one call: sequences, window length, output length, channels, kernel.
struct Sizes {
    batch: usize,
    window: usize,
    time: usize,
    channels: usize,
    kernel: usize,
}

impl Sizes {
    fn of(window: &Shape, weight: &Shape) -> Self {
        let kernel = weight[0];
        Self {
            batch: window[0],
            window: window[1],
            time: window[1] + 1 - kernel,
            channels: window[2],
            kernel,
        }
    }

    /// Offset in the window of the first input row of output row `row` (sequence-major).
    fn first_input(&self, row: usize) -> usize {
        let (sequence, t) = (row / self.time, row % self.time);
        (sequence * self.window + t) * self.channels
    }
}

/// `p_t` into `out` from the kernel's `kernel` window rows `window` (contiguous).
#[inline(always)]
fn pre_activation(window: &[f32], weight: &[f32], out: &mut [f32]) {
    let c = out.len();
    out.copy_from_slice(&window[..c]);
    for (o, w) in out.iter_mut().zip(&weight[..c]) {
        *o *= w;
    }
    for (rows, w) in window.chunks_exact(c).zip(weight.chunks_exact(c)).skip(1) {
        for ((o, x), w) in out.iter_mut().zip(rows).zip(w) {
            *o += x * w;
        }
    }
}

multiversion! {
    /// `y` for the output rows from `first` on (sequence-major).
    fn convolve_rows(y: &mut [f32], x: &[f32], w: &[f32], n: &Sizes, first: usize) {
        let c = n.channels;
        for (i, y) in y.chunks_exact_mut(c).enumerate() {
            let from = n.first_input(first + i);
            pre_activation(&x[from..from + n.kernel * c], w, y);
            for v in y.iter_mut() {
                *v *= sigmoid(*v);
            }
        }
    }
}

multiversion! {
    /// `q = g ⊙ silu'(p)` for the output rows from `first` on, and their share of `∂W`
    /// added to `dw`.
    fn scale_rows(
        q: &mut [f32],
        dw: &mut [f32],
        g: &[f32],
        x: &[f32],
        w: &[f32],
        n: &Sizes,
        first: usize,
    ) {
        let c = n.channels;
        for (i, (q, g)) in q.chunks_exact_mut(c).zip(g.chunks_exact(c)).enumerate() {
            let from = n.first_input(first + i);
            let inputs = &x[from..from + n.kernel * c];
            pre_activation(inputs, w, q);
            for (q, g) in q.iter_mut().zip(g) {
                let s = sigmoid(*q);
                *q = g * s * (1.0 + *q * (1.0 - s));
            }
            for (dw, inputs) in dw.chunks_exact_mut(c).zip(inputs.chunks_exact(c)) {
                for ((dw, x), q) in dw.iter_mut().zip(inputs).zip(q.iter()) {
                    *dw += x * q;
                }
            }
        }
    }
}

multiversion! {
    /// `∂window_τ = Σ_j W_j ⊙ q_{τ−j}` for the window rows from `first` on, over the
    /// outputs `τ − j` that exist.
    fn window_grad_rows(dx: &mut [f32], q: &[f32], w: &[f32], n: &Sizes, first: usize) {
        let c = n.channels;
        for (i, dx) in dx.chunks_exact_mut(c).enumerate() {
            let row = first + i;
            let (sequence, tau) = (row / n.window, row % n.window);
            let earliest = (tau + 1).saturating_sub(n.kernel);
            for t in earliest..tau.min(n.time - 1) + 1 {
                let q = &q[(sequence * n.time + t) * c..][..c];
                let w = &w[(tau - t) * c..][..c];
                for ((dx, q), w) in dx.iter_mut().zip(q).zip(w) {
                    *dx += q * w;
                }
            }
        }
    }
}

/// `[window [batch, kernel − 1 + time, channels], W [kernel, channels]]` → `y [batch, time,
/// channels]`; saves both inputs.
pub(crate) fn forward<B: Host>(
    [window, weight]: [FloatTensor<B>; 2],
) -> (FloatTensor<B>, Vec<FloatTensor<B>>) {
    let n = Sizes::of(&window.shape(), &weight.shape());
    let y = {
        let (x, w) = (B::values(&window), B::values(&weight));
        let c = n.channels;
        let mut y = vec![0.0; n.batch * n.time * c];
        let rows = simd::rows_per_piece(c * n.kernel);
        simd::run(y.par_chunks_mut(rows * c).enumerate(), |(piece, y)| {
            convolve_rows(y, &x, &w, &n, piece * rows)
        });
        y
    };
    let shape = Shape::new([n.batch, n.time, n.channels]);
    (B::tensor(y, shape), vec![window, weight])
}

/// Saved `[window, W]` and `∂y` → `[∂window, ∂W]`.
pub(crate) fn backward<B: Host>(
    saved: Vec<FloatTensor<B>>,
    grad: FloatTensor<B>,
) -> [FloatTensor<B>; 2] {
    let [window, weight] =
        <[_; 2]>::try_from(saved).unwrap_or_else(|_| unreachable!("saved window and W"));
    let (window_shape, weight_shape) = (window.shape(), weight.shape());
    let n = Sizes::of(&window_shape, &weight_shape);
    let (x, w, g) = (B::values(&window), B::values(&weight), B::values(&grad));
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
            scale_rows(q, &mut dw, g, &x, &w, &n, piece * rows);
            dw
        })
        .collect();
    let mut dw = vec![0.0; n.kernel * c];
    for partial in partials {
        for (total, p) in dw.iter_mut().zip(partial) {
            *total += p;
        }
    }
    let mut dx = vec![0.0; n.batch * n.window * c];
    let rows = simd::rows_per_piece(c * n.kernel);
    simd::run(dx.par_chunks_mut(rows * c).enumerate(), |(piece, dx)| {
        window_grad_rows(dx, &q, &w, &n, piece * rows)
    });
    [B::tensor(dx, window_shape), B::tensor(dw, weight_shape)]
}
