//! The head and cross-entropy's CPU kernel on CPU devices. For each block of rows:
//!
//! ```text
//! L  = x W                                  (one matmul, [rows, vocab], reused per block)
//! per row: m = max L, s = Σ exp(L − m), NLL = m + ln s − L_target, hit = argmax L = target
//! training, in place: ∂L = (exp(L − m)/s − onehot(target)) / n
//! ∂x = ∂L Wᵀ,  ∂W += xᵀ ∂L                  (two matmuls before the next block)
//! ```
//!
//! The loss is a scalar, so its gradients are computed here for a unit upstream gradient
//! and only scaled by the real one in the backward pass: the logits are computed once, and
//! what lives until the backward pass is `∂x [n, d]` and `∂W`, not `[n, vocab]` tensors.

#![allow(deprecated)] // the generated dispatch names NdArray, a supported CPU device

use crate::backend::autodiff::record_tracked;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::{Autodiff, Backend, backend_extension};

use burn::backend::TensorMetadata;
use burn::backend::tensor::FloatTensor;
use burn::tensor::Shape;
use rayon::prelude::*;

use crate::backend::Host;
use crate::backend::gemm::{Layout, matmul};
use crate::backend::simd::{self, exp, multiversion};

/// Logits per block of rows (64 MiB): enough rows for gemm to run near its peak, small
/// beside the `[rows, vocab]` tensors it replaces.
const BLOCK_LOGITS: usize = 1 << 24;

/// The rows `x [n, d]` and the head weight, `[d, vocab]` or `[vocab, d]` (`transposed`).
struct HeadRows<'a> {
    x: &'a [f32],
    w: &'a [f32],
    rows: usize,
    d: usize,
    vocab: usize,
    transposed: bool,
}

impl<'a> HeadRows<'a> {
    fn new(x: &'a [f32], w: &'a [f32], (x_shape, w_shape): (&Shape, &Shape), t: bool) -> Self {
        let vocab = if t { w_shape[0] } else { w_shape[1] };
        Self {
            x,
            w,
            rows: x_shape[0],
            d: x_shape[1],
            vocab,
            transposed: t,
        }
    }

    /// `W` as the `d × vocab` right operand of `x W`.
    fn w(&self) -> (&[f32], Layout) {
        let layout = if self.transposed {
            Layout::transposed(self.d)
        } else {
            Layout::rows(self.vocab)
        };
        (self.w, layout)
    }

    /// `Wᵀ` as the `vocab × d` right operand of `∂L Wᵀ`.
    fn w_t(&self) -> (&[f32], Layout) {
        let layout = if self.transposed {
            Layout::rows(self.d)
        } else {
            Layout::transposed(self.vocab)
        };
        (self.w, layout)
    }

    fn block_rows(&self) -> usize {
        (BLOCK_LOGITS / self.vocab.max(1)).clamp(1, self.rows.max(1))
    }
}

/// Per-row results of a pass, and the gradients of the mean loss when asked for.
struct Pass {
    nll: Vec<f32>,
    hits: Vec<bool>,
    dx: Vec<f32>,
    dw: Vec<f32>,
}

/// Scores every row of `head` against `targets` (token ids as floats), block by block;
/// with `grad`, the gradients of the mean NLL with respect to `x` and `W` too.
fn pass(head: &HeadRows, targets: &[f32], grad: bool) -> Pass {
    let (n, d, vocab) = (head.rows, head.d, head.vocab);
    let targets: Vec<usize> = targets.iter().map(|&t| t as usize).collect();
    if let Some(&bad) = targets.iter().find(|&&t| t >= vocab) {
        panic!("target {bad} is outside the vocabulary of {vocab} tokens");
    }
    let block = head.block_rows();
    let mut logits = vec![0.0; block.min(n) * vocab];
    let mut nll = vec![0.0; n];
    let mut hits = vec![false; n];
    let (mut dx, mut dw) = match grad {
        true => (vec![0.0; n * d], vec![0.0; d * vocab]),
        false => (Vec::new(), Vec::new()),
    };
    let scale = grad.then_some(1.0 / n as f32);
    for r0 in (0..n).step_by(block) {
        let r = block.min(n - r0);
        let x = &head.x[r0 * d..][..r * d];
        let logits = &mut logits[..r * vocab];
        matmul((r, vocab, d), logits, (x, Layout::rows(d)), head.w(), false);
        let span = r0..r0 + r;
        let out = (&mut nll[span.clone()], &mut hits[span.clone()]);
        score_block(logits, &targets[span], vocab, scale, out);
        if !grad {
            continue;
        }
        let dx = &mut dx[r0 * d..][..r * d];
        matmul(
            (r, d, vocab),
            dx,
            (logits, Layout::rows(vocab)),
            head.w_t(),
            false,
        );
        let (x, dl) = ((x, Layout::rows(d)), (&logits[..], Layout::rows(vocab)));
        if head.transposed {
            // ∂W [vocab, d] += ∂Lᵀ x.
            let dl_t = (&logits[..], Layout::transposed(vocab));
            matmul((vocab, d, r), &mut dw, dl_t, x, true);
        } else {
            // ∂W [d, vocab] += xᵀ ∂L.
            let x_t = (x.0, Layout::transposed(d));
            matmul((d, vocab, r), &mut dw, x_t, dl, true);
        }
    }
    Pass { nll, hits, dx, dw }
}

