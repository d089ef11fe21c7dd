//! The backward kernel of [`super`] (a moment product's gradients, with its state read's
//! term of `∂Q`): one cube per chunk of every sequence and head, one unit per `per_unit`
//! tokens of the chunk (their rows in registers, [`crate::backend::gpu::rows`]).

use burn_cubecl::cubecl;
use cubecl::prelude::*;

use crate::backend::gpu::rows::{
    add_row, blend, dot, dot_at, fill, own_row, own_shared_rows, scale, shared_row, shared_strided,
    store_row,
};
use crate::hla::chunks::fused::kernel::{
    Gates, copy_in, gate_start, log_decay, own_decays, own_rows, shared_buffer, store_own_rows,
};

/// Which gradients [`grads_kernel`] adds to its inputs' (compile-time): `G A` to ∂Q's
/// terms so far, `∂A` to a term of the same gradient, with `tied` (`A = U`, as in a key
/// moment's `W K`) `∂U` to `∂A`, and with `read` the term `diag(a^p) ∂Y Xᵀ` (`… X` when
/// `transposed`) of the state `X` that `∂Y` read, to ∂Q; with `gates` it also writes the
/// log gates' gradient from the decay factors it used (the read's `a^p` and `ρ^p` with
/// `read`), with `summed` added to an earlier kernel's.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub(crate) struct Sums {
    pub(crate) q: bool,
    pub(crate) a: bool,
    pub(crate) tied: bool,
    pub(crate) read: bool,
    pub(crate) transposed: bool,
    pub(crate) gates: bool,
    pub(crate) summed: bool,
}

