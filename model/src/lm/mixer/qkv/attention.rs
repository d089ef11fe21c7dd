//! The softmax mixer's CPU kernel: one kernel each way takes every head's slice of the tokens,
//! rotates q and k by RoPE (Burn's `RotaryEncoding`: pairs `(x₂ᵢ, x₂ᵢ₊₁)` turned by the
//! angle of pair `i` at the token's position) and runs the causal attention's CPU kernel
//! ([`crate::lm::attention::cpu`]); backward, the gradients are turned back by the
//! transposed rotation.

#![allow(deprecated)] // the generated dispatch names NdArray, a supported CPU device

use crate::backend::autodiff::record;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::{Autodiff, Backend, backend_extension};

use burn::backend::TensorMetadata;
use burn::backend::tensor::FloatTensor;
use burn::prelude::*;
use burn::tensor::Shape;
use rayon::prelude::*;

use super::{head_rows, scatter, transpose};
use crate::backend::Host;
use crate::lm::attention::cpu::{AttentionHead, AttentionSizes, backward_head, forward_head};

/// `qkv [batch, time, 3·d]` of tokens from position 0 and the RoPE table `[time, dh, 2]`
/// (cos and sin of every element's pair at every position) → `o [batch, time, d]`.
pub(crate) fn forward(qkv: Tensor<3>, rope: Tensor<3>, heads: usize) -> Tensor<3> {
    let o = <burn::backend::Dispatch as QkvAttentionCpuOps>::qkv_attention(
        qkv.into_dispatch(),
        rope.into_dispatch(),
        heads,
    );
    Tensor::from_dispatch(o)
}

/// `x` turned by the table rows `rope [time, dh·2]`, row by row; `inverse`: turned back
/// (the transposed rotation, which maps a gradient of the output to one of the input).
fn rotate(x: &mut [f32], rope: &[f32], dh: usize, inverse: bool) {
    let sign = if inverse { -1.0 } else { 1.0 };
    for (row, table) in x.chunks_exact_mut(dh).zip(rope.chunks_exact(2 * dh)) {
        for (pair, angle) in row.chunks_exact_mut(2).zip(table.chunks_exact(4)) {
            let (c, s) = (angle[0], sign * angle[1]);
            let (a, b) = (pair[0], pair[1]);
            pair[0] = a * c - b * s;
            pair[1] = a * s + b * c;
        }
    }
}

/// The call's `(sequences × heads, time, d, dh)`.
fn sizes(qkv: &Shape, heads: usize) -> (usize, usize, usize, usize) {
    let d = qkv[2] / 3;
    (qkv[0] * heads, qkv[1], d, d / heads)
}

/// Head `i`'s rotated q and k and its v, each `[time, dh]`.
fn gather(
    qkv: &[f32],
    rope: &[f32],
    i: usize,
    heads: usize,
    (time, d, dh): (usize, usize, usize),
) -> [Vec<f32>; 3] {
    let at = (i / heads, i % heads);
    let [mut q, mut k, v] = [0, 1, 2].map(|part| head_rows(qkv, at, (part, 3), (time, d, dh)));
    rotate(&mut q, rope, dh, false);
    rotate(&mut k, rope, dh, false);
    [q, k, v]
}

/// `[qkv, rope]` → `o [batch, time, d]`; saves `qkv`, `rope`, `o` and every query's
/// log-sum-exp.
pub(crate) fn kernel_forward<B: Host>(
    [qkv, rope]: [FloatTensor<B>; 2],
    heads: usize,
) -> (FloatTensor<B>, Vec<FloatTensor<B>>) {
    let qkv_shape = qkv.shape();
    let (sequences, time, d, dh) = sizes(&qkv_shape, heads);
    let n = AttentionSizes::new(sequences, (time, time), (dh, dh), 0);
    let (o, lse) = {
        let (x, table) = (B::values(&qkv), B::values(&rope));
        let per_head: Vec<[Vec<f32>; 2]> = (0..sequences)
            .into_par_iter()
            .map(|i| {
                let [q, k, v] = gather(&x, &table, i, heads, (time, d, dh));
                let (mut o, mut lse) = (vec![0.0; time * dh], vec![0.0; time]);
                forward_head(&n, &q, &k, &v, &mut o, &mut lse);
                [o, lse]
            })
            .collect();
        let [o, lse] = transpose(per_head);
        let mut out = vec![0.0; qkv_shape[0] * time * d];
        scatter(&mut out, &[&o], (time, d, dh));
        (out, lse.concat())
    };
    let o = B::tensor(o, Shape::new([qkv_shape[0], time, d]));
    let lse_len = lse.len();
    (
        o.clone(),
        vec![qkv, rope, o, B::tensor(lse, Shape::new([lse_len]))],
    )
}