/// [`score_row`] of every row of a block, rows in parallel.
fn score_block(
    logits: &mut [f32],
    targets: &[usize],
    vocab: usize,
    scale: Option<f32>,
    (nll, hits): (&mut [f32], &mut [bool]),
) {
    let rows = simd::rows_per_piece(vocab);
    let pieces = logits
        .par_chunks_mut(rows * vocab)
        .zip(targets.par_chunks(rows))
        .zip(nll.par_chunks_mut(rows).zip(hits.par_chunks_mut(rows)));
    pieces.for_each(|((logits, targets), (nll, hits))| {
        score_rows(logits, targets, vocab, scale, nll, hits);
    });
}

multiversion! {
    /// Each row's NLL and hit; with `scale`, the row becomes `scale · (softmax − onehot)`.
    fn score_rows(
        logits: &mut [f32],
        targets: &[usize],
        vocab: usize,
        scale: Option<f32>,
        nll: &mut [f32],
        hits: &mut [bool],
    ) {
        let rows = logits.chunks_exact_mut(vocab).zip(targets);
        for ((row, &target), (nll, hit)) in rows.zip(nll.iter_mut().zip(hits)) {
            (*nll, *hit) = score_row(row, target, scale);
        }
    }
}

/// One row's NLL and whether its target is the (first) largest logit; with `scale`, the
/// row is overwritten by the gradient of `scale · NLL` with respect to it.
#[inline(always)]
fn score_row(row: &mut [f32], target: usize, scale: Option<f32>) -> (f32, bool) {
    let top = simd::max(row);
    let hit = row.iter().position(|&x| x == top) == Some(target);
    let target_logit = row[target];
    for x in row.iter_mut() {
        *x = exp(*x - top);
    }
    let total = simd::sum(row);
    let nll = top + total.ln() - target_logit;
    if let Some(scale) = scale {
        let f = scale / total;
        for x in row.iter_mut() {
            *x *= f;
        }
        row[target] -= scale;
    }
    (nll, hit)
}

/// The values of `x`, `W` and the targets, and the head they make.
fn with_head<B: Host, R>(
    [x, weight, targets]: &[FloatTensor<B>; 3],
    transposed: bool,
    f: impl FnOnce(&HeadRows, &[f32]) -> R,
) -> R {
    let (xv, wv, tv) = (B::values(x), B::values(weight), B::values(targets));
    let shapes = (&x.shape(), &weight.shape());
    f(&HeadRows::new(&xv, &wv, shapes, transposed), &tv)
}

/// `[x [n, d], W, targets [n]]` → `[mean NLL, hits]`; with `grad`, saves `∂x` and `∂W` of
/// the mean NLL.
pub(crate) fn forward<B: Host>(
    inputs: [FloatTensor<B>; 3],
    transposed: bool,
    grad: bool,
) -> (FloatTensor<B>, Vec<FloatTensor<B>>) {
    let (x_shape, w_shape) = (inputs[0].shape(), inputs[1].shape());
    let pass = with_head::<B, _>(&inputs, transposed, |head, t| pass(head, t, grad));
    let n = pass.nll.len();
    let loss = pass.nll.iter().map(|&l| l as f64).sum::<f64>() / n.max(1) as f64;
    let hits = pass.hits.iter().filter(|&&h| h).count();
    let out = B::tensor(vec![loss as f32, hits as f32], Shape::new([2]));
    let saved = match grad {
        true => vec![B::tensor(pass.dx, x_shape), B::tensor(pass.dw, w_shape)],
        false => Vec::new(),
    };
    (out, saved)
}

