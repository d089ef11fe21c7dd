//! The fused chunk-parallel forms as one op on the inner backend's tensors: every sequence
//! and head in parallel, forward (saving each chunk's start state) and backward.

use burn::backend::TensorMetadata;
use burn::backend::tensor::FloatTensor;
use burn::tensor::Shape;
use rayon::prelude::*;

use super::{Grads, Head, Sizes, backward_head, forward_head, state_len};
use crate::fused::Host;
use crate::hla::Order;

/// What one fused call computes.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Kernel {
    pub(crate) order: Order,
    pub(crate) chunk: usize,
    /// Whether the log gates need a gradient (the data-dependent decay).
    pub(crate) gates: bool,
}

/// Sequence-and-head `i`'s inputs in `q, k [.., time, d]`, `v [.., time, dv]` and the gates.
fn head<'a>(n: &Sizes, [q, k, v, g]: [&'a [f32]; 4], i: usize) -> Head<'a> {
    let (t, d, dv) = (n.time, n.d, n.dv);
    Head {
        q: &q[i * t * d..][..t * d],
        k: &k[i * t * d..][..t * d],
        v: &v[i * t * dv..][..t * dv],
        log_g: n.gates_of(g, i),
    }
}

/// `[q, k, v, log g [gb, gh, time], state]` (the state packed per head, see
/// [`super::pack_state`]) → packed `[o, state]`; saves the inputs but the state, and the
/// start state of every chunk.
pub(crate) fn forward<B: Host>(
    inputs: [FloatTensor<B>; 5],
    kernel: Kernel,
) -> (FloatTensor<B>, Vec<FloatTensor<B>>) {
    let [q, k, v, log_g, state0] = inputs;
    let n = Sizes::new(&q.shape(), &v.shape(), &log_g.shape(), kernel.chunk);
    let len = state_len(kernel.order, n.d, n.dv);
    let (packed, starts) = {
        let values = [&q, &k, &v, &log_g, &state0].map(|t| B::values(t));
        let [qv, kv, vv, gv, s0] = &values;
        let sequences = n.sequences();
        let mut packed = vec![0.0; sequences * (n.time * n.dv + len)];
        let (o, state) = packed.split_at_mut(sequences * n.time * n.dv);
        state.copy_from_slice(s0);
        let start_len = n.chunks() * len;
        let mut starts = vec![0.0; sequences * start_len];
        let heads = o
            .par_chunks_mut(n.time * n.dv)
            .zip(state.par_chunks_mut(len))
            .zip(starts.par_chunks_mut(start_len))
            .enumerate();
        heads.for_each(|(i, ((o, state), starts))| {
            let x = head(&n, [qv, kv, vv, gv], i);
            forward_head(kernel.order, &n, &x, state, o, starts);
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
    kernel: Kernel,
) -> [FloatTensor<B>; 5] {
    let [q, k, v, log_g, starts] = <[_; 5]>::try_from(saved)
        .unwrap_or_else(|_| unreachable!("saved q, k, v, log g and the starts"));
    let (q_shape, k_shape, v_shape, g_shape) = (q.shape(), k.shape(), v.shape(), log_g.shape());
    let n = Sizes::new(&q_shape, &v_shape, &g_shape, kernel.chunk);
    let (t, d, dv) = (n.time, n.d, n.dv);
    let len = state_len(kernel.order, d, dv);
    let values = [&q, &k, &v, &log_g, &starts, &grad].map(|t| B::values(t));
    let [qv, kv, vv, gv, sv, grad] = &values;
    let sequences = n.sequences();
    let (g_o, g_state) = grad.split_at(sequences * t * dv);
    let (mut dq, mut dk, mut d_v) = (
        vec![0.0; qv.len()],
        vec![0.0; kv.len()],
        vec![0.0; vv.len()],
    );
    let mut d_state = g_state.to_vec();
    let mut dg = vec![0.0; if kernel.gates { sequences * t } else { 0 }];
    let start_len = n.chunks() * len;
    let heads = dq
        .par_chunks_mut(t * d)
        .zip(dk.par_chunks_mut(t * d))
        .zip(d_v.par_chunks_mut(t * dv))
        .zip(d_state.par_chunks_mut(len))
        .enumerate();
    let gate_rows: Vec<Option<&mut [f32]>> = match kernel.gates {
        true => dg.chunks_mut(t).map(Some).collect(),
        false => (0..sequences).map(|_| None).collect(),
    };
    heads
        .zip(gate_rows)
        .for_each(|((i, (((dq, dk), dv_i), state)), gates)| {
            let x = head(&n, [qv, kv, vv, gv], i);
            let mut out = Grads {
                q: dq,
                k: dk,
                v: dv_i,
                state,
                gates,
            };
            let g = &g_o[i * t * dv..][..t * dv];
            let starts = &sv[i * start_len..][..start_len];
            backward_head(kernel.order, &n, &x, starts, g, &mut out);
        });
    let dg = if kernel.gates {
        n.gate_sums(&dg)
    } else {
        vec![0.0; gv.len()]
    };
    [
        B::tensor(dq, q_shape),
        B::tensor(dk, k_shape),
        B::tensor(d_v, v_shape),
        B::tensor(dg, g_shape),
        B::tensor(d_state, Shape::new([sequences * len])),
    ]
}