/// Saved `[qkv, rope, o, lse]` and `∂o` → `[∂qkv, 0]` (the table gets none).
pub(crate) fn kernel_backward<B: Host>(
    saved: Vec<FloatTensor<B>>,
    grad: FloatTensor<B>,
    heads: usize,
) -> [FloatTensor<B>; 2] {
    let [qkv, rope, o, lse] = <[_; 4]>::try_from(saved)
        .unwrap_or_else(|_| unreachable!("saved qkv, the table, o and lse"));
    let (qkv_shape, rope_shape) = (qkv.shape(), rope.shape());
    let (sequences, time, d, dh) = sizes(&qkv_shape, heads);
    let n = AttentionSizes::new(sequences, (time, time), (dh, dh), 0);
    let values = [&qkv, &rope, &o, &lse, &grad].map(|t| B::values(t));
    let [x, table, ov, lv, g] = &values;
    let per_head: Vec<[Vec<f32>; 3]> = (0..sequences)
        .into_par_iter()
        .map(|i| {
            let [q, k, v] = gather(x, table, i, heads, (time, d, dh));
            let at = (i / heads, i % heads);
            let (o, g) = (
                head_rows(ov, at, (0, 1), (time, d, dh)),
                head_rows(g, at, (0, 1), (time, d, dh)),
            );
            let head = AttentionHead {
                q: &q,
                k: &k,
                v: &v,
                o: &o,
                lse: &lv[i * time..][..time],
                g: &g,
            };
            let (mut dq, mut dk, mut dv) = (
                vec![0.0; time * dh],
                vec![0.0; time * dh],
                vec![0.0; time * dh],
            );
            backward_head(&n, head, &mut dq, &mut dk, &mut dv);
            rotate(&mut dq, table, dh, true);
            rotate(&mut dk, table, dh, true);
            [dq, dk, dv]
        })
        .collect();
    let [dq, dk, dv] = transpose(per_head);
    let mut dqkv = vec![0.0; x.len()];
    scatter(&mut dqkv, &[&dq, &dk, &dv], (time, d, dh));
    [
        B::tensor(dqkv, qkv_shape),
        B::tensor(vec![0.0; table.len()], rope_shape),
    ]
}

/// The softmax mixer from qkv as a Burn backend extension: the CPU backends run its kernel, and their
/// autodiff wrapper records it as one graph node whose backward pass is the backward
/// kernel.
#[backend_extension(
    Autodiff,
    NdArray: cfg(feature = "ndarray"),
    Flex: cfg(feature = "flex")
)]
pub(crate) trait QkvAttentionCpuOps: Backend {
    /// The softmax mixer from `qkv [batch, time, 3·d]` and the RoPE table of its positions
    /// ([`forward`]).
    fn qkv_attention(
        qkv: FloatTensor<Self>,
        rope: FloatTensor<Self>,
        heads: usize,
    ) -> FloatTensor<Self>;
}

impl<B: Host> QkvAttentionCpuOps for B {
    fn qkv_attention(qkv: FloatTensor<B>, rope: FloatTensor<B>, heads: usize) -> FloatTensor<B> {
        kernel_forward::<B>([qkv, rope], heads).0
    }
}

impl<B: Host, C: CheckpointStrategy> QkvAttentionCpuOps for Autodiff<B, C> {
    fn qkv_attention(
        qkv: FloatTensor<Self>,
        rope: FloatTensor<Self>,
        heads: usize,
    ) -> FloatTensor<Self> {
        record::<B, C, 2>(
            [qkv, rope],
            |inputs| kernel_forward::<B>(inputs, heads),
            move |saved, grad| kernel_backward::<B>(saved, grad, heads),
        )
    }
}
