//! The moments kernel of [`super`]: one cube per chunk of every sequence and head, one
//! unit per `per_unit` tokens of the chunk (their rows in registers,
//! [`crate::backend::gpu::rows`]).

use burn_cubecl::cubecl;
use cubecl::prelude::*;

use crate::backend::gpu::rows::{blend, dot, fill, own_row, scale, shared_row, shared_strided};
use crate::hla::chunks::fused::kernel::{
    Gates, copy_in, gate_start, log_decay, own_decays, own_rows, shared_buffer, store_own_rows,
};

/// The moments of every chunk, one cube per block and one unit per `per_unit` tokens `τ`.
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
    #[comptime] per_unit: usize,
) {
    let block = CUBE_POS;
    // A grid spread over its axes may hold a few more cubes than blocks.
    if block * c * d >= q.len() {
        terminate!();
    }
    let mut buf = Shared::<[f32]>::new_slice(comptime!(shared_buffer(c, d, d)));
    let gate = gate_start(block, gates, c);
    let b_tau = own_decays(b, gate, c, per_unit, decayed);
    let qt = own_rows(q, block, c, d, per_unit);
    // diag(a) Q Sᵀ: row τ is a_τ (S q_τ)ᵀ = a_τ Σ_j q_τj s_·j.
    copy_in(s, &mut buf, block * d * d, d * d);
    let mut acc = Array::<f32>::new(comptime!(per_unit * d));
    #[unroll]
    for t in 0..per_unit {
        fill(&mut acc, t * d, d);
    }
    for j in 0..d {
        let s_j = shared_strided(&buf, j, d, d);
        #[unroll]
        for t in 0..per_unit {
            blend(&mut acc, t * d, 1.0f32, qt[t * d + j], &s_j, d);
        }
    }
    #[unroll]
    for t in 0..per_unit {
        scale(&mut acc, t * d, b_tau[t].exp(), d);
    }
    sync_cube();
    // W's rows τ and W K.
    copy_in(k, &mut buf, block * c * d, c * d);
    for sigma in 0..c {
        let k_sigma = shared_row(&buf, sigma, d);
        let b_sigma = log_decay(b, gate, sigma, decayed);
        #[unroll]
        for t in 0..per_unit {
            let tau = own_row(t, c, per_unit);
            let mut wv = 0.0f32;
            if sigma <= tau {
                wv = (b_tau[t] - b_sigma).exp() * dot(&qt, t * d, &k_sigma, d);
                blend(&mut acc, t * d, 1.0f32, wv, &k_sigma, d);
            }
            w[(block * c + tau) * c + sigma] = wv;
        }
    }
    store_own_rows(&acc, a, block, c, d, per_unit);
}
