//! The backward kernel of [`super`] (a moment product's gradients, with its state read's
//! term of `∂Q`): one cube per chunk of every sequence and head, one unit per token of the
//! chunk.

use burn_cubecl::cubecl;
use cubecl::prelude::*;

use crate::hla::chunks::fused::kernel::{
    Gates, Token, copy_in, load_row, log_decay, shared_buffer, token,
};

/// Which gradients [`grads_kernel`] adds to its inputs' (compile-time): `G A` to ∂Q's
/// terms so far, `∂A` to a term of the same gradient, with `tied` (`A = U`, as in a key
/// moment's `W K`) `∂U` to `∂A`, and with `read` the term `diag(a^p) ∂Y Xᵀ` (`… X` when
/// `transposed`) of the state `X` that `∂Y` read, to ∂Q.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub(crate) struct Sums {
    pub(crate) q: bool,
    pub(crate) a: bool,
    pub(crate) tied: bool,
    pub(crate) read: bool,
    pub(crate) transposed: bool,
}

/// `[∂U, ∂A, G A]` of every chunk with `p = power`, one cube per block and one unit per
/// token `τ`; `n` is the width of `U` and `∂Y`. With `sums.q`, `G A` is added to `dq_in`
/// (∂Q's terms so far), with `sums.a`, `∂A` to `da_in`; with `sums.tied` (`A = U`) `da`
/// gets `∂U + ∂A` and `du` nothing; with `sums.read`, ∂Q also gets the term of the state
/// `x_start` (at every chunk's start, `[blocks, d, n]`, `[blocks, n, d]` when transposed)
/// that `∂Y` read. The gradients' sums cost no kernel of their own.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn grads_kernel(
    q: &Tensor<f32>,
    dy: &Tensor<f32>,
    a: &Tensor<f32>,
    u: &Tensor<f32>,
    t: &Tensor<f32>,
    x: &Tensor<f32>,
    b: &Tensor<f32>,
    dq_in: &Tensor<f32>,
    da_in: &Tensor<f32>,
    x_start: &Tensor<f32>,
    du: &mut Tensor<f32>,
    da: &mut Tensor<f32>,
    dq: &mut Tensor<f32>,
    gates: &Gates,
    power: f32,
    #[comptime] c: usize,
    #[comptime] d: usize,
    #[comptime] n: usize,
    #[comptime] decayed: bool,
    #[comptime] sums: Sums,
) {
    let block = CUBE_POS;
    // A grid spread over its axes may hold a few more cubes than blocks.
    if block * c * d >= q.len() {
        terminate!();
    }
    let mut rows = Shared::<[f32]>::new_slice(comptime!(c * d));
    let mut buf = Shared::<[f32]>::new_slice(comptime!(shared_buffer(c, d, n)));
    let Token {
        tau,
        row,
        gate,
        b_tau,
    } = token(b, block, gates, c, decayed);
    let mut a_tau = Array::<f32>::new(d);
    let mut u_tau = Array::<f32>::new(n);
    load_row(a, row, &mut a_tau, d);
    load_row(u, row, &mut u_tau, n);

    // diag(e^p) A X and diag(e^p) U Xᵀ: rows τ are e^p_τ a_τᵀ X and e^p_τ (X u_τ)ᵀ.
    copy_in(x, &mut buf, block * d * n, d * n);
    let e_p = (power * (log_decay(b, gate, c - 1, decayed) - b_tau)).exp();
    let mut acc_u = Array::<f32>::new(n);
    for j in 0..n {
        let mut sum = 0.0f32;
        for i in 0..d {
            sum += a_tau[i] * buf[i * n + j];
        }
        acc_u[j] = e_p * sum;
    }
    let mut acc_a = Array::<f32>::new(d);
    for i in 0..d {
        let mut sum = 0.0f32;
        for j in 0..n {
            sum += u_tau[j] * buf[i * n + j];
        }
        acc_a[i] = e_p * sum;
    }
    sync_cube();

    // Tᵀ ∂Y and Gᵀ Q: columns τ of T and of G = D^p ⊙ (∂Y Uᵀ), over the tokens σ ≥ τ.
    copy_in(q, &mut rows, block * c * d, c * d);
    copy_in(dy, &mut buf, block * c * n, c * n);
    for sigma in 0..c {
        if sigma >= tau {
            let t_st = t[(block * c + sigma) * c + tau];
            let mut dot = 0.0f32;
            for j in 0..n {
                let dy_sj = buf[sigma * n + j];
                dot += dy_sj * u_tau[j];
                acc_u[j] += t_st * dy_sj;
            }
            let g = (power * (log_decay(b, gate, sigma, decayed) - b_tau)).exp() * dot;
            for i in 0..d {
                acc_a[i] += g * rows[sigma * d + i];
            }
        }
    }
    if sums.tied {
        // A = U: n = d, and ∂A's row gets ∂U's.
        for i in 0..d {
            acc_a[i] += acc_u[i];
        }
    } else {
        for j in 0..n {
            du[row * n + j] = acc_u[j];
        }
    }
    for i in 0..d {
        let mut sum = acc_a[i];
        if sums.a {
            sum += da_in[row * d + i];
        }
        da[row * d + i] = sum;
    }
    let mut dy_tau = Array::<f32>::new(n);
    for j in 0..n {
        dy_tau[j] = buf[tau * n + j];
    }
    sync_cube();

    // G A: row τ of G over the tokens σ ≤ τ.
    copy_in(a, &mut rows, block * c * d, c * d);
    copy_in(u, &mut buf, block * c * n, c * n);
    let mut acc_q = Array::<f32>::new(d);
    for i in 0..d {
        let mut start = 0.0f32;
        if sums.q {
            start = dq_in[row * d + i];
        }
        acc_q[i] = start;
    }
    for sigma in 0..c {
        if sigma <= tau {
            let mut dot = 0.0f32;
            for j in 0..n {
                dot += dy_tau[j] * buf[sigma * n + j];
            }
            let g = (power * (b_tau - log_decay(b, gate, sigma, decayed))).exp() * dot;
            for i in 0..d {
                acc_q[i] += g * rows[sigma * d + i];
            }
        }
    }
    if sums.read {
        // diag(a^p) ∂Y Xᵀ: row τ is a^p_τ Σ_j ∂y_τj x_{·j} (x_{j·} when transposed).
        sync_cube();
        copy_in(x_start, &mut buf, block * d * n, d * n);
        let a_p = (power * b_tau).exp();
        for i in 0..d {
            let mut sum = 0.0f32;
            for j in 0..n {
                let mut at = i * n + j;
                if sums.transposed {
                    at = j * d + i;
                }
                sum += dy_tau[j] * buf[at];
            }
            acc_q[i] += a_p * sum;
        }
    }
    for i in 0..d {
        dq[row * d + i] = acc_q[i];
    }
}
