//! The pieces every order's chunk kernels are built from, each a step of the CPU kernels'
//! equations run by all units of one cube: copies in and out, a chunk's decay,
//! row scales, the decay mask and small matmuls.
//!
//! A cube owns one sequence and head and keeps its chunk's matrices and the state in its
//! rows of a workspace tensor (global memory, so no size limit on `d` or the chunk).
//! Every block ends with a cube-wide barrier over that memory ([`sync_storage`]), so the
//! next block reads what this one wrote.

use burn_cubecl::cubecl;
use cubecl::prelude::*;

/// `a^p_τ = exp(p b_τ)`, the decay from the chunk's start to `τ`.
pub(crate) const SINCE_START: u32 = 1;
/// `e^p_τ = exp(p (b_last − b_τ))`, the decay from `τ` to the chunk's end.
pub(crate) const UNTIL_END: u32 = 2;

/// The sizes every chunk kernel takes: tokens, widths of `q`, `k` and of `v`, the chunk,
/// the heads, and the batch and heads of the gates `[gb, gh, time]`.
#[derive(CubeLaunch, CubeType)]
pub(crate) struct Dims {
    pub(crate) time: usize,
    pub(crate) d: usize,
    pub(crate) dv: usize,
    pub(crate) chunk: usize,
    pub(crate) heads: usize,
    pub(crate) gb: usize,
    pub(crate) gh: usize,
}

/// A matrix in the workspace: where it starts and the strides of its rows and columns.
#[derive(CubeType, Clone, Copy)]
pub(crate) struct Mat {
    off: usize,
    rs: usize,
    cs: usize,
}

/// The row-major matrix at `off` with `cols` columns.
#[cube]
pub(crate) fn rows(off: usize, cols: usize) -> Mat {
    Mat {
        off,
        rs: cols,
        cs: 1,
    }
}

/// The transpose of the row-major matrix at `off` with `cols` columns.
#[cube]
pub(crate) fn transposed(off: usize, cols: usize) -> Mat {
    Mat {
        off,
        rs: 1,
        cs: cols,
    }
}

/// `ws[dst..dst + len] = x[src..src + len]`.
#[cube]
pub(crate) fn load(ws: &mut Tensor<f32>, dst: usize, x: &Tensor<f32>, src: usize, len: usize) {
    let mut i = UNIT_POS as usize;
    while i < len {
        ws[dst + i] = x[src + i];
        i += CUBE_DIM as usize;
    }
    sync_storage();
}

/// `out[dst..dst + len] = ws[src..src + len]`.
#[cube]
pub(crate) fn store(
    out: &mut Tensor<f32>,
    dst: usize,
    ws: &mut Tensor<f32>,
    src: usize,
    len: usize,
) {
    let mut i = UNIT_POS as usize;
    while i < len {
        out[dst + i] = ws[src + i];
        i += CUBE_DIM as usize;
    }
    sync_storage();
}

/// `b_τ = Σ_{s≤τ} log g_s` of the chunk's `c` gates from `log_g[src]` into `ws[b..]`
/// (one unit: a chunk is short).
#[cube]
pub(crate) fn cumulate(ws: &mut Tensor<f32>, b: usize, log_g: &Tensor<f32>, src: usize, c: usize) {
    if UNIT_POS == 0 {
        let mut total = 0.0f32;
        for s in 0..c {
            total += log_g[src + s];
            ws[b + s] = total;
        }
    }
    sync_storage();
}

/// Where a cube keeps its chunk in its row of the workspace: `Q`, `K` `[chunk, d]`,
/// `V [chunk, dv]` and `b [chunk]` one after the other from the row's start, and the
/// order's own buffers from `end`.
#[derive(CubeType, Clone, Copy)]
pub(crate) struct ChunkAt {
    pub(crate) qw: usize,
    pub(crate) kw: usize,
    pub(crate) vw: usize,
    pub(crate) bw: usize,
    pub(crate) end: usize,
}

/// [`ChunkAt`] in the workspace row that starts at `qw`.
#[cube]
pub(crate) fn chunk_at(qw: usize, n: &Dims) -> ChunkAt {
    let kw = qw + n.chunk * n.d;
    let vw = kw + n.chunk * n.d;
    let bw = vw + n.chunk * n.dv;
    ChunkAt {
        qw,
        kw,
        vw,
        bw,
        end: bw + n.chunk,
    }
}

/// Chunk `i` of sequence-and-head `seq` (its `c` tokens of `q`, `k`, `v`, and `b` from its
/// gates in `log_g`) into the workspace at `x`.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn load_chunk(
    ws: &mut Tensor<f32>,
    x: &ChunkAt,
    q: &Tensor<f32>,
    k: &Tensor<f32>,
    v: &Tensor<f32>,
    log_g: &Tensor<f32>,
    seq: usize,
    i: usize,
    n: &Dims,
) {
    let c0 = i * n.chunk;
    let c = span(i, n.chunk, n.time);
    let row = seq * n.time + c0;
    load(ws, x.qw, q, row * n.d, c * n.d);
    load(ws, x.kw, k, row * n.d, c * n.d);
    load(ws, x.vw, v, row * n.dv, c * n.dv);
    cumulate(ws, x.bw, log_g, gates_of(seq, n) + c0, c);
}

