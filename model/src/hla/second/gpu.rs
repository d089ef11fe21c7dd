//! The chunk kernels of second order on CubeCL devices ([`crate::hla::gpu`]): one cube
//! per sequence and head walks its chunks in order, the equations of [`super::cpu`]
//!
//! ```text
//! W = D ⊙ (Q Kᵀ),  A = diag(a) Q Sᵀ + W K,  P = (Q Aᵀ) ⊙ D²
//! O = diag(a²) Q Z + P V
//! Z ← ρ² Z + Aᵀ diag(e²) V,  S ← ρ S + Kᵀ diag(e) K
//! ```
//!
//! and back, from the last chunk, with `∂S`, `∂Z` the gradients of the state after the
//! chunk, `G = (∂O Vᵀ) ⊙ D²` and `H = (∂A Kᵀ) ⊙ D`:
//!
//! ```text
//! ∂V = Pᵀ ∂O + diag(e²) A ∂Z
//! ∂A = Gᵀ Q + diag(e²) V ∂Zᵀ
//! ∂Q = diag(a²) ∂O Zᵀ + G A + diag(a) ∂A S + H K
//! ∂K = Wᵀ ∂A + Hᵀ Q + diag(e) K (∂S + ∂Sᵀ)
//! ∂S ← ρ ∂S + (diag(a) ∂A)ᵀ Q,  ∂Z ← ρ² ∂Z + Qᵀ diag(a²) ∂O
//! ```

use burn_cubecl::cubecl;
use cubecl::prelude::*;

use crate::hla::gpu::blocks::*;

/// Workspace floats of one cube, forward and backward, for chunks of `c`.
fn workspace(c: usize, d: usize, dv: usize) -> [usize; 2] {
    let chunk = 2 * c * d + c * dv + c;
    let products = 2 * c * c + c * d;
    let state = d * d + d * dv;
    [
        chunk + products + c * dv + state + c * d + c * dv,
        chunk + products + 2 * state + 2 * c * c + 5 * c * d + 3 * c * dv,
    ]
}

/// `W`, `A` and `P` of the chunk at `qw`, `kw` (`c` tokens, `b` at `bw`) from the start
/// state `S` at `sw`, into `ww`, `aw`, `pw`.
#[cube]
#[allow(clippy::too_many_arguments)]
#[rustfmt::skip]
fn products(
    ws: &mut Tensor<f32>,
    qw: usize,
    kw: usize,
    sw: usize,
    ww: usize,
    aw: usize,
    pw: usize,
    c: usize,
    d: usize,
    bw: usize,
) {
    matmul(ws, rows(ww, c), rows(qw, d), transposed(kw, d), c, c, d, false);
    mask(ws, ww, c, bw, 1.0);
    matmul(ws, rows(aw, d), rows(qw, d), transposed(sw, d), c, d, d, false);
    scale_rows(ws, aw, aw, c, d, bw, SINCE_START, 1.0);
    matmul(ws, rows(aw, d), rows(ww, c), rows(kw, d), c, d, c, true);
    matmul(ws, rows(pw, c), rows(qw, d), transposed(aw, d), c, c, d, false);
    mask(ws, pw, c, bw, 2.0);
}

