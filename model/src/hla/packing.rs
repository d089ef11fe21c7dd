//! The layout the kernels (CPU and GPU) exchange with the model: a state's tensors packed
//! per head into one flat tensor, and a kernel's packed `[o, final state]` output.

use burn::prelude::*;

use super::HlaInput;

/// The state tensors `[batch, heads, rows, cols]` as one `[batch · heads · len]` tensor,
/// each head's parts one after the other (the layout of the kernels).
pub(crate) fn pack_state(parts: Vec<Tensor<4>>) -> Tensor<1> {
    let [b, h, ..] = parts[0].dims();
    let rows: Vec<Tensor<2>> = parts
        .into_iter()
        .map(|part| part.reshape([(b * h) as i32, -1]))
        .collect();
    Tensor::cat(rows, 1).reshape([-1])
}

/// `o` and the final state's tensors packed as a kernel packs them: `[o, final state]`,
/// the inverse of [`unpack_output`].
pub(crate) fn pack_output(o: Tensor<4>, state: Vec<Tensor<4>>) -> Tensor<1> {
    let o_len = o.shape().num_elements();
    Tensor::cat(vec![o.reshape([o_len]), pack_state(state)], 0)
}

/// A kernel's packed `[o, final state]` for `input` as `o [batch, heads, time, dv]` and
/// the state's tensors, each head's state made of `parts`.
pub(crate) fn unpack_output(
    packed: Tensor<1>,
    parts: &[[usize; 2]],
    input: &HlaInput,
) -> (Tensor<4>, Vec<Tensor<4>>) {
    let [b, h, t, _] = input.q.dims();
    let dv = input.v.dims()[3];
    let o_len = b * h * t * dv;
    let state = packed.clone().narrow(0, o_len, packed.dims()[0] - o_len);
    let o = packed.narrow(0, 0, o_len).reshape([b, h, t, dv]);
    (o, unpack_state(state, [b, h], parts))
}

/// Floats of one head's packed state made of `parts`.
pub(crate) fn head_len(parts: &[[usize; 2]]) -> usize {
    parts.iter().map(|[rows, cols]| rows * cols).sum()
}

/// The inverse of [`pack_state`] for `[batch, heads]` and each head's `parts`.
pub(crate) fn unpack_state(
    packed: Tensor<1>,
    [b, h]: [usize; 2],
    parts: &[[usize; 2]],
) -> Vec<Tensor<4>> {
    let rows = packed.reshape([b * h, head_len(parts)]);
    let mut offset = 0;
    parts
        .iter()
        .map(|&[r, c]| {
            let part = rows.clone().narrow(1, offset, r * c).reshape([b, h, r, c]);
            offset += r * c;
            part
        })
        .collect()
}
