//! The fused SwiGLU gate: `y = silu(a) ⊙ b` with `silu(a) = a σ(a)`, and its gradients
//! `∂a = g b σ(a) (1 + a (1 − σ(a)))`, `∂b = g silu(a)`, one pass each.

use burn::backend::TensorMetadata;
use burn::backend::tensor::FloatTensor;
use rayon::prelude::*;

use crate::fused::Host;
use crate::fused::simd::{self, PIECE};

/// `[a, b]` → `y`; saves `a` and `b`.
pub(crate) fn forward<B: Host>(
    [a, b]: [FloatTensor<B>; 2],
) -> (FloatTensor<B>, Vec<FloatTensor<B>>) {
    let shape = a.shape();
    let y = {
        let (a, b) = (B::values(&a), B::values(&b));
        let mut y = vec![0.0; a.len()];
        let pieces = y
            .par_chunks_mut(PIECE)
            .zip(a.par_chunks(PIECE))
            .zip(b.par_chunks(PIECE));
        simd::run(pieces, |((y, a), b)| {
            for ((y, &a), &b) in y.iter_mut().zip(a).zip(b) {
                *y = a * simd::sigmoid(a) * b;
            }
        });
        y
    };
    (B::tensor(y, shape), vec![a, b])
}

/// Saved `[a, b]` and `∂y` → `[∂a, ∂b]`.
pub(crate) fn backward<B: Host>(
    saved: Vec<FloatTensor<B>>,
    grad: FloatTensor<B>,
) -> [FloatTensor<B>; 2] {
    let [a, b] = <[_; 2]>::try_from(saved).unwrap_or_else(|_| unreachable!("saved a and b"));
    let shape = a.shape();
    let (a, b, g) = (B::values(&a), B::values(&b), B::values(&grad));
    let (mut da, mut db) = (vec![0.0; a.len()], vec![0.0; a.len()]);
    let pieces = da
        .par_chunks_mut(PIECE)
        .zip(db.par_chunks_mut(PIECE))
        .zip(a.par_chunks(PIECE))
        .zip(b.par_chunks(PIECE))
        .zip(g.par_chunks(PIECE));
    simd::run(pieces, |((((da, db), a), b), g)| {
        let n = a.len();
        let (db, b, g) = (&mut db[..n], &b[..n], &g[..n]);
        for (i, da) in da[..n].iter_mut().enumerate() {
            let s = simd::sigmoid(a[i]);
            db[i] = g[i] * a[i] * s;
            *da = g[i] * b[i] * s * (1.0 + a[i] * (1.0 - s));
        }
    });
    [B::tensor(da, shape.clone()), B::tensor(db, shape)]
}
