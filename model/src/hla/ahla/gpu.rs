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

/// Where a cube keeps its chunk's products `A`, `B`, forward and backward: right after
/// its chunk, the rest of its workspace from `end`.
#[derive(CubeType, Clone, Copy)]
struct ProductsAt {
    aw: usize,
    bmw: usize,
    end: usize,
}

/// [`ProductsAt`] after the chunk at `x`, for chunks of `chunk`.
#[cube]
fn products_at(x: &ChunkAt, chunk: usize, dv: usize) -> ProductsAt {
    let aw = x.end;
    let bmw = aw + chunk * chunk;
    let end = bmw + chunk * dv;
    ProductsAt { aw, bmw, end }
}

/// `A` and `B` of the chunk at `x` (`c` tokens) from the start state `P` at `pw`, into
/// `p`.
#[cube]
#[rustfmt::skip]
fn products(ws: &mut Tensor<f32>, x: &ChunkAt, pw: usize, p: &ProductsAt, c: usize, d: usize, dv: usize) {
    matmul(ws, rows(p.aw, c), rows(x.qw, d), transposed(x.kw, d), c, c, d, false);
    mask(ws, p.aw, c, x.bw, 1.0);
    matmul(ws, rows(p.bmw, dv), rows(x.qw, d), rows(pw, dv), c, dv, d, false);
    scale_rows(ws, p.bmw, p.bmw, c, dv, x.bw, SINCE_START, 1.0);
    matmul(ws, rows(p.bmw, dv), rows(p.aw, c), rows(x.vw, dv), c, dv, c, true);
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
    let x = chunk_at(seq * ws.stride(0), n);
    let (qw, kw, vw, bw) = (x.qw, x.kw, x.vw, x.bw);
    let p = products_at(&x, chunk, dv);
    let (aw, bmw) = (p.aw, p.bmw);
    let ow = p.end;
    let pw = ow + chunk * dv;
    let ew = pw + d * dv;
    let ekw = ew + d * dv;
    load(ws, pw, state, seq * len, len);
    for i in 0..chunks {
        let c0 = i * chunk;
        let c = span(i, chunk, time);
        store(starts, (seq * chunks + i) * len, ws, pw, len);
        load_chunk(ws, &x, q, k, v, log_g, seq, i, n);
        products(ws, &x, pw, &p, c, d, dv);
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

/// Where a backward cube keeps, in its workspace, its chunk (`x`: `q`, `k`, `v`, `b`), the
/// products (`p`), the start state `[P | E]` and its gradient `[∂P | ∂E]`, `∂O`,
/// `diag(e) K`, `∂B`, `H`, `diag(a) ∂O`, `diag(a) ∂B`, a scaled copy `t1` (of width `dv`)
/// and the chunk's `∂Q`, `∂K`, `∂V`: the backward half of [`workspace`].
#[derive(CubeType, Clone, Copy)]
struct Backward {
    x: ChunkAt,
    p: ProductsAt,
    pw: usize,
    ew: usize,
    dpw: usize,
    dew: usize,
    gw: usize,
    ekw: usize,
    dbw: usize,
    hm: usize,
    agw: usize,
    adbw: usize,
    t1: usize,
    dqw: usize,
    dkw: usize,
    dvw: usize,
}

/// [`Backward`] after the chunk at `x`, for chunks of `chunk`.
#[cube]
#[rustfmt::skip]
fn backward_layout(x: ChunkAt, chunk: usize, d: usize, dv: usize) -> Backward {
    let p = products_at(&x, chunk, dv);
    let pw = p.end;
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
    Backward {
        x, p, pw, ew, dpw, dew, gw, ekw, dbw, hm, agw, adbw, t1, dqw, dkw, dvw
    }
}

/// The chunk's `∂B`, `∂Q`, `∂K`, `∂V` (`c` tokens) from its products, `∂O` and the
/// gradient of the state after it.
#[cube]
#[rustfmt::skip]
fn chunk_grads(ws: &mut Tensor<f32>, w: &Backward, c: usize, d: usize, dv: usize) {
    // ∂B = Aᵀ ∂O + diag(e) K ∂E.
    scale_rows(ws, w.ekw, w.x.kw, c, d, w.x.bw, UNTIL_END, 1.0);
    matmul(ws, rows(w.dbw, dv), rows(w.ekw, d), rows(w.dew, dv), c, dv, d, false);
    matmul(ws, rows(w.dbw, dv), transposed(w.p.aw, c), rows(w.gw, dv), c, dv, c, true);
    // H = (∂O Bᵀ + ∂B Vᵀ) ⊙ D.
    matmul(ws, rows(w.hm, c), rows(w.gw, dv), transposed(w.p.bmw, dv), c, c, dv, false);
    matmul(ws, rows(w.hm, c), rows(w.dbw, dv), transposed(w.x.vw, dv), c, c, dv, true);
    mask(ws, w.hm, c, w.x.bw, 1.0);
    // ∂Q = diag(a) (∂O Eᵀ + ∂B Pᵀ) + H K.
    scale_rows(ws, w.agw, w.gw, c, dv, w.x.bw, SINCE_START, 1.0);
    scale_rows(ws, w.adbw, w.dbw, c, dv, w.x.bw, SINCE_START, 1.0);
    matmul(ws, rows(w.dqw, d), rows(w.agw, dv), transposed(w.ew, dv), c, d, dv, false);
    matmul(ws, rows(w.dqw, d), rows(w.adbw, dv), transposed(w.pw, dv), c, d, dv, true);
    matmul(ws, rows(w.dqw, d), rows(w.hm, c), rows(w.x.kw, d), c, d, c, true);
    // ∂K = Hᵀ Q + diag(e) (B ∂Eᵀ + V ∂Pᵀ).
    matmul(ws, rows(w.dkw, d), transposed(w.hm, c), rows(w.x.qw, d), c, d, c, false);
    scale_rows(ws, w.t1, w.p.bmw, c, dv, w.x.bw, UNTIL_END, 1.0);
    matmul(ws, rows(w.dkw, d), rows(w.t1, dv), transposed(w.dew, dv), c, d, dv, true);
    scale_rows(ws, w.t1, w.x.vw, c, dv, w.x.bw, UNTIL_END, 1.0);
    matmul(ws, rows(w.dkw, d), rows(w.t1, dv), transposed(w.dpw, dv), c, d, dv, true);
    // ∂V = Aᵀ ∂B + diag(e) K ∂P.
    matmul(ws, rows(w.dvw, dv), transposed(w.p.aw, c), rows(w.dbw, dv), c, dv, c, false);
    matmul(ws, rows(w.dvw, dv), rows(w.ekw, d), rows(w.dpw, dv), c, dv, d, true);
}

/// The gradient of the state before the chunk: `∂E ← ρ ∂E + Qᵀ diag(a) ∂O`,
/// `∂P ← ρ ∂P + Qᵀ diag(a) ∂B` (`diag(a) ∂O` in `agw`, `diag(a) ∂B` in `adbw`).
#[cube]
#[rustfmt::skip]
fn state_grads(ws: &mut Tensor<f32>, w: &Backward, c: usize, d: usize, dv: usize) {
    let r = rho(ws, w.x.bw, c, 1.0);
    scale(ws, w.dpw, 2 * d * dv, r);
    matmul(ws, rows(w.dew, dv), transposed(w.x.qw, d), rows(w.agw, dv), d, dv, c, true);
    matmul(ws, rows(w.dpw, dv), transposed(w.x.qw, d), rows(w.adbw, dv), d, dv, c, true);
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
    let w = backward_layout(chunk_at(seq * ws.stride(0), n), chunk, d, dv);
    load(ws, w.dpw, grad, sequences * time * dv + seq * len, len);
    for back in 0..chunks {
        let i = chunks - 1 - back;
        let c0 = i * chunk;
        let c = span(i, chunk, time);
        load(ws, w.gw, grad, (seq * time + c0) * dv, c * dv);
        load(ws, w.pw, starts, (seq * chunks + i) * len, len);
        load_chunk(ws, &w.x, q, k, v, log_g, seq, i, n);
        products(ws, &w.x, w.pw, &w.p, c, d, dv);
        chunk_grads(ws, &w, c, d, dv);
        store(dq, (seq * time + c0) * d, ws, w.dqw, c * d);
        store(dk, (seq * time + c0) * d, ws, w.dkw, c * d);
        store(dv_out, (seq * time + c0) * dv, ws, w.dvw, c * dv);
        state_grads(ws, &w, c, d, dv);
    }
    store(dstate, seq * len, ws, w.dpw, len);
}

crate::hla::gpu::gpu_kernels!(super::state_len);
