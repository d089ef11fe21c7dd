//! The chunk kernels of first order on CubeCL devices ([`crate::hla::gpu`]): one cube
//! per sequence and head walks its chunks in order, the equations of [`super::cpu`]
//!
//! ```text
//! M = (Q Kᵀ) ⊙ D,  O = diag(a) Q S + M V,  S ← ρ S + Kᵀ diag(e) V
//! ```
//!
//! and back, from the last chunk, with `∂S` the gradient of the state after the chunk
//! and `G = (∂O Vᵀ) ⊙ D`:
//!
//! ```text
//! ∂Q = diag(a) ∂O Sᵀ + G K,  ∂K = Gᵀ Q + diag(e) V ∂Sᵀ,  ∂V = Mᵀ ∂O + diag(e) K ∂S
//! ∂S ← ρ ∂S + (diag(a) Q)ᵀ ∂O
//! ```

use burn_cubecl::cubecl;
use cubecl::prelude::*;

use crate::hla::gpu::blocks::*;

/// Workspace floats of one cube, forward and backward, for chunks of `c`.
fn workspace(c: usize, d: usize, dv: usize) -> [usize; 2] {
    let chunk = 2 * c * d + c * dv + c;
    [
        chunk + c * c + c * dv + d * dv,
        chunk + 2 * d * dv + 2 * c * c + 2 * c * dv + 3 * c * d + c * dv,
    ]
}

/// `[q, k, v, log g, state]` → `o` and the final state into `packed`, every chunk's start
/// state into `starts`.
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
    let len = d * dv;
    let chunks = time.div_ceil(chunk);
    let x = chunk_at(seq * ws.stride(0), n);
    let (qw, kw, vw, bw) = (x.qw, x.kw, x.vw, x.bw);
    let mw = x.end;
    let ow = mw + chunk * chunk;
    let sw = ow + chunk * dv;
    load(ws, sw, state, seq * len, len);
    for i in 0..chunks {
        let c0 = i * chunk;
        let c = span(i, chunk, time);
        store(starts, (seq * chunks + i) * len, ws, sw, len);
        load_chunk(ws, &x, q, k, v, log_g, seq, i, n);
        // M = (Q Kᵀ) ⊙ D.
        matmul(ws, rows(mw, c), rows(qw, d), transposed(kw, d), c, c, d, false);
        mask(ws, mw, c, bw, 1.0);
        // O = diag(a) Q S + M V.
        matmul(ws, rows(ow, dv), rows(qw, d), rows(sw, dv), c, dv, d, false);
        scale_rows(ws, ow, ow, c, dv, bw, SINCE_START, 1.0);
        matmul(ws, rows(ow, dv), rows(mw, c), rows(vw, dv), c, dv, c, true);
        store(packed, (seq * time + c0) * dv, ws, ow, c * dv);
        // S ← ρ S + Kᵀ diag(e) V.
        scale_rows(ws, vw, vw, c, dv, bw, UNTIL_END, 1.0);
        let r = rho(ws, bw, c, 1.0);
        scale(ws, sw, len, r);
        matmul(ws, rows(sw, dv), transposed(kw, d), rows(vw, dv), d, dv, c, true);
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
    let len = d * dv;
    let chunks = time.div_ceil(chunk);
    let x = chunk_at(seq * ws.stride(0), n);
    let (qw, kw, vw, bw) = (x.qw, x.kw, x.vw, x.bw);
    let sw = x.end;
    let dsw = sw + len;
    let gw = dsw + len;
    let mw = gw + chunk * dv;
    let hw = mw + chunk * chunk;
    let t1 = hw + chunk * chunk;
    let t2 = t1 + chunk * dv;
    let dqw = t2 + chunk * d;
    let dkw = dqw + chunk * d;
    let dvw = dkw + chunk * d;
    load(ws, dsw, grad, sequences * time * dv + seq * len, len);
    for back in 0..chunks {
        let i = chunks - 1 - back;
        let c0 = i * chunk;
        let c = span(i, chunk, time);
        load(ws, gw, grad, (seq * time + c0) * dv, c * dv);
        load(ws, sw, starts, (seq * chunks + i) * len, len);
        load_chunk(ws, &x, q, k, v, log_g, seq, i, n);
        // G = (∂O Vᵀ) ⊙ D.
        matmul(ws, rows(hw, c), rows(gw, dv), transposed(vw, dv), c, c, dv, false);
        mask(ws, hw, c, bw, 1.0);
        // ∂Q = diag(a) ∂O Sᵀ + G K.
        scale_rows(ws, t1, gw, c, dv, bw, SINCE_START, 1.0);
        matmul(ws, rows(dqw, d), rows(t1, dv), transposed(sw, dv), c, d, dv, false);
        matmul(ws, rows(dqw, d), rows(hw, c), rows(kw, d), c, d, c, true);
        // ∂K = Gᵀ Q + diag(e) V ∂Sᵀ.
        scale_rows(ws, t1, vw, c, dv, bw, UNTIL_END, 1.0);
        matmul(ws, rows(dkw, d), transposed(hw, c), rows(qw, d), c, d, c, false);
        matmul(ws, rows(dkw, d), rows(t1, dv), transposed(dsw, dv), c, d, dv, true);
        // ∂V = Mᵀ ∂O + diag(e) K ∂S, with M = (Q Kᵀ) ⊙ D.
        matmul(ws, rows(mw, c), rows(qw, d), transposed(kw, d), c, c, d, false);
        mask(ws, mw, c, bw, 1.0);
        scale_rows(ws, t2, kw, c, d, bw, UNTIL_END, 1.0);
        matmul(ws, rows(dvw, dv), transposed(mw, c), rows(gw, dv), c, dv, c, false);
        matmul(ws, rows(dvw, dv), rows(t2, d), rows(dsw, dv), c, dv, d, true);
        store(dq, (seq * time + c0) * d, ws, dqw, c * d);
        store(dk, (seq * time + c0) * d, ws, dkw, c * d);
        store(dv_out, (seq * time + c0) * dv, ws, dvw, c * dv);
        // ∂S ← ρ ∂S + (diag(a) Q)ᵀ ∂O.
        scale_rows(ws, t2, qw, c, d, bw, SINCE_START, 1.0);
        let r = rho(ws, bw, c, 1.0);
        scale(ws, dsw, len, r);
        matmul(ws, rows(dsw, dv), transposed(t2, d), rows(gw, dv), d, dv, c, true);
    }
    store(dstate, seq * len, ws, dsw, len);
}

crate::hla::gpu::gpu_kernels!(super::state_len);
