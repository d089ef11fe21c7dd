//! The mixers' CPU kernels: from the projected (and convolved) `qkv`
//! `[batch, time, 3·d]` (q, k, v, each head after head) straight to the heads' outputs
//! `o [batch, time, d]`, so that no transposed copy of q, k, v or o is made between the
//! projections and the mixing: HLA and linear attention in chunks ([`recurrent`]) and by
//! the serial recurrence in place ([`serial`]), softmax attention with RoPE ([`attention`]).

pub(crate) mod attention;
pub(crate) mod chunked;
mod rows;
pub(crate) mod serial;

use rayon::prelude::*;

use crate::backend::simd::PIECE;

pub(crate) use chunked::QkvHla;

/// Head `h` of sequence `b`, `[time, dh]`, from token rows of `parts` blocks of `d`
/// channels (q, k, v: 3; o: 1), in block `part`.
fn head_rows(
    x: &[f32],
    (b, h): (usize, usize),
    (part, parts): (usize, usize),
    (time, d, dh): (usize, usize, usize),
) -> Vec<f32> {
    let (width, from) = (parts * d, part * d + h * dh);
    let mut rows = Vec::with_capacity(time * dh);
    for row in x[b * time * width..][..time * width].chunks_exact(width) {
        rows.extend_from_slice(&row[from..from + dh]);
    }
    rows
}

/// `out [batch, time, parts·d]` from each part's `[time, dh]` rows of every head
/// (`parts[part][i]`, heads sequence-major, head after head): the inverse of [`head_rows`].
fn scatter(out: &mut [f32], parts: &[&[Vec<f32>]], (time, d, dh): (usize, usize, usize)) {
    let h = d / dh;
    let row = |(row, out): (usize, &mut [f32])| {
        let (b, t) = (row / time, row % time);
        for (heads, out) in parts.iter().zip(out.chunks_exact_mut(d)) {
            for (head, out) in out.chunks_exact_mut(dh).enumerate() {
                out.copy_from_slice(&heads[b * h + head][t * dh..][..dh]);
            }
        }
    };
    let width = parts.len() * d;
    // A decoding step's few rows are not worth the handoff to the thread pool.
    if out.len() < PIECE {
        out.chunks_mut(width).enumerate().for_each(row);
    } else {
        out.par_chunks_mut(width).enumerate().for_each(row);
    }
}

/// Per-head results `[a, b, …]` as one list per kind `[a…], [b…], …`.
fn transpose<const N: usize>(heads: Vec<[Vec<f32>; N]>) -> [Vec<Vec<f32>>; N] {
    let mut out: [Vec<Vec<f32>>; N] = std::array::from_fn(|_| Vec::with_capacity(heads.len()));
    for head in heads {
        for (out, x) in out.iter_mut().zip(head) {
            out.push(x);
        }
    }
    out
}
