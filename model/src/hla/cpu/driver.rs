//! The one CPU driver of the per-head kernels of every order: it walks every sequence and
//! head in parallel, either writing each head's results in place into buffers laid out
//! head after head ([`each_head_into`]: the chunked HLA op here, [`forward`] and
//! [`backward`], with q, k, v as `[batch, heads, time, dim]` tensors) or collecting them
//! ([`each_head`] with [`forward_head`] and [`backward_head`]: the mixer's kernels from
//! packed `qkv`, whose heads are gathered and scattered around the kernels).

use burn::backend::TensorMetadata;
use burn::backend::tensor::FloatTensor;
use burn::tensor::Shape;
use rayon::prelude::*;

use super::{ChunkSizes, Grads, HeadInput, HeadKernels};
use crate::backend::Host;

/// What one call of the CPU chunked form computes.
#[derive(Clone, Copy, Debug)]
pub(crate) struct CpuChunked {
    pub(crate) kernels: HeadKernels,
    pub(crate) chunk: usize,
    /// Whether the log gates need a gradient (the data-dependent decay).
    pub(crate) gates: bool,
}

/// `f(i)` for every sequence-and-head `i` of `n`, in parallel.
pub(crate) fn each_head<T: Send>(n: &ChunkSizes, f: impl Fn(usize) -> T + Sync + Send) -> Vec<T> {
    (0..n.sequences()).into_par_iter().map(f).collect()
}

/// `f(i, parts)` for every sequence-and-head `i` of `n`, in parallel, `parts[j]` being
/// head `i`'s share of `buffers[j]` (each laid out head after head; an empty buffer gives
/// every head an empty share).
pub(crate) fn each_head_into<const N: usize>(
    n: &ChunkSizes,
    buffers: [&mut [f32]; N],
    f: impl Fn(usize, [&mut [f32]; N]) + Sync + Send,
) {
    let heads = n.sequences();
    let mut shares: Vec<Vec<&mut [f32]>> = (0..heads).map(|_| Vec::with_capacity(N)).collect();
    for buffer in buffers {
        let len = buffer.len() / heads.max(1);
        let mut rest = buffer;
        for share in &mut shares {
            let (head, tail) = std::mem::take(&mut rest).split_at_mut(len);
            share.push(head);
            rest = tail;
        }
    }
    shares.into_par_iter().enumerate().for_each(|(i, parts)| {
        let parts = <[_; N]>::try_from(parts).unwrap_or_else(|_| unreachable!("N shares"));
        f(i, parts)
    });
}

/// One head's forward results: `o [time, dv]`, the final state and every chunk's start
/// state.
pub(crate) struct HeadForward {
    pub(crate) o: Vec<f32>,
    pub(crate) state: Vec<f32>,
    pub(crate) starts: Vec<f32>,
}

/// Head `x` forward by `kernels` from the initial state `state0`.
pub(crate) fn forward_head(
    kernels: &HeadKernels,
    n: &ChunkSizes,
    x: &HeadInput,
    state0: &[f32],
) -> HeadForward {
    let mut o = vec![0.0; n.time * n.dv];
    let mut starts = vec![0.0; n.chunks() * state0.len()];
    let mut state = state0.to_vec();
    (kernels.forward)(n, x, &mut state, &mut o, &mut starts);
    HeadForward { o, state, starts }
}

/// One head's gradients: of q, k, v, of the initial state, and of the log gates (empty
/// unless asked for).
pub(crate) struct HeadGrads {
    pub(crate) q: Vec<f32>,
    pub(crate) k: Vec<f32>,
    pub(crate) v: Vec<f32>,
    pub(crate) state: Vec<f32>,
    pub(crate) gates: Vec<f32>,
}

/// Head `x` backward by `kernels` from the saved chunk start states, `∂o` (`g_o`) and the
/// final state's gradient (`g_state`); the gates' gradient when `gates`.
pub(crate) fn backward_head(
    kernels: &HeadKernels,
    n: &ChunkSizes,
    x: &HeadInput,
    starts: &[f32],
    (g_o, g_state): (&[f32], &[f32]),
    gates: bool,
) -> HeadGrads {
    let mut grads = HeadGrads {
        q: vec![0.0; x.q.len()],
        k: vec![0.0; x.k.len()],
        v: vec![0.0; x.v.len()],
        state: g_state.to_vec(),
        gates: vec![0.0; if gates { n.time } else { 0 }],
    };
    let mut out = Grads {
        q: &mut grads.q,
        k: &mut grads.k,
        v: &mut grads.v,
        state: &mut grads.state,
        gates: gates.then_some(&mut grads.gates[..]),
    };
    (kernels.backward)(n, x, starts, g_o, &mut out);
    grads
}

