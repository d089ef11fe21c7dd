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

/// Where a cube keeps its chunk's products `W`, `A`, `B`, `T`, forward and backward:
/// right after its chunk, the rest of its workspace from `end`.
#[derive(CubeType, Clone, Copy)]
struct ProductsAt {
    ww: usize,
    aw: usize,
    bmw: usize,
    tw: usize,
    end: usize,
}

/// [`ProductsAt`] after the chunk at `x`, for chunks of `chunk`.
#[cube]
fn products_at(x: &ChunkAt, chunk: usize, d: usize, dv: usize) -> ProductsAt {
    let ww = x.end;
    let aw = ww + chunk * chunk;
    let bmw = aw + chunk * d;
    let tw = bmw + chunk * dv;
    let end = tw + chunk * chunk;
    ProductsAt {
        ww,
        aw,
        bmw,
        tw,
        end,
    }
}

/// `W`, `A`, `B` and `T` of the chunk at `x` (`c` tokens) from the start states `S` at
/// `sw` and `P` after it, into `p`.
#[cube]
#[rustfmt::skip]
fn products(ws: &mut Tensor<f32>, x: &ChunkAt, sw: usize, p: &ProductsAt, c: usize, d: usize, dv: usize) {
    let pw = sw + d * d;
    matmul(ws, rows(p.ww, c), rows(x.qw, d), transposed(x.kw, d), c, c, d, false);
    mask(ws, p.ww, c, x.bw, 1.0);
    matmul(ws, rows(p.aw, d), rows(x.qw, d), transposed(sw, d), c, d, d, false);
    scale_rows(ws, p.aw, p.aw, c, d, x.bw, SINCE_START, 1.0);
    matmul(ws, rows(p.aw, d), rows(p.ww, c), rows(x.kw, d), c, d, c, true);
    matmul(ws, rows(p.bmw, dv), rows(x.qw, d), rows(pw, dv), c, dv, d, false);
    scale_rows(ws, p.bmw, p.bmw, c, dv, x.bw, SINCE_START, 1.0);
    matmul(ws, rows(p.bmw, dv), rows(p.ww, c), rows(x.vw, dv), c, dv, c, true);
    matmul(ws, rows(p.tw, c), rows(x.qw, d), transposed(p.aw, d), c, c, d, false);
    mask(ws, p.tw, c, x.bw, 3.0);
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
    let x = chunk_at(seq * ws.stride(0), n);
    let (qw, kw, vw, bw) = (x.qw, x.kw, x.vw, x.bw);
    let p = products_at(&x, chunk, d, dv);
    let (aw, bmw, tw) = (p.aw, p.bmw, p.tw);
    let ow = p.end;
    let sw = ow + chunk * dv;
    let pw = sw + d * d;
    let yw = pw + d * dv;
    let e3bw = yw + d * dv;
    let ekw = e3bw + chunk * dv;
    load(ws, sw, state, seq * len, len);
    for i in 0..chunks {
        let c0 = i * chunk;
        let c = span(i, chunk, time);
        store(starts, (seq * chunks + i) * len, ws, sw, len);
        load_chunk(ws, &x, q, k, v, log_g, seq, i, n);
        products(ws, &x, sw, &p, c, d, dv);
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

/// Where a backward cube keeps, in its workspace, its chunk (`x`: `q`, `k`, `v`, `b`), the
/// products (`p`), the start state `[S | P | Y]` and its gradient
/// `[∂S | ∂P | ∂Y]`, `∂O`, `G`, `H`, `∂A`, `∂B`, five scaled copies (`t1`, `t2` of width
/// `d`, `tv1` to `tv3` of `dv`) and the chunk's `∂Q`, `∂K`, `∂V`: the backward half of
/// [`workspace`].
#[derive(CubeType, Clone, Copy)]
struct Backward {
    x: ChunkAt,
    p: ProductsAt,
    sw: usize,
    pw: usize,
    yw: usize,
    dsw: usize,
    dpw: usize,
    dyw: usize,
    gw: usize,
    gm: usize,
    hm: usize,
    daw: usize,
    dbw: usize,
    t1: usize,
    t2: usize,
    tv1: usize,
    tv2: usize,
    tv3: usize,
    dqw: usize,
    dkw: usize,
    dvw: usize,
}

/// [`Backward`] after the chunk at `x`, for chunks of `chunk`.
#[cube]
#[rustfmt::skip]
fn backward_layout(x: ChunkAt, chunk: usize, d: usize, dv: usize) -> Backward {
    let p = products_at(&x, chunk, d, dv);
    let sw = p.end;
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
    Backward {
        x, p, sw, pw, yw, dsw, dpw, dyw, gw, gm, hm, daw, dbw, t1, t2, tv1, tv2, tv3,
        dqw, dkw, dvw
    }
}

/// The chunk's `∂B`, `∂A`, `∂Q`, `∂K`, `∂V` (`c` tokens) from its products, `∂O` and the
/// gradient of the state after it.
#[cube]
#[rustfmt::skip]
fn chunk_grads(ws: &mut Tensor<f32>, w: &Backward, c: usize, d: usize, dv: usize) {
    // G = (∂O Bᵀ) ⊙ D³.
    matmul(ws, rows(w.gm, c), rows(w.gw, dv), transposed(w.p.bmw, dv), c, c, dv, false);
    mask(ws, w.gm, c, w.x.bw, 3.0);
    // ∂B = Tᵀ ∂O + diag(e³) A ∂Y,  ∂A = Gᵀ Q + diag(e³) B ∂Yᵀ.
    scale_rows(ws, w.t1, w.p.aw, c, d, w.x.bw, UNTIL_END, 3.0);
    scale_rows(ws, w.tv1, w.p.bmw, c, dv, w.x.bw, UNTIL_END, 3.0);
    matmul(ws, rows(w.dbw, dv), rows(w.t1, d), rows(w.dyw, dv), c, dv, d, false);
    matmul(ws, rows(w.dbw, dv), transposed(w.p.tw, c), rows(w.gw, dv), c, dv, c, true);
    matmul(ws, rows(w.daw, d), transposed(w.gm, c), rows(w.x.qw, d), c, d, c, false);
    matmul(ws, rows(w.daw, d), rows(w.tv1, dv), transposed(w.dyw, dv), c, d, dv, true);
    // H = (∂A Kᵀ + ∂B Vᵀ) ⊙ D.
    matmul(ws, rows(w.hm, c), rows(w.daw, d), transposed(w.x.kw, d), c, c, d, false);
    matmul(ws, rows(w.hm, c), rows(w.dbw, dv), transposed(w.x.vw, dv), c, c, dv, true);
    mask(ws, w.hm, c, w.x.bw, 1.0);
    // ∂Q = diag(a³) ∂O Yᵀ + G A + diag(a) (∂A S + ∂B Pᵀ) + H K.
    scale_rows(ws, w.tv2, w.gw, c, dv, w.x.bw, SINCE_START, 3.0);
    scale_rows(ws, w.t2, w.daw, c, d, w.x.bw, SINCE_START, 1.0);
    scale_rows(ws, w.tv3, w.dbw, c, dv, w.x.bw, SINCE_START, 1.0);
    matmul(ws, rows(w.dqw, d), rows(w.tv2, dv), transposed(w.yw, dv), c, d, dv, false);
    matmul(ws, rows(w.dqw, d), rows(w.gm, c), rows(w.p.aw, d), c, d, c, true);
    matmul(ws, rows(w.dqw, d), rows(w.t2, d), rows(w.sw, d), c, d, d, true);
    matmul(ws, rows(w.dqw, d), rows(w.tv3, dv), transposed(w.pw, dv), c, d, dv, true);
    matmul(ws, rows(w.dqw, d), rows(w.hm, c), rows(w.x.kw, d), c, d, c, true);
    // ∂K = Wᵀ ∂A + Hᵀ Q + diag(e) K (∂S + ∂Sᵀ) + diag(e) V ∂Pᵀ.
    scale_rows(ws, w.t1, w.x.kw, c, d, w.x.bw, UNTIL_END, 1.0);
    scale_rows(ws, w.tv1, w.x.vw, c, dv, w.x.bw, UNTIL_END, 1.0);
    matmul(ws, rows(w.dkw, d), transposed(w.p.ww, c), rows(w.daw, d), c, d, c, false);
    matmul(ws, rows(w.dkw, d), transposed(w.hm, c), rows(w.x.qw, d), c, d, c, true);
    matmul(ws, rows(w.dkw, d), rows(w.t1, d), rows(w.dsw, d), c, d, d, true);
    matmul(ws, rows(w.dkw, d), rows(w.t1, d), transposed(w.dsw, d), c, d, d, true);
    matmul(ws, rows(w.dkw, d), rows(w.tv1, dv), transposed(w.dpw, dv), c, d, dv, true);
    // ∂V = Wᵀ ∂B + diag(e) K ∂P.
    matmul(ws, rows(w.dvw, dv), transposed(w.p.ww, c), rows(w.dbw, dv), c, dv, c, false);
    matmul(ws, rows(w.dvw, dv), rows(w.t1, d), rows(w.dpw, dv), c, dv, d, true);
}

/// The gradient of the state before the chunk: `∂Y ← ρ³ ∂Y + Qᵀ diag(a³) ∂O`,
/// `∂S ← ρ ∂S + (diag(a) ∂A)ᵀ Q`, `∂P ← ρ ∂P + Qᵀ diag(a) ∂B` (`diag(a³) ∂O` in `tv2`,
/// `diag(a) ∂A` in `t2`, `diag(a) ∂B` in `tv3`).
#[cube]
#[rustfmt::skip]
fn state_grads(ws: &mut Tensor<f32>, w: &Backward, c: usize, d: usize, dv: usize) {
    let r = rho(ws, w.x.bw, c, 1.0);
    scale(ws, w.dsw, d * d + d * dv, r);
    scale(ws, w.dyw, d * dv, r * r * r);
    matmul(ws, rows(w.dyw, dv), transposed(w.x.qw, d), rows(w.tv2, dv), d, dv, c, true);
    matmul(ws, rows(w.dsw, d), transposed(w.t2, d), rows(w.x.qw, d), d, d, c, true);
    matmul(ws, rows(w.dpw, dv), transposed(w.x.qw, d), rows(w.tv3, dv), d, dv, c, true);
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
    let w = backward_layout(chunk_at(seq * ws.stride(0), n), chunk, d, dv);
    load(ws, w.dsw, grad, sequences * time * dv + seq * len, len);
    for back in 0..chunks {
        let i = chunks - 1 - back;
        let c0 = i * chunk;
        let c = span(i, chunk, time);
        load(ws, w.gw, grad, (seq * time + c0) * dv, c * dv);
        load(ws, w.sw, starts, (seq * chunks + i) * len, len);
        load_chunk(ws, &w.x, q, k, v, log_g, seq, i, n);
        products(ws, &w.x, w.sw, &w.p, c, d, dv);
        chunk_grads(ws, &w, c, d, dv);
        store(dq, (seq * time + c0) * d, ws, w.dqw, c * d);
        store(dk, (seq * time + c0) * d, ws, w.dkw, c * d);
        store(dv_out, (seq * time + c0) * dv, ws, w.dvw, c * dv);
        state_grads(ws, &w, c, d, dv);
    }
    store(dstate, seq * len, ws, w.dsw, len);
}

crate::hla::gpu::gpu_kernels!(super::state_len);
