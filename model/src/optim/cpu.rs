//! The AdamW step's CPU kernel of one parameter: the gradient's norm, then one pass that clips the
//! gradient (`g ← g · min(1, c / (‖g‖ + ε₀))`), updates the moments
//! (`m ← β₁ m + (1 − β₁) g`, `v ← β₂ v + (1 − β₂) g²`) and the parameter
//! (`p ← (1 − η λ) p − η m̂ / (√v̂ + ε)` with `m̂ = m / (1 − β₁ᵗ)`, `v̂ = v / (1 − β₂ᵗ)`), in
//! Burn's order of operations.

#![allow(deprecated)] // the generated dispatch names NdArray, a supported CPU device

use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::{Autodiff, Backend, backend_extension};

use burn::backend::TensorMetadata;
use burn::backend::tensor::FloatTensor;
use burn::optim::LearningRate;
use rayon::prelude::*;

use super::AdamW;
use crate::backend::Host;
use crate::backend::simd::{self, PIECE, dot, multiversion};

/// One step's settings: AdamW's, the learning rate and the step number `t` (from 1).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Step {
    pub(crate) adamw: AdamW,
    pub(crate) lr: LearningRate,
    pub(crate) time: usize,
}

/// The per-element constants of a step.
struct Constants {
    clip: f32,
    beta_1: f32,
    beta_2: f32,
    correction_1: f32,
    correction_2: f32,
    epsilon: f32,
    keep: f32,
    lr: f32,
}

multiversion! {
    /// The step over one piece of the parameter.
    fn update(p: &mut [f32], m: &mut [f32], v: &mut [f32], g: &[f32], k: &Constants) {
        let n = p.len();
        let (m, v, g) = (&mut m[..n], &mut v[..n], &g[..n]);
        for i in 0..n {
            let g = g[i] * k.clip;
            m[i] = m[i] * k.beta_1 + g * (1.0 - k.beta_1);
            v[i] = v[i] * k.beta_2 + g * g * (1.0 - k.beta_2);
            let m_hat = m[i] / k.correction_1;
            let v_hat = v[i] / k.correction_2;
            p[i] = p[i] * k.keep - m_hat / (v_hat.sqrt() + k.epsilon) * k.lr;
        }
    }
}

/// `‖g‖` in the 16-lane sums of [`dot`], piece by piece.
fn norm(g: &[f32]) -> f32 {
    let pieces: Vec<f32> = g.par_chunks(PIECE).map(|g| dot(g, g)).collect();
    pieces.iter().sum::<f32>().sqrt()
}

/// `(p, g, m, v)` → the updated `(p, m, v)`.
pub(crate) fn step<B: Host>(
    [p, g, m, v]: [FloatTensor<B>; 4],
    s: Step,
) -> (FloatTensor<B>, FloatTensor<B>, FloatTensor<B>) {
    let shape = p.shape();
    let a = s.adamw;
    let gv = B::values(&g);
    let [mut pv, mut mv, mut vv] = [p, m, v].map(B::into_values);
    let clip = a
        .clip_norm
        .map_or(1.0, |c| (c / (norm(&gv) + f32::MIN_POSITIVE)).min(1.0));
    let time = s.time as i32;
    let k = Constants {
        clip,
        beta_1: a.beta_1,
        beta_2: a.beta_2,
        correction_1: 1.0 - a.beta_1.powi(time),
        correction_2: 1.0 - a.beta_2.powi(time),
        epsilon: a.epsilon,
        keep: (1.0 - s.lr * a.weight_decay as f64) as f32,
        lr: s.lr as f32,
    };
    let pieces = pv
        .par_chunks_mut(PIECE)
        .zip(mv.par_chunks_mut(PIECE))
        .zip(vv.par_chunks_mut(PIECE))
        .zip(gv.par_chunks(PIECE));
    simd::run(pieces, |(((p, m), v), g)| update(p, m, v, g, &k));
    (
        B::tensor(pv, shape.clone()),
        B::tensor(mv, shape.clone()),
        B::tensor(vv, shape),
    )
}

/// The AdamW step as a Burn backend extension: the CPU backends run its kernel, and their
/// autodiff wrapper runs it on the inner tensors (no gradient flows through it).
#[backend_extension(
    Autodiff,
    NdArray: cfg(feature = "ndarray"),
    Flex: cfg(feature = "flex")
)]
pub(crate) trait AdamWCpuOps: Backend {
    /// One AdamW step of a parameter `p` with gradient `g` and moments `m`, `v`: the new
    /// `(p, m, v)` ([`crate::optim::AdamW`]; no gradient flows through it).
    fn adamw(
        p: FloatTensor<Self>,
        g: FloatTensor<Self>,
        m: FloatTensor<Self>,
        v: FloatTensor<Self>,
        step: Step,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>);
}

impl<B: Host> AdamWCpuOps for B {
    fn adamw(
        p: FloatTensor<B>,
        g: FloatTensor<B>,
        m: FloatTensor<B>,
        v: FloatTensor<B>,
        step: Step,
    ) -> (FloatTensor<B>, FloatTensor<B>, FloatTensor<B>) {
        self::step::<B>([p, g, m, v], step)
    }
}

impl<B: Host, C: CheckpointStrategy> AdamWCpuOps for Autodiff<B, C> {
    fn adamw(
        p: FloatTensor<Self>,
        g: FloatTensor<Self>,
        m: FloatTensor<Self>,
        v: FloatTensor<Self>,
        step: Step,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        // Optimizers step the inner tensors; autodiff ones take the same kernel, untracked.
        let inner = [p, g, m, v].map(|t| t.into_primitive());
        let (p, m, v) = self::step::<B>(inner, step);
        let wrap = <FloatTensor<Self>>::new;
        (wrap(p), wrap(m), wrap(v))
    }
}