/// Sequence-and-head `i`'s inputs in `q, k [.., time, d]`, `v [.., time, dv]` and the gates.
fn head<'a>(n: &ChunkSizes, [q, k, v, g]: [&'a [f32]; 4], i: usize) -> HeadInput<'a> {
    let (t, d, dv) = (n.time, n.d, n.dv);
    HeadInput {
        q: &q[i * t * d..][..t * d],
        k: &k[i * t * d..][..t * d],
        v: &v[i * t * dv..][..t * dv],
        log_g: n.gates_of(g, i),
    }
}

/// `[q, k, v, log g [gb, gh, time], state]` (the state packed per head, see
/// [`crate::hla::pack_state`]) → packed `[o, state]`; saves the inputs but the state, and
/// the start state of every chunk.
pub(crate) fn forward<B: Host>(
    inputs: [FloatTensor<B>; 5],
    kernel: CpuChunked,
) -> (FloatTensor<B>, Vec<FloatTensor<B>>) {
    let [q, k, v, log_g, state0] = inputs;
    let n = ChunkSizes::new(&q.shape(), &v.shape(), &log_g.shape(), kernel.chunk);
    let len = (kernel.kernels.state_len)(n.d, n.dv);
    let sequences = n.sequences();
    let (packed, starts) = {
        let values = [&q, &k, &v, &log_g, &state0].map(|t| B::values(t));
        let [qv, kv, vv, gv, s0] = &values;
        let mut packed = vec![0.0; sequences * (n.time * n.dv + len)];
        let (o, state) = packed.split_at_mut(sequences * n.time * n.dv);
        state.copy_from_slice(s0);
        let mut starts = vec![0.0; sequences * n.chunks() * len];
        each_head_into(&n, [o, state, &mut starts], |i, [o, state, starts]| {
            let x = head(&n, [qv, kv, vv, gv], i);
            (kernel.kernels.forward)(&n, &x, state, o, starts);
        });
        (packed, starts)
    };
    let (packed_len, starts_len) = (packed.len(), starts.len());
    let saved = vec![q, k, v, log_g, B::tensor(starts, Shape::new([starts_len]))];
    (B::tensor(packed, Shape::new([packed_len])), saved)
}

/// Saved `[q, k, v, log g, starts]` and the packed gradient `[∂o, ∂state]` →
/// `[∂q, ∂k, ∂v, ∂log g, ∂state₀]` (zero gates' gradient unless `kernel.gates`).
pub(crate) fn backward<B: Host>(
    saved: Vec<FloatTensor<B>>,
    grad: FloatTensor<B>,
    kernel: CpuChunked,
) -> [FloatTensor<B>; 5] {
    let [q, k, v, log_g, starts] = <[_; 5]>::try_from(saved)
        .unwrap_or_else(|_| unreachable!("saved q, k, v, log g and the starts"));
    let (q_shape, k_shape, v_shape, g_shape) = (q.shape(), k.shape(), v.shape(), log_g.shape());
    let n = ChunkSizes::new(&q_shape, &v_shape, &g_shape, kernel.chunk);
    let (t, dv) = (n.time, n.dv);
    let len = (kernel.kernels.state_len)(n.d, dv);
    let start_len = n.chunks() * len;
    let values = [&q, &k, &v, &log_g, &starts, &grad].map(|t| B::values(t));
    let [qv, kv, vv, gv, sv, grad] = &values;
    let (g_o, g_state) = grad.split_at(n.sequences() * t * dv);
    let (mut dq, mut dk, mut d_v) = (
        vec![0.0; qv.len()],
        vec![0.0; kv.len()],
        vec![0.0; vv.len()],
    );
    let mut d_state = g_state.to_vec();
    let mut dg = vec![0.0; if kernel.gates { n.sequences() * t } else { 0 }];
    let grads = [&mut dq[..], &mut dk, &mut d_v, &mut d_state, &mut dg];
    each_head_into(&n, grads, |i, [q, k, v, state, gates]| {
        let x = head(&n, [qv, kv, vv, gv], i);
        let starts = &sv[i * start_len..][..start_len];
        let gates = kernel.gates.then_some(gates);
        let mut out = Grads {
            q,
            k,
            v,
            state,
            gates,
        };
        (kernel.kernels.backward)(&n, &x, starts, &g_o[i * t * dv..][..t * dv], &mut out);
    });
    let dg = match kernel.gates {
        true => n.gate_sums(&dg),
        false => vec![0.0; gv.len()],
    };
    let state_len = d_state.len();
    [
        B::tensor(dq, q_shape),
        B::tensor(dk, k_shape),
        B::tensor(d_v, v_shape),
        B::tensor(dg, g_shape),
        B::tensor(d_state, Shape::new([state_len])),
    ]
}
