//! The chunk kernels of AHLA on CubeCL devices ([`crate::hla::gpu`]): one cube per
//! sequence and head walks its chunks in order, the equations of [`super::cpu`]
//!
//! ```text
//! A = D ⊙ (Q Kᵀ),  B = diag(a) Q P + A V,  O = diag(a) Q E + A B
//! E ← ρ E + Kᵀ diag(e) B,  P ← ρ P + Kᵀ diag(e) V
//! ```
//!
//! and back, from the last chunk, with `∂E`, `∂P` the gradients of the state after the
//! chunk, `∂B = Aᵀ ∂O + diag(e) K ∂E` and `H = (∂O Bᵀ + ∂B Vᵀ) ⊙ D`:
//!
//! ```text
//! ∂Q = diag(a) (∂O Eᵀ + ∂B Pᵀ) + H K
//! ∂K = Hᵀ Q + diag(e) (B ∂Eᵀ + V ∂Pᵀ)
//! ∂V = Aᵀ ∂B + diag(e) K ∂P
//! ∂E ← ρ ∂E + Qᵀ diag(a) ∂O,  ∂P ← ρ ∂P + Qᵀ diag(a) ∂B
//! ```

use burn_cubecl::cubecl;
use cubecl::prelude::*;

use crate::hla::gpu::blocks::*;

/// Workspace floats of one cube, forward and backward, for chunks of `c`.
fn workspace(c: usize, d: usize, dv: usize) -> [usize; 2] {
    let chunk = 2 * c * d + c * dv + c;
    let products = c * c + c * dv;
    [
        chunk + products + c * dv + 2 * d * dv + c * d,
        chunk + products + 4 * d * dv + c * c + 3 * c * d + 6 * c * dv,
    ]
}

/// `A` and `B` of the chunk at `qw`, `kw`, `vw` (`c` tokens, `b` at `bw`) from the start
/// state `P` at `pw`, into `aw`, `bmw`.
#[cube]
#[allow(clippy::too_many_arguments)]
#[rustfmt::skip]
fn products(
    ws: &mut Tensor<f32>,
    qw: usize,
    kw: usize,
    vw: usize,
    pw: usize,
    aw: usize,
    bmw: usize,
    c: usize,
    d: usize,
    dv: usize,
    bw: usize,
) {
    matmul(ws, rows(aw, c), rows(qw, d), transposed(kw, d), c, c, d, false);
    mask(ws, aw, c, bw, 1.0);
    matmul(ws, rows(bmw, dv), rows(qw, d), rows(pw, dv), c, dv, d, false);
    scale_rows(ws, bmw, bmw, c, dv, bw, SINCE_START, 1.0);
    matmul(ws, rows(bmw, dv), rows(aw, c), rows(vw, dv), c, dv, c, true);
}

/// `[q, k, v, log g, state]` → `o` and the final state `[P | E]` into `packed`, every
/// chunk's start state into `starts`.
#[cube(launch)]
#[rustfmt::skip]
#[allow(clippy::too_many_arguments)]
pub(crate) fn forward(
    q: &Tensor<f32>,
    k: &Tensor<f32>,
    v: &Tensor<f32>,
    log_g: &Tensor<f32>,
    state: &Tensor<f32>,
    packed: &mut Tensor<f32>,
    starts: &mut Tensor<f32>,
    ws: &mut Tensor<f32>,
    n: &Dims,
) {
    let time = n.time;
    let d = n.d;
    let dv = n.dv;
    let chunk = n.chunk;
    // One cube per sequence and head; a grid spread over its axes may hold a few more.
    let sequences = ws.shape(0);
    let seq = CUBE_POS;
    if seq >= sequences {
        terminate!();
    }
    let len = 2 * d * dv;
    let chunks = time.div_ceil(chunk);
    let qw = seq * ws.stride(0);
    let kw = qw + chunk * d;
    let vw = kw + chunk * d;
    let bw = vw + chunk * dv;
    let aw = bw + chunk;
    let bmw = aw + chunk * chunk;
    let ow = bmw + chunk * dv;
    let pw = ow + chunk * dv;
    let ew = pw + d * dv;
    let ekw = ew + d * dv;
    let g0 = gates_of(seq, n);
    load(ws, pw, state, seq * len, len);
    for i in 0..chunks {
        let c0 = i * chunk;
        let c = span(i, chunk, time);
        store(starts, (seq * chunks + i) * len, ws, pw, len);
        load_chunk(ws, qw, q, k, v, log_g, seq * time + c0, g0 + c0, c, chunk, d, dv);
        products(ws, qw, kw, vw, pw, aw, bmw, c, d, dv, bw);
        // O = diag(a) Q E + A B.
        matmul(ws, rows(ow, dv), rows(qw, d), rows(ew, dv), c, dv, d, false);
        scale_rows(ws, ow, ow, c, dv, bw, SINCE_START, 1.0);
        matmul(ws, rows(ow, dv), rows(aw, c), rows(bmw, dv), c, dv, c, true);
        store(packed, (seq * time + c0) * dv, ws, ow, c * dv);
        // E ← ρ E + Kᵀ diag(e) B,  P ← ρ P + Kᵀ diag(e) V.
        scale_rows(ws, ekw, kw, c, d, bw, UNTIL_END, 1.0);
        let r = rho(ws, bw, c, 1.0);
        scale(ws, pw, len, r);
        matmul(ws, rows(ew, dv), transposed(ekw, d), rows(bmw, dv), d, dv, c, true);
        matmul(ws, rows(pw, dv), transposed(ekw, d), rows(vw, dv), d, dv, c, true);
    }
    store(packed, sequences * time * dv + seq * len, ws, pw, len);
}

