//! A hand-written kernel on the autodiff graph: the inner backend computes the output and the tensors
//! the backward pass needs, and one graph node with a hand-written backward pass replaces
//! the many nodes of the composed form.

use burn::backend::Autodiff;
use burn::backend::Backend;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, NodeGuard, Ops, OpsKind};
use burn::backend::tensor::FloatTensor;

/// The gradient of every input, from the saved tensors, the output's gradient and which
/// inputs want one (a gradient no input wants is dropped unread).
type BackwardFn<B, const N: usize> =
    Box<dyn FnOnce(Vec<FloatTensor<B>>, FloatTensor<B>, [bool; N]) -> [FloatTensor<B>; N] + Send>;

struct KernelNode<B: Backend, const N: usize>(BackwardFn<B, N>);

impl<B: Backend, const N: usize> std::fmt::Debug for KernelNode<B, N> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KernelNode")
    }
}

impl<B: Backend, const N: usize> Backward<B, N> for KernelNode<B, N> {
    type State = Vec<FloatTensor<B>>;

    fn backward(self, ops: Ops<Self::State, N>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad = grads.consume::<B>(&ops.node);
        let wanted = ops.parents.each_ref().map(Option::is_some);
        let input_grads = (self.0)(ops.state, grad, wanted);
        for (parent, grad) in ops.parents.into_iter().zip(input_grads) {
            if let Some(node) = parent {
                grads.register::<B>(node.id, grad);
            }
        }
    }
}

/// Records a kernel: `forward` runs on the inner primitives and returns the output and
/// what `backward` will need; `backward` runs when gradients flow back.
pub(crate) fn record<B: Backend, C: CheckpointStrategy, const N: usize>(
    inputs: [FloatTensor<Autodiff<B, C>>; N],
    forward: impl FnOnce([FloatTensor<B>; N]) -> (FloatTensor<B>, Vec<FloatTensor<B>>),
    backward: impl FnOnce(Vec<FloatTensor<B>>, FloatTensor<B>) -> [FloatTensor<B>; N] + Send + 'static,
) -> FloatTensor<Autodiff<B, C>> {
    record_tracked::<B, C, N>(inputs, |inputs, _| forward(inputs), backward)
}

/// [`record`] for a `forward` told whether a gradient will flow back (`true`), so that
/// one which computes the gradients itself can skip them when none will.
pub(crate) fn record_tracked<B: Backend, C: CheckpointStrategy, const N: usize>(
    inputs: [FloatTensor<Autodiff<B, C>>; N],
    forward: impl FnOnce([FloatTensor<B>; N], bool) -> (FloatTensor<B>, Vec<FloatTensor<B>>),
    backward: impl FnOnce(Vec<FloatTensor<B>>, FloatTensor<B>) -> [FloatTensor<B>; N] + Send + 'static,
) -> FloatTensor<Autodiff<B, C>> {
    record_wanted::<B, C, N>(inputs, forward, move |saved, grad, _| backward(saved, grad))
}

/// [`record_tracked`] for a `backward` told which inputs want a gradient, so that it can
/// skip the work of one that none wants (it returns any tensor in its place).
pub(crate) fn record_wanted<B: Backend, C: CheckpointStrategy, const N: usize>(
    inputs: [FloatTensor<Autodiff<B, C>>; N],
    forward: impl FnOnce([FloatTensor<B>; N], bool) -> (FloatTensor<B>, Vec<FloatTensor<B>>),
    backward: impl FnOnce(Vec<FloatTensor<B>>, FloatTensor<B>, [bool; N]) -> [FloatTensor<B>; N]
    + Send
    + 'static,
) -> FloatTensor<Autodiff<B, C>> {
    let (primitives, guards) = split::<B, C, N>(inputs);
    match KernelNode(Box::new(backward))
        .prepare::<C>(guards)
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => {
            let (output, saved) = forward(primitives, true);
            prep.finish(saved, output)
        }
        OpsKind::UnTracked(prep) => prep.finish(forward(primitives, false).0),
    }
}

/// The inner primitives and the guards that keep their nodes alive until the op is recorded.
fn split<B: Backend, C: CheckpointStrategy, const N: usize>(
    inputs: [FloatTensor<Autodiff<B, C>>; N],
) -> ([FloatTensor<B>; N], [NodeGuard; N]) {
    let mut guards = Vec::with_capacity(N);
    let primitives = inputs.map(|t| {
        let (primitive, guard) = t.into_parts();
        guards.push(guard);
        primitive
    });
    let guards = guards
        .try_into()
        .unwrap_or_else(|_| unreachable!("one guard per input"));
    (primitives, guards)
}