/// The decay factor `kind` (`SINCE_START`, `UNTIL_END`, else none) to the power `p` at token
/// `i` of the chunk of `c` tokens whose `b` is at `ws[b..]`.
#[cube]
pub(crate) fn factor(ws: &mut Tensor<f32>, b: usize, c: usize, i: usize, kind: u32, p: f32) -> f32 {
    let mut f = 1.0f32;
    if kind == SINCE_START {
        f = (ws[b + i] * p).exp();
    } else if kind == UNTIL_END {
        f = ((ws[b + c - 1] - ws[b + i]) * p).exp();
    }
    f
}

/// `ρ^p = exp(p b_last)`, the decay over the whole chunk of `c` tokens.
#[cube]
pub(crate) fn rho(ws: &mut Tensor<f32>, b: usize, c: usize, p: f32) -> f32 {
    (ws[b + c - 1] * p).exp()
}

/// `dst = diag(f) src` for the chunk's `rows × cols` row-major matrices (one row per token)
/// and the decay factor `kind^p` (`dst` may be `src`).
#[cube]
pub(crate) fn scale_rows(
    ws: &mut Tensor<f32>,
    dst: usize,
    src: usize,
    rows: usize,
    cols: usize,
    b: usize,
    kind: u32,
    p: f32,
) {
    let mut i = UNIT_POS as usize;
    while i < rows * cols {
        let f = factor(ws, b, rows, i / cols, kind, p);
        ws[dst + i] = ws[src + i] * f;
        i += CUBE_DIM as usize;
    }
    sync_storage();
}

/// `x *= f` for the `len` values at `x`.
#[cube]
pub(crate) fn scale(ws: &mut Tensor<f32>, x: usize, len: usize, f: f32) {
    let mut i = UNIT_POS as usize;
    while i < len {
        ws[x + i] *= f;
        i += CUBE_DIM as usize;
    }
    sync_storage();
}

/// `x ⊙= D^p` for the chunk's `c × c` row-major `x`: `exp(p (b_τ − b_σ))` on and below the
/// diagonal, zero above it.
#[cube]
pub(crate) fn mask(ws: &mut Tensor<f32>, x: usize, c: usize, b: usize, p: f32) {
    let mut i = UNIT_POS as usize;
    while i < c * c {
        let t = i / c;
        let s = i % c;
        if s > t {
            ws[x + i] = 0.0;
        } else {
            ws[x + i] *= ((ws[b + t] - ws[b + s]) * p).exp();
        }
        i += CUBE_DIM as usize;
    }
    sync_storage();
}

/// `out = A B` (`out += A B` when `acc`) for `A [m, k]`, `B [k, n]` and `out [m, n]`, each
/// read through its strides; one unit per output value.
#[cube]
pub(crate) fn matmul(
    ws: &mut Tensor<f32>,
    out: Mat,
    a: Mat,
    b: Mat,
    m: usize,
    n: usize,
    k: usize,
    acc: bool,
) {
    let mut i = UNIT_POS as usize;
    while i < m * n {
        let r = i / n;
        let c = i % n;
        let mut sum = 0.0f32;
        for j in 0..k {
            sum += ws[a.off + r * a.rs + j * a.cs] * ws[b.off + j * b.rs + c * b.cs];
        }
        let at = out.off + r * out.rs + c * out.cs;
        if acc {
            sum += ws[at];
        }
        ws[at] = sum;
        i += CUBE_DIM as usize;
    }
    sync_storage();
}

/// Where the gates of sequence-and-head `seq` start in `log_g [gb, gh, time]`.
#[cube]
fn gates_of(seq: usize, n: &Dims) -> usize {
    gate_row(seq, n.heads, n.gb, n.gh) * n.time
}

/// The row of sequence-and-head `seq` (of `heads` heads) in gates `[gb, gh, ..]`, which
/// the batch or the heads share when `gb` or `gh` is 1.
#[cube]
pub(crate) fn gate_row(seq: usize, heads: usize, gb: usize, gh: usize) -> usize {
    let mut row = 0;
    if gb > 1 {
        row = (seq / heads) * gh;
    }
    if gh > 1 {
        row += seq % heads;
    }
    row
}

/// Where value `(row, col)` of sequence-and-head `seq`'s state lies in `state [b, h,
/// rows, cols]`, read through its strides (a part of a packed state, a transposed view).
#[cube]
pub(crate) fn state_at(
    state: &Tensor<f32>,
    seq: usize,
    heads: usize,
    row: usize,
    col: usize,
) -> usize {
    (seq / heads) * state.stride(0)
        + (seq % heads) * state.stride(1)
        + row * state.stride(2)
        + col * state.stride(3)
}

/// The tokens of chunk `n` of `chunk` in a sequence of `time`.
#[cube]
pub(crate) fn span(n: usize, chunk: usize, time: usize) -> usize {
    let rest = time - n * chunk;
    let mut c = chunk;
    if rest < chunk {
        c = rest;
    }
    c
}