/// Saved `[q, k, v, log g, starts]` and the packed gradient `[∂o, ∂state]` → `∂q`, `∂k`,
/// `∂v` and the initial state's gradient.
#[cube(launch)]
#[rustfmt::skip]
#[allow(clippy::too_many_arguments)]
pub(crate) fn backward(
    q: &Tensor<f32>,
    k: &Tensor<f32>,
    v: &Tensor<f32>,
    log_g: &Tensor<f32>,
    starts: &Tensor<f32>,
    grad: &Tensor<f32>,
    dq: &mut Tensor<f32>,
    dk: &mut Tensor<f32>,
    dv_out: &mut Tensor<f32>,
    dstate: &mut Tensor<f32>,
    ws: &mut Tensor<f32>,
    n: &Dims,
) {
    let time = n.time;
    let d = n.d;
    let dv = n.dv;
    let chunk = n.chunk;
    // One cube per sequence and head; a grid spread over its axes may hold a few more.
    let sequences = ws.shape(0);
    let seq = CUBE_POS;
    if seq >= sequences {
        terminate!();
    }
    let len = 2 * d * dv;
    let chunks = time.div_ceil(chunk);
    let qw = seq * ws.stride(0);
    let kw = qw + chunk * d;
    let vw = kw + chunk * d;
    let bw = vw + chunk * dv;
    let aw = bw + chunk;
    let bmw = aw + chunk * chunk;
    let pw = bmw + chunk * dv;
    let ew = pw + d * dv;
    let dpw = ew + d * dv;
    let dew = dpw + d * dv;
    let gw = dew + d * dv;
    let ekw = gw + chunk * dv;
    let dbw = ekw + chunk * d;
    let hm = dbw + chunk * dv;
    let agw = hm + chunk * chunk;
    let adbw = agw + chunk * dv;
    let t1 = adbw + chunk * dv;
    let dqw = t1 + chunk * dv;
    let dkw = dqw + chunk * d;
    let dvw = dkw + chunk * d;
    let g0 = gates_of(seq, n);
    load(ws, dpw, grad, sequences * time * dv + seq * len, len);
    for back in 0..chunks {
        let i = chunks - 1 - back;
        let c0 = i * chunk;
        let c = span(i, chunk, time);
        load(ws, gw, grad, (seq * time + c0) * dv, c * dv);
        load(ws, pw, starts, (seq * chunks + i) * len, len);
        load_chunk(ws, qw, q, k, v, log_g, seq * time + c0, g0 + c0, c, chunk, d, dv);
        products(ws, qw, kw, vw, pw, aw, bmw, c, d, dv, bw);
        // ∂B = Aᵀ ∂O + diag(e) K ∂E.
        scale_rows(ws, ekw, kw, c, d, bw, UNTIL_END, 1.0);
        matmul(ws, rows(dbw, dv), rows(ekw, d), rows(dew, dv), c, dv, d, false);
        matmul(ws, rows(dbw, dv), transposed(aw, c), rows(gw, dv), c, dv, c, true);
        // H = (∂O Bᵀ + ∂B Vᵀ) ⊙ D.
        matmul(ws, rows(hm, c), rows(gw, dv), transposed(bmw, dv), c, c, dv, false);
        matmul(ws, rows(hm, c), rows(dbw, dv), transposed(vw, dv), c, c, dv, true);
        mask(ws, hm, c, bw, 1.0);
        // ∂Q = diag(a) (∂O Eᵀ + ∂B Pᵀ) + H K.
        scale_rows(ws, agw, gw, c, dv, bw, SINCE_START, 1.0);
        scale_rows(ws, adbw, dbw, c, dv, bw, SINCE_START, 1.0);
        matmul(ws, rows(dqw, d), rows(agw, dv), transposed(ew, dv), c, d, dv, false);
        matmul(ws, rows(dqw, d), rows(adbw, dv), transposed(pw, dv), c, d, dv, true);
        matmul(ws, rows(dqw, d), rows(hm, c), rows(kw, d), c, d, c, true);
        // ∂K = Hᵀ Q + diag(e) (B ∂Eᵀ + V ∂Pᵀ).
        matmul(ws, rows(dkw, d), transposed(hm, c), rows(qw, d), c, d, c, false);
        scale_rows(ws, t1, bmw, c, dv, bw, UNTIL_END, 1.0);
        matmul(ws, rows(dkw, d), rows(t1, dv), transposed(dew, dv), c, d, dv, true);
        scale_rows(ws, t1, vw, c, dv, bw, UNTIL_END, 1.0);
        matmul(ws, rows(dkw, d), rows(t1, dv), transposed(dpw, dv), c, d, dv, true);
        // ∂V = Aᵀ ∂B + diag(e) K ∂P.
        matmul(ws, rows(dvw, dv), transposed(aw, c), rows(dbw, dv), c, dv, c, false);
        matmul(ws, rows(dvw, dv), rows(ekw, d), rows(dpw, dv), c, dv, d, true);
        store(dq, (seq * time + c0) * d, ws, dqw, c * d);
        store(dk, (seq * time + c0) * d, ws, dkw, c * d);
        store(dv_out, (seq * time + c0) * dv, ws, dvw, c * dv);
        // ∂E ← ρ ∂E + Qᵀ diag(a) ∂O,  ∂P ← ρ ∂P + Qᵀ diag(a) ∂B.
        let r = rho(ws, bw, c, 1.0);
        scale(ws, dpw, len, r);
        matmul(ws, rows(dew, dv), transposed(qw, d), rows(agw, dv), d, dv, c, true);
        matmul(ws, rows(dpw, dv), transposed(qw, d), rows(adbw, dv), d, dv, c, true);
    }
    store(dstate, seq * len, ws, dpw, len);
}

crate::hla::gpu::gpu_kernels!(super::state_len);
