//! The backward kernel of [`super`] (a moment product's gradients, with its state read's
//! term of `∂Q`): one cube per chunk of every sequence and head, one unit per `per_unit`
//! tokens of the chunk (their rows in registers, [`crate::backend::gpu::rows`]).

use burn_cubecl::cubecl;
use cubecl::prelude::*;

mod unit;

use self::unit::{Unit, Widths};
use crate::backend::gpu::rows::{add_row, own_row, own_shared_rows};
use crate::hla::chunks::fused::kernel::{Gates, copy_in, shared_buffer, store_own_rows};

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
    let w = comptime!(Widths {
        c,
        d,
        n,
        per_unit,
        decayed,
    });
    let mut rows = Shared::<[f32]>::new_slice(comptime!(c * d));
    let mut buf = Shared::<[f32]>::new_slice(comptime!(shared_buffer(c, d, n)));
    let mut unit = Unit::new(a, u, b, gates, block, power, w);

    copy_in(x, &mut buf, block * d * n, d * n);
    unit.state_products(&buf, w, sums.gates);
    sync_cube();

    copy_in(q, &mut rows, block * c * d, c * d);
    copy_in(dy, &mut buf, block * c * n, c * n);
    unit.column_products(&rows, &buf, t, b, w, sums.gates);
    unit.store_du_da(du, da, da_in, w, sums);
    let dy_tau = own_shared_rows(&buf, c, n, per_unit);
    sync_cube();

    if sums.read {
        copy_in(x_start, &mut buf, block * d * n, d * n);
        unit.read_products(&buf, &rows, &dy_tau, w, sums);
        sync_cube();
    }
    if sums.q {
        #[unroll]
        for r in 0..per_unit {
            let row = block * c + own_row(r, c, per_unit);
            add_row(dq_in, row, &mut unit.acc_q, r * d, d);
        }
    }

    copy_in(a, &mut rows, block * c * d, c * d);
    copy_in(u, &mut buf, block * c * n, c * n);
    unit.row_products(&rows, &buf, t, b, &dy_tau, w, sums.gates);
    store_own_rows(&unit.acc_q, dq, block, c, d, per_unit);
    if sums.gates {
        store_unit_gates(&unit, x, x_start, log_g_in, log_g, w, sums);
    }
}

/// The log gates' gradient from each unit's parts of `∂b` ([`Unit`]'s `db_tau` and
/// `last_tau` of its tokens), gathered in shared memory for [`store_log_gates`].
#[cube]
fn store_unit_gates(
    unit: &Unit,
    x: &Tensor<f32>,
    x_start: &Tensor<f32>,
    log_g_in: &Tensor<f32>,
    log_g: &mut Tensor<f32>,
    #[comptime] w: Widths,
    #[comptime] sums: Sums,
) {
    let c = w.c;
    let mut parts = Shared::<[f32]>::new_slice(comptime!(2 * c));
    #[unroll]
    for r in 0..w.per_unit {
        let tau = own_row(r, c, w.per_unit);
        parts[tau] = unit.db_tau[r];
        parts[c + tau] = unit.last_tau[r];
    }
    sync_cube();
    let size = comptime!(w.d * w.n);
    store_log_gates(
        &mut parts,
        x,
        x_start,
        log_g_in,
        log_g,
        unit.block,
        unit.power,
        unit.b_last,
        c,
        size,
        sums,
    );
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
