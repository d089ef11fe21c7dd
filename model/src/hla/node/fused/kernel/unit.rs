//! What one unit of [`super::grads_kernel`] holds of its chunk, and the products it
//! sums there.

use burn_cubecl::cubecl;
use cubecl::prelude::*;

use super::Sums;
use crate::backend::gpu::rows::{
    add_row, blend, dot, dot_at, fill, own_row, scale, shared_row, shared_strided, store_row,
};
use crate::hla::chunks::fused::kernel::{Gates, gate_start, log_decay, own_decays, own_rows};

/// `len` zeros in registers.
#[cube]
fn zeros(#[comptime] len: usize) -> Array<f32> {
    let mut x = Array::<f32>::new(len);
    fill(&mut x, 0, len);
    x
}

/// A chunk's widths (compile-time): `c` tokens, keys of `d`, values of `n`, `per_unit`
/// tokens a unit, and whether it decays.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) struct Widths {
    pub(super) c: usize,
    pub(super) d: usize,
    pub(super) n: usize,
    pub(super) per_unit: usize,
    pub(super) decayed: bool,
}

/// What one unit of [`super::grads_kernel`] holds of its chunk: where the chunk and its gates
/// start, the power `p` and the last token's log decay; of its own tokens `τ`, their log
/// decays `b_τ` and rows of `A` and `U`, the rows of `∂U`, `∂A` and `∂Q` it sums, and with the
/// gates `p ∂b_τ` and the parts of `∂b` through `b_last`.
#[derive(CubeType)]
pub(super) struct Unit {
    pub(super) block: usize,
    gate: usize,
    pub(super) power: f32,
    pub(super) b_last: f32,
    b_tau: Array<f32>,
    a_tau: Array<f32>,
    u_tau: Array<f32>,
    acc_u: Array<f32>,
    acc_a: Array<f32>,
    pub(super) acc_q: Array<f32>,
    pub(super) db_tau: Array<f32>,
    pub(super) last_tau: Array<f32>,
}

#[cube]
impl Unit {
    pub(super) fn new(
        a: &Tensor<f32>,
        u: &Tensor<f32>,
        b: &Tensor<f32>,
        gates: &Gates,
        block: usize,
        power: f32,
        #[comptime] w: Widths,
    ) -> Unit {
        let gate = gate_start(block, gates, w.c);
        Unit {
            block,
            gate,
            power,
            b_last: log_decay(b, gate, w.c - 1, w.decayed),
            b_tau: own_decays(b, gate, w.c, w.per_unit, w.decayed),
            a_tau: own_rows(a, block, w.c, w.d, w.per_unit),
            u_tau: own_rows(u, block, w.c, w.n, w.per_unit),
            acc_u: zeros(comptime!(w.per_unit * w.n)),
            acc_a: zeros(comptime!(w.per_unit * w.d)),
            acc_q: zeros(comptime!(w.per_unit * w.d)),
            db_tau: zeros(w.per_unit),
            last_tau: zeros(w.per_unit),
        }
    }

    /// `diag(e^p) A X` and `diag(e^p) U Xᵀ` of the state `X` after the chunk (`[d, n]` in
    /// `buf`): rows `τ` are `e^p_τ Σ_i a_τi x_i·` and `e^p_τ Σ_j u_τj x_·j`; with `gates`,
    /// `e^p_τ ∂e^p_τ` (row `τ` of `diag(e^p) A X` against `u_τ`) starts `∂b_τ` and the
    /// part through `b_last`.
    pub(super) fn state_products(
        &mut self,
        buf: &Shared<[f32]>,
        #[comptime] w: Widths,
        #[comptime] gates: bool,
    ) {
        let (d, n) = comptime!((w.d, w.n));
        for i in 0..d {
            let x_i = shared_row(buf, i, n);
            #[unroll]
            for r in 0..w.per_unit {
                blend(
                    &mut self.acc_u,
                    r * n,
                    1.0f32,
                    self.a_tau[r * d + i],
                    &x_i,
                    n,
                );
            }
        }
        for j in 0..n {
            let x_j = shared_strided(buf, j, n, d);
            #[unroll]
            for r in 0..w.per_unit {
                blend(
                    &mut self.acc_a,
                    r * d,
                    1.0f32,
                    self.u_tau[r * n + j],
                    &x_j,
                    d,
                );
            }
        }
        #[unroll]
        for r in 0..w.per_unit {
            let e_p = (self.power * (self.b_last - self.b_tau[r])).exp();
            scale(&mut self.acc_u, r * n, e_p, n);
            scale(&mut self.acc_a, r * d, e_p, d);
            if gates {
                let e_de = self.power * dot_at(&self.acc_u, r * n, &self.u_tau, r * n, n);
                self.db_tau[r] = -e_de;
                self.last_tau[r] = e_de;
            }
        }
    }

