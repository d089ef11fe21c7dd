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

/// Where a cube keeps its chunk's products `W`, `P`, `A`, forward and backward: right
/// after its chunk, the rest of its workspace from `end`.
#[derive(CubeType, Clone, Copy)]
struct ProductsAt {
    ww: usize,
    pw: usize,
    aw: usize,
    end: usize,
}

/// [`ProductsAt`] after the chunk at `x`, for chunks of `chunk`.
#[cube]
fn products_at(x: &ChunkAt, chunk: usize, d: usize) -> ProductsAt {
    let ww = x.end;
    let pw = ww + chunk * chunk;
    let aw = pw + chunk * chunk;
    let end = aw + chunk * d;
    ProductsAt { ww, pw, aw, end }
}

/// `W`, `A` and `P` of the chunk at `x` (`c` tokens) from the start state `S` at `sw`,
/// into `p`.
#[cube]
#[rustfmt::skip]
fn products(ws: &mut Tensor<f32>, x: &ChunkAt, sw: usize, p: &ProductsAt, c: usize, d: usize) {
    matmul(ws, rows(p.ww, c), rows(x.qw, d), transposed(x.kw, d), c, c, d, false);
    mask(ws, p.ww, c, x.bw, 1.0);
    matmul(ws, rows(p.aw, d), rows(x.qw, d), transposed(sw, d), c, d, d, false);
    scale_rows(ws, p.aw, p.aw, c, d, x.bw, SINCE_START, 1.0);
    matmul(ws, rows(p.aw, d), rows(p.ww, c), rows(x.kw, d), c, d, c, true);
    matmul(ws, rows(p.pw, c), rows(x.qw, d), transposed(p.aw, d), c, c, d, false);
    mask(ws, p.pw, c, x.bw, 2.0);
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
    let x = chunk_at(seq * ws.stride(0), n);
    let (qw, kw, vw, bw) = (x.qw, x.kw, x.vw, x.bw);
    let p = products_at(&x, chunk, d);
    let (pw, aw) = (p.pw, p.aw);
    let ow = p.end;
    let sw = ow + chunk * dv;
    let zw = sw + d * d;
    let ekw = zw + d * dv;
    let evw = ekw + chunk * d;
    load(ws, sw, state, seq * len, len);
    for i in 0..chunks {
        let c0 = i * chunk;
        let c = span(i, chunk, time);
        store(starts, (seq * chunks + i) * len, ws, sw, len);
        load_chunk(ws, &x, q, k, v, log_g, seq, i, n);
        products(ws, &x, sw, &p, c, d);
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

/// Where a backward cube keeps, in its workspace, its chunk (`x`: `q`, `k`, `v`, `b`), the
/// products (`p`), the start state `[S | Z]` and its gradient `[∂S | ∂Z]`, `∂O`,
/// `G`, `H`, `∂A`, three scaled copies (`t1`, `t2` of width `d`, `tv` of `dv`) and the
/// chunk's `∂Q`, `∂K`, `∂V`: the backward half of [`workspace`].
#[derive(CubeType, Clone, Copy)]
struct Backward {
    x: ChunkAt,
    p: ProductsAt,
    sw: usize,
    zw: usize,
    dsw: usize,
    dzw: usize,
    gw: usize,
    gm: usize,
    hm: usize,
    daw: usize,
    t1: usize,
    t2: usize,
    tv: usize,
    dqw: usize,
    dkw: usize,
    dvw: usize,
}

/// [`Backward`] after the chunk at `x`, for chunks of `chunk`.
#[cube]
#[rustfmt::skip]
fn backward_layout(x: ChunkAt, chunk: usize, d: usize, dv: usize) -> Backward {
    let p = products_at(&x, chunk, d);
    let sw = p.end;
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
    Backward {
        x, p, sw, zw, dsw, dzw, gw, gm, hm, daw, t1, t2, tv, dqw, dkw, dvw
    }
}

/// The chunk's `∂V`, `∂A`, `∂Q`, `∂K` (`c` tokens) from its products, `∂O` and the
/// gradient of the state after it.
#[cube]
#[rustfmt::skip]
fn chunk_grads(ws: &mut Tensor<f32>, w: &Backward, c: usize, d: usize, dv: usize) {
    // G = (∂O Vᵀ) ⊙ D².
    matmul(ws, rows(w.gm, c), rows(w.gw, dv), transposed(w.x.vw, dv), c, c, dv, false);
    mask(ws, w.gm, c, w.x.bw, 2.0);
    // ∂V = Pᵀ ∂O + diag(e²) A ∂Z.
    scale_rows(ws, w.t1, w.p.aw, c, d, w.x.bw, UNTIL_END, 2.0);
    matmul(ws, rows(w.dvw, dv), transposed(w.p.pw, c), rows(w.gw, dv), c, dv, c, false);
    matmul(ws, rows(w.dvw, dv), rows(w.t1, d), rows(w.dzw, dv), c, dv, d, true);
    // ∂A = Gᵀ Q + diag(e²) V ∂Zᵀ.
    scale_rows(ws, w.tv, w.x.vw, c, dv, w.x.bw, UNTIL_END, 2.0);
    matmul(ws, rows(w.daw, d), transposed(w.gm, c), rows(w.x.qw, d), c, d, c, false);
    matmul(ws, rows(w.daw, d), rows(w.tv, dv), transposed(w.dzw, dv), c, d, dv, true);
    // H = (∂A Kᵀ) ⊙ D.
    matmul(ws, rows(w.hm, c), rows(w.daw, d), transposed(w.x.kw, d), c, c, d, false);
    mask(ws, w.hm, c, w.x.bw, 1.0);
    // ∂Q = diag(a²) ∂O Zᵀ + G A + diag(a) ∂A S + H K.
    scale_rows(ws, w.tv, w.gw, c, dv, w.x.bw, SINCE_START, 2.0);
    scale_rows(ws, w.t2, w.daw, c, d, w.x.bw, SINCE_START, 1.0);
    matmul(ws, rows(w.dqw, d), rows(w.tv, dv), transposed(w.zw, dv), c, d, dv, false);
    matmul(ws, rows(w.dqw, d), rows(w.gm, c), rows(w.p.aw, d), c, d, c, true);
    matmul(ws, rows(w.dqw, d), rows(w.t2, d), rows(w.sw, d), c, d, d, true);
    matmul(ws, rows(w.dqw, d), rows(w.hm, c), rows(w.x.kw, d), c, d, c, true);
    // ∂K = Wᵀ ∂A + Hᵀ Q + diag(e) K (∂S + ∂Sᵀ).
    scale_rows(ws, w.t1, w.x.kw, c, d, w.x.bw, UNTIL_END, 1.0);
    matmul(ws, rows(w.dkw, d), transposed(w.p.ww, c), rows(w.daw, d), c, d, c, false);
    matmul(ws, rows(w.dkw, d), transposed(w.hm, c), rows(w.x.qw, d), c, d, c, true);
    matmul(ws, rows(w.dkw, d), rows(w.t1, d), rows(w.dsw, d), c, d, d, true);
    matmul(ws, rows(w.dkw, d), rows(w.t1, d), transposed(w.dsw, d), c, d, d, true);
}

/// The gradient of the state before the chunk: `∂S ← ρ ∂S + (diag(a) ∂A)ᵀ Q`,
/// `∂Z ← ρ² ∂Z + Qᵀ diag(a²) ∂O` (`diag(a) ∂A` in `t2`, `diag(a²) ∂O` in `tv`).
#[cube]
#[rustfmt::skip]
fn state_grads(ws: &mut Tensor<f32>, w: &Backward, c: usize, d: usize, dv: usize) {
    let r = rho(ws, w.x.bw, c, 1.0);
    scale(ws, w.dsw, d * d, r);
    matmul(ws, rows(w.dsw, d), transposed(w.t2, d), rows(w.x.qw, d), d, d, c, true);
    scale(ws, w.dzw, d * dv, r * r);
    matmul(ws, rows(w.dzw, dv), transposed(w.x.qw, d), rows(w.tv, dv), d, dv, c, true);
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
    let w = backward_layout(chunk_at(seq * ws.stride(0), n), chunk, d, dv);
    load(ws, w.dsw, grad, sequences * time * dv + seq * len, len);
    for back in 0..chunks {
        let i = chunks - 1 - back;
        let c0 = i * chunk;
        let c = span(i, chunk, time);
        load(ws, w.gw, grad, (seq * time + c0) * dv, c * dv);
        load(ws, w.sw, starts, (seq * chunks + i) * len, len);
        load_chunk(ws, &w.x, q, k, v, log_g, seq, i, n);
        products(ws, &w.x, w.sw, &w.p, c, d);
        chunk_grads(ws, &w, c, d, dv);
        store(dq, (seq * time + c0) * d, ws, w.dqw, c * d);
        store(dk, (seq * time + c0) * d, ws, w.dkw, c * d);
        store(dv_out, (seq * time + c0) * dv, ws, w.dvw, c * dv);
        state_grads(ws, &w, c, d, dv);
    }
    store(dstate, seq * len, ws, w.dsw, len);
}

crate::hla::gpu::gpu_kernels!(super::state_len);