/// `[q, k, v, log g, state]` → `o` and the final state `[S | Z]` into `packed`, every
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
    let len = d * d + d * dv;
    let chunks = time.div_ceil(chunk);
    let qw = seq * ws.stride(0);
    let kw = qw + chunk * d;
    let vw = kw + chunk * d;
    let bw = vw + chunk * dv;
    let ww = bw + chunk;
    let pw = ww + chunk * chunk;
    let aw = pw + chunk * chunk;
    let ow = aw + chunk * d;
    let sw = ow + chunk * dv;
    let zw = sw + d * d;
    let ekw = zw + d * dv;
    let evw = ekw + chunk * d;
    let g0 = gates_of(seq, n);
    load(ws, sw, state, seq * len, len);
    for i in 0..chunks {
        let c0 = i * chunk;
        let c = span(i, chunk, time);
        store(starts, (seq * chunks + i) * len, ws, sw, len);
        load_chunk(ws, qw, q, k, v, log_g, seq * time + c0, g0 + c0, c, chunk, d, dv);
        products(ws, qw, kw, sw, ww, aw, pw, c, d, bw);
        // O = diag(a²) Q Z + P V.
        matmul(ws, rows(ow, dv), rows(qw, d), rows(zw, dv), c, dv, d, false);
        scale_rows(ws, ow, ow, c, dv, bw, SINCE_START, 2.0);
        matmul(ws, rows(ow, dv), rows(pw, c), rows(vw, dv), c, dv, c, true);
        store(packed, (seq * time + c0) * dv, ws, ow, c * dv);
        // Z ← ρ² Z + Aᵀ diag(e²) V,  S ← ρ S + Kᵀ diag(e) K.
        scale_rows(ws, evw, vw, c, dv, bw, UNTIL_END, 2.0);
        scale_rows(ws, ekw, kw, c, d, bw, UNTIL_END, 1.0);
        let r = rho(ws, bw, c, 1.0);
        scale(ws, zw, d * dv, r * r);
        matmul(ws, rows(zw, dv), transposed(aw, d), rows(evw, dv), d, dv, c, true);
        scale(ws, sw, d * d, r);
        matmul(ws, rows(sw, d), transposed(kw, d), rows(ekw, d), d, d, c, true);
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
    let len = d * d + d * dv;
    let chunks = time.div_ceil(chunk);
    let qw = seq * ws.stride(0);
    let kw = qw + chunk * d;
    let vw = kw + chunk * d;
    let bw = vw + chunk * dv;
    let ww = bw + chunk;
    let pw = ww + chunk * chunk;
    let aw = pw + chunk * chunk;
    let sw = aw + chunk * d;
    let zw = sw + d * d;
    let dsw = zw + d * dv;
    let dzw = dsw + d * d;
    let gw = dzw + d * dv;
    let gm = gw + chunk * dv;
    let hm = gm + chunk * chunk;
    let daw = hm + chunk * chunk;
    let t1 = daw + chunk * d;
    let t2 = t1 + chunk * d;
    let tv = t2 + chunk * d;
    let dqw = tv + chunk * dv;
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
        products(ws, qw, kw, sw, ww, aw, pw, c, d, bw);
        // G = (∂O Vᵀ) ⊙ D².
        matmul(ws, rows(gm, c), rows(gw, dv), transposed(vw, dv), c, c, dv, false);
        mask(ws, gm, c, bw, 2.0);
        // ∂V = Pᵀ ∂O + diag(e²) A ∂Z.
        scale_rows(ws, t1, aw, c, d, bw, UNTIL_END, 2.0);
        matmul(ws, rows(dvw, dv), transposed(pw, c), rows(gw, dv), c, dv, c, false);
        matmul(ws, rows(dvw, dv), rows(t1, d), rows(dzw, dv), c, dv, d, true);
        // ∂A = Gᵀ Q + diag(e²) V ∂Zᵀ.
        scale_rows(ws, tv, vw, c, dv, bw, UNTIL_END, 2.0);
        matmul(ws, rows(daw, d), transposed(gm, c), rows(qw, d), c, d, c, false);
        matmul(ws, rows(daw, d), rows(tv, dv), transposed(dzw, dv), c, d, dv, true);
        // H = (∂A Kᵀ) ⊙ D.
        matmul(ws, rows(hm, c), rows(daw, d), transposed(kw, d), c, c, d, false);
        mask(ws, hm, c, bw, 1.0);
        // ∂Q = diag(a²) ∂O Zᵀ + G A + diag(a) ∂A S + H K.
        scale_rows(ws, tv, gw, c, dv, bw, SINCE_START, 2.0);
        scale_rows(ws, t2, daw, c, d, bw, SINCE_START, 1.0);
        matmul(ws, rows(dqw, d), rows(tv, dv), transposed(zw, dv), c, d, dv, false);
        matmul(ws, rows(dqw, d), rows(gm, c), rows(aw, d), c, d, c, true);
        matmul(ws, rows(dqw, d), rows(t2, d), rows(sw, d), c, d, d, true);
        matmul(ws, rows(dqw, d), rows(hm, c), rows(kw, d), c, d, c, true);
        // ∂K = Wᵀ ∂A + Hᵀ Q + diag(e) K (∂S + ∂Sᵀ).
        scale_rows(ws, t1, kw, c, d, bw, UNTIL_END, 1.0);
        matmul(ws, rows(dkw, d), transposed(ww, c), rows(daw, d), c, d, c, false);
        matmul(ws, rows(dkw, d), transposed(hm, c), rows(qw, d), c, d, c, true);
        matmul(ws, rows(dkw, d), rows(t1, d), rows(dsw, d), c, d, d, true);
        matmul(ws, rows(dkw, d), rows(t1, d), transposed(dsw, d), c, d, d, true);
        store(dq, (seq * time + c0) * d, ws, dqw, c * d);
        store(dk, (seq * time + c0) * d, ws, dkw, c * d);
        store(dv_out, (seq * time + c0) * dv, ws, dvw, c * dv);
        // ∂S ← ρ ∂S + (diag(a) ∂A)ᵀ Q,  ∂Z ← ρ² ∂Z + Qᵀ diag(a²) ∂O.
        let r = rho(ws, bw, c, 1.0);
        scale(ws, dsw, d * d, r);
        matmul(ws, rows(dsw, d), transposed(t2, d), rows(qw, d), d, d, c, true);
        scale(ws, dzw, d * dv, r * r);
        matmul(ws, rows(dzw, dv), transposed(qw, d), rows(tv, dv), d, dv, c, true);
    }
    store(dstate, seq * len, ws, dsw, len);
}

crate::hla::gpu::gpu_kernels!(super::state_len);
