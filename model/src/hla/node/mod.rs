//! Every order's chunked form as one autodiff node, on every device: its forward pass is
//! the composed form's chunk equations run on the inner (non-autodiff) device, and its
//! backward pass is written by hand with the same kind of ops (batched matmuls over
//! `[b, h, chunks, chunk, n]`, the masks of the decay, one scan over the chunks per
//! state, run backwards). Burn's autodiff records hundreds of nodes for the composed
//! form, each saving its inputs and each a pass of its own in the backward; this is one
//! node whose backward pass follows the decomposition (docs/math.md §5): the value-side
//! state's gradient first, the parallel products, then the key moment's gradient, then
//! the gradients of q and k. Each order writes its backward pass in its `node` module;
//! the composed form stays its test oracle.

mod backward;
#[cfg(gpu_kernels)]
pub(crate) mod fused;
mod ops;

pub(crate) use backward::{Backward, parts};
pub(crate) use ops::HlaNodeOps;

use burn::prelude::*;

use super::HlaInput;
use super::chunks::{Chunked, Chunks};
use super::decay::Decay;
use super::packing::{pack_output, pack_state, unpack_output};
use crate::backend::bridge::Inner;
use burn::backend::tensor::FloatTensor;

/// What one call of the node computes.
#[derive(Clone, Copy, Debug)]
pub(crate) struct NodeChunked {
    pub(crate) kernels: NodeKernels,
    pub(crate) chunk: usize,
    /// Whether the call has gates (the log gates are zeros otherwise, and ignored).
    pub(crate) decay: bool,
    /// Whether the log gates need a gradient (the data-dependent decay).
    pub(crate) gates: bool,
    /// Whether the call has an initial state (a zero state is not a tensor: the scans
    /// start from zeros, and the packed state input is a placeholder).
    pub(crate) start: bool,
    /// Whether the call returns the final state: the output is then `[o, final state]`
    /// packed, else `o` itself (no copy to pack it, nor a full-size gradient to unpack).
    pub(crate) keep: bool,
}

/// One order's node: its forward and backward passes.
#[derive(Clone, Copy, Debug)]
pub(crate) struct NodeKernels {
    /// From the input in chunks and the initial state's tensors (`None`: zeros).
    pub(crate) forward: fn(Chunked, Option<Vec<Tensor<4>>>) -> NodeForward,
    /// From the input in chunks (with the forward pass's decay), the forward pass's saved
    /// tensors, the output's and final state's gradients and whether the gates need a
    /// gradient.
    pub(crate) backward: fn(Chunked, Vec<Tensor<5>>, Cotangent, bool) -> NodeGrads,
    /// One head's state as `[rows, cols]` parts.
    pub(crate) state_parts: fn(usize, usize) -> Vec<[usize; 2]>,
}

/// A forward pass: `o [b, h, time, dv]`, the final state's tensors, and what the backward
/// pass needs besides the inputs.
pub(crate) struct NodeForward {
    pub(crate) o: Tensor<4>,
    pub(crate) state: Vec<Tensor<4>>,
    pub(crate) saved: Vec<Tensor<5>>,
}

/// The gradients flowing in: of `o [b, h, time, dv]` and of the final state's tensors
/// (`None` when the call returns no final state: zeros).
pub(crate) struct Cotangent {
    pub(crate) o: Tensor<4>,
    pub(crate) state: Option<Vec<Tensor<4>>>,
}

/// The gradients flowing out: of q, k, v, of the log gates per sequence and head
/// (`[b, h, time]`, when asked for) and of the initial state's tensors.
pub(crate) struct NodeGrads {
    pub(crate) q: Tensor<4>,
    pub(crate) k: Tensor<4>,
    pub(crate) v: Tensor<4>,
    pub(crate) log_g: Option<Tensor<3>>,
    pub(crate) state: Vec<Tensor<4>>,
}

/// The call's input from the node's tensors.
fn input(
    q: Tensor<4>,
    k: Tensor<4>,
    v: Tensor<4>,
    log_g: Tensor<3>,
    node: NodeChunked,
) -> HlaInput {
    HlaInput {
        q,
        k,
        v,
        log_g: node.decay.then_some(log_g),
    }
}

/// One head's state parts for `input`.
fn state_parts(input: &HlaInput, node: NodeChunked) -> Vec<[usize; 2]> {
    (node.kernels.state_parts)(input.q.dims()[3], input.v.dims()[3])
}