    /// `Tᵀ ∂Y` into `∂U` and `Gᵀ Q` into `∂A`: columns `τ` of `T` and of `G = D^p ⊙ (∂Y
    /// Uᵀ)` over the tokens `σ ≥ τ` (`Q` in `rows`, `∂Y` in `buf`); with `gates`, the
    /// mask's column `τ` of `T ⊙ (∂Y Uᵀ)` taken from `∂b_τ`.
    pub(super) fn column_products(
        &mut self,
        rows: &Shared<[f32]>,
        buf: &Shared<[f32]>,
        t: &Tensor<f32>,
        b: &Tensor<f32>,
        #[comptime] w: Widths,
        #[comptime] gates: bool,
    ) {
        let (c, d, n, p) = (w.c, w.d, w.n, self.power);
        for sigma in 0..c {
            let dy_sigma = shared_row(buf, sigma, n);
            let q_sigma = shared_row(rows, sigma, d);
            let b_sigma = log_decay(b, self.gate, sigma, w.decayed);
            #[unroll]
            for r in 0..w.per_unit {
                let tau = own_row(r, c, w.per_unit);
                if sigma >= tau {
                    let t_st = t[(self.block * c + sigma) * c + tau];
                    blend(&mut self.acc_u, r * n, 1.0f32, t_st, &dy_sigma, n);
                    let dy_u = dot(&self.u_tau, r * n, &dy_sigma, n);
                    let g = (p * (b_sigma - self.b_tau[r])).exp() * dy_u;
                    blend(&mut self.acc_a, r * d, 1.0f32, g, &q_sigma, d);
                    if gates {
                        self.db_tau[r] -= p * t_st * dy_u;
                    }
                }
            }
        }
    }

    /// Stores the rows of `∂U` into `du` and of `∂A` into `da`: with `sums.tied` (`A = U`,
    /// `n = d`) `∂U`'s row is added to `∂A`'s instead, with `sums.a` `da_in`'s.
    pub(super) fn store_du_da(
        &mut self,
        du: &mut Tensor<f32>,
        da: &mut Tensor<f32>,
        da_in: &Tensor<f32>,
        #[comptime] w: Widths,
        #[comptime] sums: Sums,
    ) {
        let (d, n) = comptime!((w.d, w.n));
        #[unroll]
        for r in 0..w.per_unit {
            let row = self.block * w.c + own_row(r, w.c, w.per_unit);
            if sums.tied {
                #[unroll]
                for i in 0..d {
                    self.acc_a[r * d + i] += self.acc_u[r * n + i];
                }
            } else {
                store_row(&self.acc_u, r * n, 1.0f32, du, row, n);
            }
            if sums.a {
                add_row(da_in, row, &mut self.acc_a, r * d, d);
            }
            store_row(&self.acc_a, r * d, 1.0f32, da, row, d);
        }
    }

    /// The read's term of `∂Q`, `diag(a^p) ∂Y Xᵀ` of the state `X` read at the
    /// chunk's start (in `buf`): row `τ` is `a^p_τ Σ_j ∂y_τj x_·j` (`x_j·` when
    /// `sums.transposed`); with `sums.gates`, `a^p_τ ∂a^p_τ` (that row against `q_τ`, `Q`
    /// in `rows`) added to `∂b_τ`.
    pub(super) fn read_products(
        &mut self,
        buf: &Shared<[f32]>,
        rows: &Shared<[f32]>,
        dy_tau: &Array<f32>,
        #[comptime] w: Widths,
        #[comptime] sums: Sums,
    ) {
        let (d, n) = comptime!((w.d, w.n));
        let stride = comptime!(if sums.transposed { 1 } else { n });
        let mut a_p = Array::<f32>::new(w.per_unit);
        #[unroll]
        for r in 0..w.per_unit {
            a_p[r] = (self.power * self.b_tau[r]).exp();
        }
        for j in 0..n {
            let mut at = j;
            if sums.transposed {
                at = j * d;
            }
            let x_j = shared_strided(buf, at, stride, d);
            #[unroll]
            for r in 0..w.per_unit {
                let w_j = a_p[r] * dy_tau[r * n + j];
                blend(&mut self.acc_q, r * d, 1.0f32, w_j, &x_j, d);
            }
        }
        if sums.gates {
            #[unroll]
            for r in 0..w.per_unit {
                let q_tau = shared_row(rows, own_row(r, w.c, w.per_unit), d);
                self.db_tau[r] += self.power * dot(&self.acc_q, r * d, &q_tau, d);
            }
        }
    }

    /// `G A` into `∂Q`: rows `τ` of `G` over the tokens `σ ≤ τ` (`A` in `rows`, `U` in
    /// `buf`); with `gates`, the mask's row `τ` of `T ⊙ (∂Y Uᵀ)` added to `∂b_τ`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn row_products(
        &mut self,
        rows: &Shared<[f32]>,
        buf: &Shared<[f32]>,
        t: &Tensor<f32>,
        b: &Tensor<f32>,
        dy_tau: &Array<f32>,
        #[comptime] w: Widths,
        #[comptime] gates: bool,
    ) {
        let (c, d, n, p) = (w.c, w.d, w.n, self.power);
        for sigma in 0..c {
            let u_sigma = shared_row(buf, sigma, n);
            let a_sigma = shared_row(rows, sigma, d);
            let b_sigma = log_decay(b, self.gate, sigma, w.decayed);
            #[unroll]
            for r in 0..w.per_unit {
                let tau = own_row(r, c, w.per_unit);
                if sigma <= tau {
                    let dy_u = dot(dy_tau, r * n, &u_sigma, n);
                    let g = (p * (self.b_tau[r] - b_sigma)).exp() * dy_u;
                    blend(&mut self.acc_q, r * d, 1.0f32, g, &a_sigma, d);
                    if gates {
                        self.db_tau[r] += p * t[(self.block * c + tau) * c + sigma] * dy_u;
                    }
                }
            }
        }
    }
}
