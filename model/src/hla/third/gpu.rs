//! The chunk kernels of third order (D1) on CubeCL devices ([`crate::hla::gpu`]): one cube
//! per sequence and head walks its chunks in order, the equations of [`super::cpu`]
//!
//! ```text
//! W = D ⊙ (Q Kᵀ),  A = diag(a) Q Sᵀ + W K,  B = diag(a) Q P + W V,  T = (Q Aᵀ) ⊙ D³
//! O = diag(a³) Q Y + T B
//! Y ← ρ³ Y + Aᵀ diag(e³) B,  S ← ρ S + Kᵀ diag(e) K,  P ← ρ P + Kᵀ diag(e) V
//! ```
//!
//! and back, from the last chunk, with `∂S`, `∂P`, `∂Y` the gradients of the state after
//! the chunk, `G = (∂O Bᵀ) ⊙ D³` and `H = (∂A Kᵀ + ∂B Vᵀ) ⊙ D`:
//!
//! ```text
//! ∂B = Tᵀ ∂O + diag(e³) A ∂Y,  ∂A = Gᵀ Q + diag(e³) B ∂Yᵀ
//! ∂Q = diag(a³) ∂O Yᵀ + G A + diag(a) (∂A S + ∂B Pᵀ) + H K
//! ∂K = Wᵀ ∂A + Hᵀ Q + diag(e) K (∂S + ∂Sᵀ) + diag(e) V ∂Pᵀ
//! ∂V = Wᵀ ∂B + diag(e) K ∂P
//! ∂Y ← ρ³ ∂Y + Qᵀ diag(a³) ∂O,  ∂S ← ρ ∂S + (diag(a) ∂A)ᵀ Q,  ∂P ← ρ ∂P + Qᵀ diag(a) ∂B
//! ```

use burn_cubecl::cubecl;
use cubecl::prelude::*;

use crate::hla::gpu::blocks::*;

/// Workspace floats of one cube, forward and backward, for chunks of `c`.
fn workspace(c: usize, d: usize, dv: usize) -> [usize; 2] {
    let chunk = 2 * c * d + c * dv + c;
    let products = 2 * c * c + c * d + c * dv;
    let state = d * d + 2 * d * dv;
    [
        chunk + products + 2 * c * dv + state + c * d,
        chunk + products + 2 * state + 2 * c * c + 5 * c * d + 6 * c * dv,
    ]
}

/// `W`, `A`, `B` and `T` of the chunk at `qw`, `kw`, `vw` (`c` tokens, `b` at `bw`) from
/// the start states `S` at `sw` and `P` after it, into `ww` and the three after it (each
/// sized for chunks of `chunk`).
#[cube]
#[allow(clippy::too_many_arguments)]
#[rustfmt::skip]
fn products(ws: &mut Tensor<f32>, qw: usize, kw: usize, vw: usize, sw: usize, ww: usize, c: usize, chunk: usize, d: usize, dv: usize, bw: usize) {
    let pw = sw + d * d;
    let aw = ww + chunk * chunk;
    let bmw = aw + chunk * d;
    let tw = bmw + chunk * dv;
    matmul(ws, rows(ww, c), rows(qw, d), transposed(kw, d), c, c, d, false);
    mask(ws, ww, c, bw, 1.0);
    matmul(ws, rows(aw, d), rows(qw, d), transposed(sw, d), c, d, d, false);
    scale_rows(ws, aw, aw, c, d, bw, SINCE_START, 1.0);
    matmul(ws, rows(aw, d), rows(ww, c), rows(kw, d), c, d, c, true);
    matmul(ws, rows(bmw, dv), rows(qw, d), rows(pw, dv), c, dv, d, false);
    scale_rows(ws, bmw, bmw, c, dv, bw, SINCE_START, 1.0);
    matmul(ws, rows(bmw, dv), rows(ww, c), rows(vw, dv), c, dv, c, true);
    matmul(ws, rows(tw, c), rows(qw, d), transposed(aw, d), c, c, d, false);
    mask(ws, tw, c, bw, 3.0);
}