/// `[q, k, v, log g [gb, gh, time], state]` (the state packed per head, a placeholder
/// without one) → the packed `[o, final state]` (`o` alone without `node.keep`), and when
/// `tracked` what the backward pass needs: `[q, k, v, log g]`, with gates the cumulative
/// log gates in chunks `b [gb, gh, chunks, chunk, 1]` (the backward pass makes them
/// again otherwise), and the order's saved tensors.
pub(crate) fn forward<B: Inner>(
    inputs: [FloatTensor<B>; 5],
    node: NodeChunked,
    tracked: bool,
) -> (FloatTensor<B>, Vec<FloatTensor<B>>) {
    let [q, k, v, log_g, state] = inputs;
    let log_g = B::tensor::<3>(log_g);
    let x = input(
        B::tensor(q),
        B::tensor(k),
        B::tensor(v),
        log_g.clone(),
        node,
    );
    let [b, h, ..] = x.q.dims();
    let state = node
        .start
        .then(|| crate::hla::unpack_state(B::tensor(state), [b, h], &state_parts(&x, node)));
    let chunked = Chunked::new(&x, node.chunk);
    let cumulative = chunked.decay.log_decay();
    let out = (node.kernels.forward)(chunked, state);
    let output = match node.keep {
        true => B::primitive(pack_output(out.o, out.state)),
        false => B::primitive(out.o),
    };
    let saved = match tracked {
        false => Vec::new(),
        true => {
            let mut saved = vec![B::primitive(x.q), B::primitive(x.k), B::primitive(x.v)];
            saved.push(B::primitive(log_g));
            saved.extend(cumulative.map(B::primitive));
            saved.extend(out.saved.into_iter().map(B::primitive));
            saved
        }
    };
    (output, saved)
}

/// Saved `[q, k, v, log g, b (with gates), the order's tensors]` and the output's
/// gradient (packed `[∂o, ∂state]` with `node.keep`, else `∂o`) →
/// `[∂q, ∂k, ∂v, ∂log g, ∂state₀]` (the gates' gradient zero unless `node.gates`); the
/// gates' and the initial state's only where `wanted` (else a placeholder: the fixed
/// decay and a zero state want none, and packing the state's gradient is a copy).
pub(crate) fn backward<B: Inner>(
    saved: Vec<FloatTensor<B>>,
    grad: FloatTensor<B>,
    node: NodeChunked,
    [.., gates_wanted, state_wanted]: [bool; 5],
) -> [FloatTensor<B>; 5] {
    let mut saved = saved.into_iter();
    let mut next = || saved.next().expect("a saved tensor per input");
    let (q, k, v) = (B::tensor(next()), B::tensor(next()), B::tensor(next()));
    let log_g = B::tensor::<3>(next());
    let cumulative = node.decay.then(|| B::tensor::<5>(next()));
    let order_saved = saved.map(B::tensor::<5>).collect();
    let g_dims = log_g.dims();
    let x = input(q, k, v, log_g, node);
    let chunks = Chunks::new(x.time(), node.chunk);
    let chunked = Chunked::with_decay(&x, chunks, Decay::from_cumulative_or_none(cumulative));
    let (o, state) = match node.keep {
        true => {
            let (o, state) = unpack_output(B::tensor(grad), &state_parts(&x, node), &x);
            (o, Some(state))
        }
        false => (B::tensor(grad), None),
    };
    let grads = (node.kernels.backward)(chunked, order_saved, Cotangent { o, state }, node.gates);
    let device = x.q.device();
    let placeholder = || B::primitive(Tensor::<1>::empty([1], &device));
    let log_g = match (gates_wanted, grads.log_g) {
        (false, _) => placeholder(),
        (true, Some(g)) => B::primitive(broadcast_sum(g, g_dims)),
        (true, None) => B::primitive(Tensor::<3>::zeros(g_dims, &device)),
    };
    let state = match state_wanted {
        true => B::primitive(pack_state(grads.state)),
        false => placeholder(),
    };
    [
        B::primitive(grads.q),
        B::primitive(grads.k),
        B::primitive(grads.v),
        log_g,
        state,
    ]
}

/// `g [b, h, time]` summed over the axes the gates `[gb, gh, time]` share.
fn broadcast_sum(g: Tensor<3>, [gb, gh, _]: [usize; 3]) -> Tensor<3> {
    let [b, h, _] = g.dims();
    let g = if gb == 1 && b > 1 { g.sum_dim(0) } else { g };
    if gh == 1 && h > 1 { g.sum_dim(1) } else { g }
}
