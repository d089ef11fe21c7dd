//! The moments kernel of [`super`]: one cube per chunk of every sequence and head, one
//! unit per token of the chunk.

use burn_cubecl::cubecl;
use cubecl::prelude::*;

use crate::hla::chunks::fused::kernel::{
    Gates, Token, copy_in, load_row, log_decay, shared_buffer, token,
};

/// The moments of every chunk, one cube per block and one unit per token `τ`.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn moments_kernel(
    q: &Tensor<f32>,
    k: &Tensor<f32>,
    s: &Tensor<f32>,
    b: &Tensor<f32>,
    w: &mut Tensor<f32>,
    a: &mut Tensor<f32>,
    gates: &Gates,
    #[comptime] c: usize,
    #[comptime] d: usize,
    #[comptime] decayed: bool,
) {
    let block = CUBE_POS;
    // A grid spread over its axes may hold a few more cubes than blocks.
    if block * c * d >= q.len() {
        terminate!();
    }
    let mut buf = Shared::<[f32]>::new_slice(comptime!(shared_buffer(c, d, d)));
    let Token {
        tau,
        row,
        gate,
        b_tau,
    } = token(b, block, gates, c, decayed);
    let mut qt = Array::<f32>::new(d);
    load_row(q, row, &mut qt, d);
    // diag(a) Q Sᵀ: row τ is a_τ (S q_τ)ᵀ.
    copy_in(s, &mut buf, block * d * d, d * d);
    let mut acc = Array::<f32>::new(d);
    let a_tau = b_tau.exp();
    for i in 0..d {
        let mut x = 0.0f32;
        for j in 0..d {
            x += buf[i * d + j] * qt[j];
        }
        acc[i] = a_tau * x;
    }
    sync_cube();
    // W's row τ and W K.
    copy_in(k, &mut buf, block * c * d, c * d);
    for sigma in 0..c {
        let mut wv = 0.0f32;
        if sigma <= tau {
            let mut dot = 0.0f32;
            for x in 0..d {
                dot += qt[x] * buf[sigma * d + x];
            }
            wv = (b_tau - log_decay(b, gate, sigma, decayed)).exp() * dot;
            for x in 0..d {
                acc[x] += wv * buf[sigma * d + x];
            }
        }
        w[row * c + sigma] = wv;
    }
    for x in 0..d {
        a[row * d + x] = acc[x];
    }
}