/// `[∂U, ∂A, G A]` of every chunk with `p = power`, one cube per block and one unit per
/// `per_unit` tokens `τ`; `n` is the width of `U` and `∂Y`. With `sums.q`, `G A` is added
/// to `dq_in` (∂Q's terms so far), with `sums.a`, `∂A` to `da_in`; with `sums.tied` (`A =
/// U`) `da` gets `∂U + ∂A` and `du` nothing; with `sums.read`, ∂Q also gets the term of the
/// state `x_start` (at every chunk's start, `[blocks, d, n]`, `[blocks, n, d]` when
/// transposed) that `∂Y` read. The gradients' sums cost no kernel of their own. With
/// `sums.gates`, `log_g [blocks, c, 1]` gets the log gates' gradient ([`store_log_gates`])
/// from `∂b_τ`, the gradient of the cumulative log gates through `e^p`, `D^p` and (with
/// the read) `a^p` and `ρ^p`; the parts through `b_last` are the last token's, whose `∂b`
/// reaches every gate of the chunk.
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
    log_g_in: &Tensor<f32>,
    du: &mut Tensor<f32>,
    da: &mut Tensor<f32>,
    dq: &mut Tensor<f32>,
    log_g: &mut Tensor<f32>,
    gates: &Gates,
    power: f32,
    #[comptime] c: usize,
    #[comptime] d: usize,
    #[comptime] n: usize,
    #[comptime] decayed: bool,
    #[comptime] sums: Sums,
    #[comptime] per_unit: usize,
) {
    let block = CUBE_POS;
    // A grid spread over its axes may hold a few more cubes than blocks.
    if block * c * d >= q.len() {
        terminate!();
    }
    let mut rows = Shared::<[f32]>::new_slice(comptime!(c * d));
    let mut buf = Shared::<[f32]>::new_slice(comptime!(shared_buffer(c, d, n)));
    let gate = gate_start(block, gates, c);
    let b_tau = own_decays(b, gate, c, per_unit, decayed);
    let a_tau = own_rows(a, block, c, d, per_unit);
    let u_tau = own_rows(u, block, c, n, per_unit);

    // diag(e^p) A X and diag(e^p) U Xᵀ: rows τ are e^p_τ Σ_i a_τi x_i· and
    // e^p_τ Σ_j u_τj x_·j.
    copy_in(x, &mut buf, block * d * n, d * n);
    let mut acc_u = Array::<f32>::new(comptime!(per_unit * n));
    let mut acc_a = Array::<f32>::new(comptime!(per_unit * d));
    #[unroll]
    for r in 0..per_unit {
        fill(&mut acc_u, r * n, n);
        fill(&mut acc_a, r * d, d);
    }
    for i in 0..d {
        let x_i = shared_row(&buf, i, n);
        #[unroll]
        for r in 0..per_unit {
            blend(&mut acc_u, r * n, 1.0f32, a_tau[r * d + i], &x_i, n);
        }
    }
    for j in 0..n {
        let x_j = shared_strided(&buf, j, n, d);
        #[unroll]
        for r in 0..per_unit {
            blend(&mut acc_a, r * d, 1.0f32, u_tau[r * n + j], &x_j, d);
        }
    }
    let b_last = log_decay(b, gate, c - 1, decayed);
    // With the gates: p ∂b_τ of the unit's tokens, and e^p's parts through b_last.
    let mut db_tau = Array::<f32>::new(per_unit);
    let mut last_tau = Array::<f32>::new(per_unit);
    #[unroll]
    for r in 0..per_unit {
        let e_p = (power * (b_last - b_tau[r])).exp();
        scale(&mut acc_u, r * n, e_p, n);
        scale(&mut acc_a, r * d, e_p, d);
        db_tau[r] = 0.0;
        last_tau[r] = 0.0;
        if sums.gates {
            // e^p_τ ∂e^p_τ: the row of diag(e^p) A X against u_τ.
            let w = power * dot_at(&acc_u, r * n, &u_tau, r * n, n);
            db_tau[r] = -w;
            last_tau[r] = w;
        }
    }
    sync_cube();

    // Tᵀ ∂Y and Gᵀ Q: columns τ of T and of G = D^p ⊙ (∂Y Uᵀ), over the tokens σ ≥ τ.
    copy_in(q, &mut rows, block * c * d, c * d);
    copy_in(dy, &mut buf, block * c * n, c * n);
    for sigma in 0..c {
        let dy_sigma = shared_row(&buf, sigma, n);
        let q_sigma = shared_row(&rows, sigma, d);
        let b_sigma = log_decay(b, gate, sigma, decayed);
        #[unroll]
        for r in 0..per_unit {
            let tau = own_row(r, c, per_unit);
            if sigma >= tau {
                let t_st = t[(block * c + sigma) * c + tau];
                blend(&mut acc_u, r * n, 1.0f32, t_st, &dy_sigma, n);
                let dy_u = dot(&u_tau, r * n, &dy_sigma, n);
                let g = (power * (b_sigma - b_tau[r])).exp() * dy_u;
                blend(&mut acc_a, r * d, 1.0f32, g, &q_sigma, d);
                if sums.gates {
                    // The mask's column τ of T ⊙ (∂Y Uᵀ).
                    db_tau[r] -= power * t_st * dy_u;
                }
            }
        }
    }
    #[unroll]
    for r in 0..per_unit {
        let row = block * c + own_row(r, c, per_unit);
        if sums.tied {
            // A = U: n = d, and ∂A's row gets ∂U's.
            #[unroll]
            for i in 0..d {
                acc_a[r * d + i] += acc_u[r * n + i];
            }
        } else {
            store_row(&acc_u, r * n, 1.0f32, du, row, n);
        }
        if sums.a {
            add_row(da_in, row, &mut acc_a, r * d, d);
        }
        store_row(&acc_a, r * d, 1.0f32, da, row, d);
    }
    let dy_tau = own_shared_rows(&buf, c, n, per_unit);
    sync_cube();

    let mut acc_q = Array::<f32>::new(comptime!(per_unit * d));
    #[unroll]
    for r in 0..per_unit {
        fill(&mut acc_q, r * d, d);
    }
    if sums.read {
        // diag(a^p) ∂Y Xᵀ: row τ is a^p_τ Σ_j ∂y_τj x_·j (x_j· when transposed).
        copy_in(x_start, &mut buf, block * d * n, d * n);
        let mut a_p = Array::<f32>::new(per_unit);
        #[unroll]
        for r in 0..per_unit {
            a_p[r] = (power * b_tau[r]).exp();
        }
        for j in 0..n {
            let mut at = j;
            if sums.transposed {
                at = j * d;
            }
            let x_j = shared_strided(&buf, at, comptime!(if sums.transposed { 1 } else { n }), d);
            #[unroll]
            for r in 0..per_unit {
                blend(
                    &mut acc_q,
                    r * d,
                    1.0f32,
                    a_p[r] * dy_tau[r * n + j],
                    &x_j,
                    d,
                );
            }
        }
        if sums.gates {
            // a^p_τ ∂a^p_τ: the read's row against q_τ (Q is still in `rows`).
            #[unroll]
            for r in 0..per_unit {
                let q_tau = shared_row(&rows, own_row(r, c, per_unit), d);
                db_tau[r] += power * dot(&acc_q, r * d, &q_tau, d);
            }
        }
        sync_cube();
    }
    if sums.q {
        #[unroll]
        for r in 0..per_unit {
            add_row(
                dq_in,
                block * c + own_row(r, c, per_unit),
                &mut acc_q,
                r * d,
                d,
            );
        }
    }

    // G A: rows τ of G over the tokens σ ≤ τ.
    copy_in(a, &mut rows, block * c * d, c * d);
    copy_in(u, &mut buf, block * c * n, c * n);
    for sigma in 0..c {
        let u_sigma = shared_row(&buf, sigma, n);
        let a_sigma = shared_row(&rows, sigma, d);
        let b_sigma = log_decay(b, gate, sigma, decayed);
        #[unroll]
        for r in 0..per_unit {
            let tau = own_row(r, c, per_unit);
            if sigma <= tau {
                let dy_u = dot(&dy_tau, r * n, &u_sigma, n);
                let g = (power * (b_tau[r] - b_sigma)).exp() * dy_u;
                blend(&mut acc_q, r * d, 1.0f32, g, &a_sigma, d);
                if sums.gates {
                    // The mask's row τ of T ⊙ (∂Y Uᵀ).
                    db_tau[r] += power * t[(block * c + tau) * c + sigma] * dy_u;
                }
            }
        }
    }
    store_own_rows(&acc_q, dq, block, c, d, per_unit);
    if sums.gates {
        let mut parts = Shared::<[f32]>::new_slice(comptime!(2 * c));
        #[unroll]
        for r in 0..per_unit {
            let tau = own_row(r, c, per_unit);
            parts[tau] = db_tau[r];
            parts[c + tau] = last_tau[r];
        }
        sync_cube();
        let (p, size) = (power, comptime!(d * n));
        store_log_gates(
            &mut parts, x, x_start, log_g_in, log_g, block, p, b_last, c, size, sums,
        );
    }
}