/// Saved `[∂x, ∂W]` and the gradient of `[loss, hits]` → `[∂x, ∂W, 0]` scaled by the
/// loss's gradient (the hits have none).
pub(crate) fn backward<B: Host>(
    saved: Vec<FloatTensor<B>>,
    grad: FloatTensor<B>,
) -> [FloatTensor<B>; 3] {
    let [dx, dw] = <[_; 2]>::try_from(saved).unwrap_or_else(|_| unreachable!("saved ∂x, ∂W"));
    let g = B::values(&grad)[0];
    let scaled = |t: FloatTensor<B>| {
        if g == 1.0 {
            return t;
        }
        let shape = t.shape();
        let mut values = B::into_values(t);
        values
            .par_chunks_mut(simd::PIECE)
            .for_each(|piece| piece.iter_mut().for_each(|x| *x *= g));
        B::tensor(values, shape)
    };
    let rows = dx.shape()[0];
    [
        scaled(dx),
        scaled(dw),
        B::tensor(vec![0.0; rows], Shape::new([rows])),
    ]
}

/// `[x [n, d], W, targets [n]]` → `[n, 2]`: each row's NLL and hit (1 or 0).
pub(crate) fn scores<B: Host>(inputs: [FloatTensor<B>; 3], transposed: bool) -> FloatTensor<B> {
    let pass = with_head::<B, _>(&inputs, transposed, |head, t| pass(head, t, false));
    let n = pass.nll.len();
    let rows = pass.nll.iter().zip(&pass.hits);
    let values = rows.flat_map(|(&nll, &hit)| [nll, f32::from(u8::from(hit))]);
    B::tensor(values.collect(), Shape::new([n, 2]))
}

/// The output head as a Burn backend extension: the CPU backends run its kernel, and their
/// autodiff wrapper records it as one graph node whose backward pass is the backward
/// kernel.
#[backend_extension(
    Autodiff,
    NdArray: cfg(feature = "ndarray"),
    Flex: cfg(feature = "flex")
)]
pub(crate) trait HeadCpuOps: Backend {
    /// The mean cross-entropy of the logits `x W` (`x Wᵀ` when `transposed`) of `x [n, d]`
    /// against `targets [n]` (token ids as floats) and the count of hits, `[loss, hits]`
    /// ([`super::head_loss`]).
    fn head_loss(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        targets: FloatTensor<Self>,
        transposed: bool,
    ) -> FloatTensor<Self>;

    /// Each row's negative log-likelihood and hit (1 or 0), `[n, 2]`, of the same logits
    /// ([`super::scores`]; no gradient flows through it).
    fn head_scores(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        targets: FloatTensor<Self>,
        transposed: bool,
    ) -> FloatTensor<Self>;
}

impl<B: Host> HeadCpuOps for B {
    fn head_loss(
        x: FloatTensor<B>,
        weight: FloatTensor<B>,
        targets: FloatTensor<B>,
        transposed: bool,
    ) -> FloatTensor<B> {
        forward::<B>([x, weight, targets], transposed, false).0
    }

    fn head_scores(
        x: FloatTensor<B>,
        weight: FloatTensor<B>,
        targets: FloatTensor<B>,
        transposed: bool,
    ) -> FloatTensor<B> {
        scores::<B>([x, weight, targets], transposed)
    }
}

impl<B: Host, C: CheckpointStrategy> HeadCpuOps for Autodiff<B, C> {
    fn head_loss(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        targets: FloatTensor<Self>,
        transposed: bool,
    ) -> FloatTensor<Self> {
        record_tracked::<B, C, 3>(
            [x, weight, targets],
            |inputs, grad| forward::<B>(inputs, transposed, grad),
            backward::<B>,
        )
    }

    fn head_scores(
        x: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        targets: FloatTensor<Self>,
        transposed: bool,
    ) -> FloatTensor<Self> {
        let inner = [x, weight, targets].map(|t| t.into_primitive());
        <FloatTensor<Self>>::new(scores::<B>(inner, transposed))
    }
}
