//! The row maps of the recurrent mixer's CPU kernels ([`super::chunked`]), each with its
//! gradient: the feature map of q and k, and the division by the masked denominator.

use crate::backend::simd::{dot, exp, multiversion};
use crate::lm::{FeatureMap, L2_EPS};

multiversion! {
    /// `map(x)` of every `dh`-wide row of `x` into `y`.
    pub(super) fn map_rows(map: FeatureMap, query: bool, x: &[f32], y: &mut [f32], dh: usize) {
        for (y, x) in y.chunks_exact_mut(dh).zip(x.chunks_exact(dh)) {
            map_row(map, query, x, y);
        }
    }
}

multiversion! {
    /// [`map_row_backward`] of every `dh`-wide row.
    pub(super) fn map_rows_backward(map: FeatureMap, query: bool, x: &[f32], y: &[f32], dy: &[f32], dx: &mut [f32], dh: usize) {
        let rows = dx.chunks_exact_mut(dh).zip(x.chunks_exact(dh));
        for ((dx, x), (y, dy)) in rows.zip(y.chunks_exact(dh).zip(dy.chunks_exact(dh))) {
            map_row_backward(map, query, x, y, dy, dx);
        }
    }
}

/// `map(x)` of one row of q (`query`) or k.
#[inline(always)]
fn map_row(map: FeatureMap, query: bool, x: &[f32], y: &mut [f32]) {
    match map {
        FeatureMap::L2 => {
            let norm = dot(x, x).sqrt().max(L2_EPS as f32);
            y.iter_mut().zip(x).for_each(|(y, x)| *y = x / norm);
        }
        FeatureMap::EluPlusOne => y
            .iter_mut()
            .zip(x)
            .for_each(|(y, &x)| *y = if x > 0.0 { x + 1.0 } else { exp(x) }),
        FeatureMap::Scale if query => {
            let scale = 1.0 / (x.len() as f32).sqrt();
            y.iter_mut().zip(x).for_each(|(y, x)| *y = x * scale);
        }
        FeatureMap::Scale | FeatureMap::Identity => y.copy_from_slice(x),
    }
}

/// The gradient `dx` of a row's input from that of its image `y = map(x)`.
#[inline(always)]
fn map_row_backward(
    map: FeatureMap,
    query: bool,
    x: &[f32],
    y: &[f32],
    dy: &[f32],
    dx: &mut [f32],
) {
    match map {
        FeatureMap::L2 => {
            let norm = dot(x, x).sqrt();
            if norm > L2_EPS as f32 {
                let along = dot(y, dy);
                for ((dx, dy), y) in dx.iter_mut().zip(dy).zip(y) {
                    *dx = (dy - y * along) / norm;
                }
            } else {
                dx.iter_mut()
                    .zip(dy)
                    .for_each(|(dx, dy)| *dx = dy / L2_EPS as f32);
            }
        }
        FeatureMap::EluPlusOne => {
            for (((dx, dy), &x), y) in dx.iter_mut().zip(dy).zip(x).zip(y) {
                *dx = if x > 0.0 { *dy } else { dy * y };
            }
        }
        FeatureMap::Scale if query => {
            let scale = 1.0 / (x.len() as f32).sqrt();
            dx.iter_mut().zip(dy).for_each(|(dx, dy)| *dx = dy * scale);
        }
        FeatureMap::Scale | FeatureMap::Identity => dx.copy_from_slice(dy),
    }
}

/// `sign(x) · max(|x|, eps)` with sign(0) = +1, as
/// [`crate::hla::sign_preserving_clamp`].
fn clamp(x: f32, eps: f32) -> f32 {
    if x < 0.0 { -(-x).max(eps) } else { x.max(eps) }
}

/// One head's outputs `o [time, dh + 1]` (numerators, then the denominator) → `y [time, dh]`
/// divided by the clamped denominators, and the denominators `[time]`.
pub(super) fn divide(o: &[f32], dh: usize, eps: f32) -> (Vec<f32>, Vec<f32>) {
    let mut y = Vec::with_capacity(o.len() / (dh + 1) * dh);
    let mut den = Vec::with_capacity(o.len() / (dh + 1));
    for row in o.chunks_exact(dh + 1) {
        let c = clamp(row[dh], eps);
        y.extend(row[..dh].iter().map(|x| x / c));
        den.push(row[dh]);
    }
    (y, den)
}

/// The gradient of [`divide`]'s input `[time, dh + 1]` from that of `y`: `∂y/c` for the
/// numerators, `−(∂y · y)/c` for the denominator where the clamp passes it (`|den| > eps`).
pub(super) fn divide_backward(
    g_y: &[f32],
    y: &[f32],
    den: &[f32],
    dh: usize,
    eps: f32,
) -> Vec<f32> {
    let mut g = Vec::with_capacity(den.len() * (dh + 1));
    let rows = g_y.chunks_exact(dh).zip(y.chunks_exact(dh));
    for ((g_y, y), &den) in rows.zip(den) {
        let c = clamp(den, eps);
        g.extend(g_y.iter().map(|g| g / c));
        g.push(if den.abs() > eps {
            -dot(g_y, y) / c
        } else {
            0.0
        });
    }
    g
}