/// `[q, k, v, log g, state]` → `o` and the final state `[S | P | Y]` into `packed`, every
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
    let len = d * d + 2 * d * dv;
    let chunks = time.div_ceil(chunk);
    let qw = seq * ws.stride(0);
    let kw = qw + chunk * d;
    let vw = kw + chunk * d;
    let bw = vw + chunk * dv;
    let ww = bw + chunk;
    let aw = ww + chunk * chunk;
    let bmw = aw + chunk * d;
    let tw = bmw + chunk * dv;
    let ow = tw + chunk * chunk;
    let sw = ow + chunk * dv;
    let pw = sw + d * d;
    let yw = pw + d * dv;
    let e3bw = yw + d * dv;
    let ekw = e3bw + chunk * dv;
    let g0 = gates_of(seq, n);
    load(ws, sw, state, seq * len, len);
    for i in 0..chunks {
        let c0 = i * chunk;
        let c = span(i, chunk, time);
        store(starts, (seq * chunks + i) * len, ws, sw, len);
        load_chunk(ws, qw, q, k, v, log_g, seq * time + c0, g0 + c0, c, chunk, d, dv);
        products(ws, qw, kw, vw, sw, ww, c, chunk, d, dv, bw);
        // O = diag(a³) Q Y + T B.
        matmul(ws, rows(ow, dv), rows(qw, d), rows(yw, dv), c, dv, d, false);
        scale_rows(ws, ow, ow, c, dv, bw, SINCE_START, 3.0);
        matmul(ws, rows(ow, dv), rows(tw, c), rows(bmw, dv), c, dv, c, true);
        store(packed, (seq * time + c0) * dv, ws, ow, c * dv);
        // Y ← ρ³ Y + Aᵀ diag(e³) B,  S ← ρ S + Kᵀ diag(e) K,  P ← ρ P + Kᵀ diag(e) V.
        scale_rows(ws, e3bw, bmw, c, dv, bw, UNTIL_END, 3.0);
        scale_rows(ws, ekw, kw, c, d, bw, UNTIL_END, 1.0);
        let r = rho(ws, bw, c, 1.0);
        scale(ws, sw, d * d + d * dv, r);
        scale(ws, yw, d * dv, r * r * r);
        matmul(ws, rows(yw, dv), transposed(aw, d), rows(e3bw, dv), d, dv, c, true);
        matmul(ws, rows(sw, d), transposed(ekw, d), rows(kw, d), d, d, c, true);
        matmul(ws, rows(pw, dv), transposed(ekw, d), rows(vw, dv), d, dv, c, true);
    }
    store(packed, sequences * time * dv + seq * len, ws, sw, len);
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
    let len = d * d + 2 * d * dv;
    let chunks = time.div_ceil(chunk);
    let qw = seq * ws.stride(0);
    let kw = qw + chunk * d;
    let vw = kw + chunk * d;
    let bw = vw + chunk * dv;
    let ww = bw + chunk;
    let aw = ww + chunk * chunk;
    let bmw = aw + chunk * d;
    let tw = bmw + chunk * dv;
    let sw = tw + chunk * chunk;
    let pw = sw + d * d;
    let yw = pw + d * dv;
    let dsw = yw + d * dv;
    let dpw = dsw + d * d;
    let dyw = dpw + d * dv;
    let gw = dyw + d * dv;
    let gm = gw + chunk * dv;
    let hm = gm + chunk * chunk;
    let daw = hm + chunk * chunk;
    let dbw = daw + chunk * d;
    let t1 = dbw + chunk * dv;
    let t2 = t1 + chunk * d;
    let tv1 = t2 + chunk * d;
    let tv2 = tv1 + chunk * dv;
    let tv3 = tv2 + chunk * dv;
    let dqw = tv3 + chunk * dv;
    let dkw = dqw + chunk * d;
    let dvw = dkw + chunk * d;
    let g0 = gates_of(seq, n);
    load(ws, dsw, grad, sequences * time * dv + seq * len, len);
    for back in 0..chunks {
        let i = chunks - 1 - back;
        let c0 = i * chunk;
        let c = span(i, chunk, time);
        load(ws, gw, grad, (seq * time + c0) * dv, c * dv);
        load(ws, sw, starts, (seq * chunks + i) * len, len);
        load_chunk(ws, qw, q, k, v, log_g, seq * time + c0, g0 + c0, c, chunk, d, dv);
        products(ws, qw, kw, vw, sw, ww, c, chunk, d, dv, bw);
        // G = (∂O Bᵀ) ⊙ D³.
        matmul(ws, rows(gm, c), rows(gw, dv), transposed(bmw, dv), c, c, dv, false);
        mask(ws, gm, c, bw, 3.0);
        // ∂B = Tᵀ ∂O + diag(e³) A ∂Y,  ∂A = Gᵀ Q + diag(e³) B ∂Yᵀ.
        scale_rows(ws, t1, aw, c, d, bw, UNTIL_END, 3.0);
        scale_rows(ws, tv1, bmw, c, dv, bw, UNTIL_END, 3.0);
        matmul(ws, rows(dbw, dv), rows(t1, d), rows(dyw, dv), c, dv, d, false);
        matmul(ws, rows(dbw, dv), transposed(tw, c), rows(gw, dv), c, dv, c, true);
        matmul(ws, rows(daw, d), transposed(gm, c), rows(qw, d), c, d, c, false);
        matmul(ws, rows(daw, d), rows(tv1, dv), transposed(dyw, dv), c, d, dv, true);
        // H = (∂A Kᵀ + ∂B Vᵀ) ⊙ D.
        matmul(ws, rows(hm, c), rows(daw, d), transposed(kw, d), c, c, d, false);
        matmul(ws, rows(hm, c), rows(dbw, dv), transposed(vw, dv), c, c, dv, true);
        mask(ws, hm, c, bw, 1.0);
        // ∂Q = diag(a³) ∂O Yᵀ + G A + diag(a) (∂A S + ∂B Pᵀ) + H K.
        scale_rows(ws, tv2, gw, c, dv, bw, SINCE_START, 3.0);
        scale_rows(ws, t2, daw, c, d, bw, SINCE_START, 1.0);
        scale_rows(ws, tv3, dbw, c, dv, bw, SINCE_START, 1.0);
        matmul(ws, rows(dqw, d), rows(tv2, dv), transposed(yw, dv), c, d, dv, false);
        matmul(ws, rows(dqw, d), rows(gm, c), rows(aw, d), c, d, c, true);
        matmul(ws, rows(dqw, d), rows(t2, d), rows(sw, d), c, d, d, true);
        matmul(ws, rows(dqw, d), rows(tv3, dv), transposed(pw, dv), c, d, dv, true);
        matmul(ws, rows(dqw, d), rows(hm, c), rows(kw, d), c, d, c, true);
        // ∂K = Wᵀ ∂A + Hᵀ Q + diag(e) K (∂S + ∂Sᵀ) + diag(e) V ∂Pᵀ.
        scale_rows(ws, t1, kw, c, d, bw, UNTIL_END, 1.0);
        scale_rows(ws, tv1, vw, c, dv, bw, UNTIL_END, 1.0);
        matmul(ws, rows(dkw, d), transposed(ww, c), rows(daw, d), c, d, c, false);
        matmul(ws, rows(dkw, d), transposed(hm, c), rows(qw, d), c, d, c, true);
        matmul(ws, rows(dkw, d), rows(t1, d), rows(dsw, d), c, d, d, true);
        matmul(ws, rows(dkw, d), rows(t1, d), transposed(dsw, d), c, d, d, true);
        matmul(ws, rows(dkw, d), rows(tv1, dv), transposed(dpw, dv), c, d, dv, true);
        // ∂V = Wᵀ ∂B + diag(e) K ∂P.
        matmul(ws, rows(dvw, dv), transposed(ww, c), rows(dbw, dv), c, dv, c, false);
        matmul(ws, rows(dvw, dv), rows(t1, d), rows(dpw, dv), c, dv, d, true);
        store(dq, (seq * time + c0) * d, ws, dqw, c * d);
        store(dk, (seq * time + c0) * d, ws, dkw, c * d);
        store(dv_out, (seq * time + c0) * dv, ws, dvw, c * dv);
        // ∂Y ← ρ³ ∂Y + Qᵀ diag(a³) ∂O,  ∂S ← ρ ∂S + (diag(a) ∂A)ᵀ Q,  ∂P ← ρ ∂P + Qᵀ diag(a) ∂B.
        let r = rho(ws, bw, c, 1.0);
        scale(ws, dsw, d * d + d * dv, r);
        scale(ws, dyw, d * dv, r * r * r);
        matmul(ws, rows(dyw, dv), transposed(qw, d), rows(tv2, dv), d, dv, c, true);
        matmul(ws, rows(dsw, d), transposed(t2, d), rows(qw, d), d, d, c, true);
        matmul(ws, rows(dpw, dv), transposed(qw, d), rows(tv3, dv), d, dv, c, true);
    }
    store(dstate, seq * len, ws, dsw, len);
}

crate::hla::gpu::gpu_kernels!(super::state_len);