/// Writes the log gates' gradient into `log_g [blocks, c, 1]` from each token's part of
/// `∂b` (`parts[τ]`) and its part through `b_last` (`parts[c + τ]`) in shared memory:
/// `Σ_{τ≥s} ∂b_τ` at each token `s`, which every part through `b_last` (the last token's
/// `∂b`) reaches. With `sums.read`, the read's part through the state's whole decay
/// `ρ^p = exp(p b_last)` joins them first: `p ρ^p ⟨∂X, X'⟩`, of `X`'s gradient after the
/// chunk (`x`) and the state read at its start (`x_start`), `d · n` values each in the
/// pass's layout, a token's units taking every `c`-th; with `sums.summed`, `log_g_in` (an
/// earlier kernel's) is added.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn store_log_gates(
    parts: &mut Shared<[f32]>,
    x: &Tensor<f32>,
    x_start: &Tensor<f32>,
    log_g_in: &Tensor<f32>,
    log_g: &mut Tensor<f32>,
    block: usize,
    power: f32,
    b_last: f32,
    #[comptime] c: usize,
    #[comptime] size: usize,
    #[comptime] sums: Sums,
) {
    if sums.read {
        let rho = power * (power * b_last).exp();
        let at = block * size;
        let mut tau = UNIT_POS as usize;
        while tau < c {
            let mut dot = 0.0f32;
            let mut e = tau;
            while e < size {
                dot += x[at + e] * x_start[at + e];
                e += c;
            }
            parts[c + tau] += rho * dot;
            tau += CUBE_DIM as usize;
        }
        sync_cube();
    }
    let mut last = 0.0f32;
    for sigma in 0..c {
        last += parts[c + sigma];
    }
    let mut s = UNIT_POS as usize;
    while s < c {
        let mut sum = last;
        for tau in 0..c {
            if tau >= s {
                sum += parts[tau];
            }
        }
        if sums.summed {
            sum += log_g_in[block * c + s];
        }
        log_g[block * c + s] = sum;
        s += CUBE_DIM as usize;
    }
}
