//! The backward pass's read of a state ([`crate::hla::node::Backward::read`]) before its
//! scan back over the chunks, as one CubeCL kernel in shared memory: per chunk, for a state
//! `X` read as `Y = diag(a^p) Q X` (`Q Xᵀ` when transposed), from `∂Y` and `X` at the
//! chunk's start,
//!
//! ```text
//! the update Qᵀ diag(a^p) ∂Y (its transpose),   ∂Q's term diag(a^p) ∂Y Xᵀ (… X)
//! ```
//!
//! One cube per chunk of every sequence and head, one unit per token: each unit scales its
//! row of `∂Y` in registers and computes its row of `∂Q`'s term from `X` in shared memory;
//! then the cube computes the update from `Q` and the scaled rows in shared memory.

use burn::backend::TensorMetadata;
use burn::backend::fusion::custom::TensorSpec;
use burn::backend::tensor::FloatTensor;
use burn::backend::{Backend, backend_extension};
use burn::prelude::*;
use burn_cubecl::CubeBackend;
use burn_cubecl::kernel::into_contiguous;

use super::kernel::read_kernel;
use crate::backend::gpu::empty;
use crate::hla::chunks::fused::{Layout, blocks, chunked, grid, layout, sizes};
use crate::hla::decay::Decay;

/// What one call computes: the chunks' layout, the decay's power `p`, whether the state
/// is read transposed and whether ∂Q's term is added to the terms so far.
#[derive(Clone, Copy, Debug)]
pub(crate) struct StateRead {
    pub(crate) layout: Layout,
    pub(crate) power: u32,
    pub(crate) transposed: bool,
    pub(crate) add_q: bool,
}

/// The kernel on a CubeCL device (every GPU device runs it through fusion as one custom
/// op). Shapes: `q` `[blocks, c, d]`, `dy` `[blocks, c, n]`, `x` (the state at every
/// chunk's start) `[blocks, d, n]` (`[blocks, n, d]` when transposed), `dq_in` (∂Q's
/// terms so far, read with `add_q`; any tensor stands in elsewhere) `[blocks, c, d]`, with
/// blocks = batch × heads × chunks; the cumulative log gates `b [gb · gh, chunks · c]`.
#[backend_extension(Cube, Fusion)]
pub(crate) trait ReadGrads: Backend {
    /// `(the updates [blocks, d, n] ([blocks, n, d] when transposed), ∂Q's term [blocks,
    /// c, d] (plus `dq_in` with `add_q`))`.
    #[fusion(meta = read_specs)]
    fn state_read(
        q: FloatTensor<Self>,
        dy: FloatTensor<Self>,
        x: FloatTensor<Self>,
        b: FloatTensor<Self>,
        dq_in: FloatTensor<Self>,
        read: StateRead,
    ) -> (FloatTensor<Self>, FloatTensor<Self>);
}

fn read_specs(
    q: &TensorSpec,
    _dy: &TensorSpec,
    x: &TensorSpec,
    _b: &TensorSpec,
    _dq_in: &TensorSpec,
    _read: &StateRead,
) -> (TensorSpec, TensorSpec) {
    (
        TensorSpec::new(x.shape.clone(), q.dtype),
        TensorSpec::new(q.shape.clone(), q.dtype),
    )
}

impl ReadGrads for CubeBackend {
    fn state_read(
        q: FloatTensor<Self>,
        dy: FloatTensor<Self>,
        x: FloatTensor<Self>,
        b: FloatTensor<Self>,
        dq_in: FloatTensor<Self>,
        read: StateRead,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let [q, dy, x, b, dq_in] = [q, dy, x, b, dq_in].map(into_contiguous);
        let ([blocks, c, d], n) = (q.shape().dims::<3>(), dy.shape().dims::<3>()[2]);
        let updates = empty(&q, x.shape().dims::<3>());
        let dq = empty(&q, [blocks, c, d]);
        let (count, dim) = grid(&q, blocks, c);
        read_kernel::launch(
            &q.client.clone(),
            count,
            dim,
            q.into_tensor_arg(),
            dy.into_tensor_arg(),
            x.into_tensor_arg(),
            b.into_tensor_arg(),
            dq_in.into_tensor_arg(),
            updates.clone().into_tensor_arg(),
            dq.clone().into_tensor_arg(),
            read.layout.gate_arg(),
            read.power as f32,
            c,
            d,
            n,
            read.layout.decayed,
            read.transposed,
            read.add_q,
        );
        (updates, dq)
    }
}

/// `(the updates, ∂Q's term plus `dq_in`)` of every chunk (`[b, h, chunks, d, n]` or
/// `[.., n, d]`, `[.., c, d]`) from `q`, `∂Y` and `X` at every chunk's start, with the
/// decay's power `power`, where the kernel takes them.
pub(crate) fn state_read(
    q: &Tensor<5>,
    dy: &Tensor<5>,
    x_start: &Tensor<5>,
    (decay, power): (&Decay<5>, u32),
    transposed: bool,
    dq_in: Option<&Tensor<5>>,
) -> Option<(Tensor<5>, Tensor<5>)> {
    use burn::backend::Dispatch;
    let mut operands = vec![q, dy, x_start];
    operands.extend(dq_in);
    let (layout, b) = layout(&operands, decay)?;
    let (updates, dq) = <Dispatch as ReadGrads>::state_read(
        blocks(q).into_dispatch(),
        blocks(dy).into_dispatch(),
        blocks(x_start).into_dispatch(),
        b.into_dispatch(),
        // Without terms so far, q stands in (unread).
        blocks(dq_in.unwrap_or(q)).into_dispatch(),
        StateRead {
            layout,
            power,
            transposed,
            add_q: dq_in.is_some(),
        },
    );
    Some((chunked(updates, x_start), chunked(dq, q)))
}

/// FLOPs of the kernel if fusion's custom op `id` is its, from its inputs' shapes (`q
/// [blocks, c, d]`, `∂Y [blocks, c, n]`, ...): the multiply-adds of its two products.
pub(crate) fn flops(id: &str, inputs: &[Vec<usize>]) -> Option<f64> {
    if !id.contains("state_read") {
        return None;
    }
    let [blocks, c, d] = sizes(&inputs[0]);
    let n = sizes(&inputs[1])[2];
    Some(blocks * 4.0 * c * d * n)
}
