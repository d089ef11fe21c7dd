//! The node's backward steps as CubeCL kernels in shared memory, run by its backward pass
//! on a GPU device in place of the composed matmuls, masks and scales where the gates need
//! no gradient: a state's read before its scan back over the chunks ([`read`]), and the
//! moment product ([`super::Backward::moment_product`]): per chunk, with the gradient `∂Y`
//! of `Y = T U` (`T = (Q Aᵀ) ⊙ D^p`) and the gradient `∂X` after the chunk of the state
//! `X ← ρ^p X + Aᵀ diag(e^p) U`,
//!
//! ```text
//! G = (∂Y Uᵀ) ⊙ D^p,   ∂U = Tᵀ ∂Y + diag(e^p) A ∂X,   ∂A = Gᵀ Q + diag(e^p) U ∂Xᵀ,   G A
//! ```
//!
//! (first order: `A = K`, `U = V`, `X = S`; hla2: `A`, `V`, `Z`, `p = 2`, then `∂A`'s
//! product with `A = U = K`, `T = W`, `X = S`; third order: `A`, `B`, `Y`, `p = 3`, then
//! `W K` and `W V`; AHLA: `A^γ B` and `A^γ V`). One
//! cube per chunk of every sequence and head, one unit per token: the cube copies `∂X`,
//! then `Q` and `∂Y`, then `A` and `U` into shared memory once; each unit computes its
//! token's rows of `∂U`, `∂A` (from the columns of `T` and `G`) and `G A` (from a row of
//! `G`) there, its rows of `A`, `U` and `∂Y` and its accumulators in registers, and writes
//! each once. The products run on the CUDA cores.

pub(crate) mod kernel;
mod read;

pub(crate) use read::state_read;

use burn::backend::TensorMetadata;
use burn::backend::fusion::custom::TensorSpec;
use burn::backend::tensor::FloatTensor;
use burn::backend::{Backend, backend_extension};
use burn::prelude::*;
use burn::tensor::Shape;
use burn_cubecl::CubeBackend;
use burn_cubecl::kernel::into_contiguous;

use crate::backend::gpu::empty;
use crate::hla::chunks::fused::{Layout, blocks, chunked, grid, layout, sizes};
use crate::hla::decay::Decay;
use kernel::grads_kernel;

/// What one call computes: the chunks' layout and the decay's power `p`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Grads {
    pub(crate) layout: Layout,
    pub(crate) power: u32,
}

/// The kernel on a CubeCL device (every GPU device runs it through fusion as one custom
/// op). Shapes: `q`, `a` `[blocks, c, d]`, `dy`, `u` `[blocks, c, n]`, `t` `[blocks, c,
/// c]`, `x` (`∂X` after every chunk) `[blocks, d, n]`, with blocks = batch × heads ×
/// chunks; the cumulative log gates `b [gb · gh, chunks · c]`.
#[backend_extension(Cube, Fusion)]
pub(crate) trait MomentGrads: Backend {
    /// `(∂U [blocks, c, n], ∂A [blocks, c, d], G A [blocks, c, d])`.
    #[fusion(meta = grads_specs)]
    #[allow(clippy::too_many_arguments)]
    fn moment_grads(
        q: FloatTensor<Self>,
        dy: FloatTensor<Self>,
        a: FloatTensor<Self>,
        u: FloatTensor<Self>,
        t: FloatTensor<Self>,
        x: FloatTensor<Self>,
        b: FloatTensor<Self>,
        grads: Grads,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>);
}

#[allow(clippy::too_many_arguments)]
fn grads_specs(
    q: &TensorSpec,
    dy: &TensorSpec,
    _a: &TensorSpec,
    _u: &TensorSpec,
    _t: &TensorSpec,
    _x: &TensorSpec,
    _b: &TensorSpec,
    _grads: &Grads,
) -> (TensorSpec, TensorSpec, TensorSpec) {
    let spec = |shape: &Shape| TensorSpec::new(shape.clone(), q.dtype);
    (spec(&dy.shape), spec(&q.shape), spec(&q.shape))
}

impl MomentGrads for CubeBackend {
    fn moment_grads(
        q: FloatTensor<Self>,
        dy: FloatTensor<Self>,
        a: FloatTensor<Self>,
        u: FloatTensor<Self>,
        t: FloatTensor<Self>,
        x: FloatTensor<Self>,
        b: FloatTensor<Self>,
        grads: Grads,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        let [q, dy, a, u, t, x, b] = [q, dy, a, u, t, x, b].map(into_contiguous);
        let ([blocks, c, d], n) = (q.shape().dims::<3>(), u.shape().dims::<3>()[2]);
        let (du, da, dq) = (
            empty(&q, [blocks, c, n]),
            empty(&q, [blocks, c, d]),
            empty(&q, [blocks, c, d]),
        );
        let (count, dim) = grid(&q, blocks, c);
        grads_kernel::launch(
            &q.client.clone(),
            count,
            dim,
            q.into_tensor_arg(),
            dy.into_tensor_arg(),
            a.into_tensor_arg(),
            u.into_tensor_arg(),
            t.into_tensor_arg(),
            x.into_tensor_arg(),
            b.into_tensor_arg(),
            du.clone().into_tensor_arg(),
            da.clone().into_tensor_arg(),
            dq.clone().into_tensor_arg(),
            grads.layout.gate_arg(),
            grads.power as f32,
            c,
            d,
            n,
            grads.layout.decayed,
        );
        (du, da, dq)
    }
}

/// `[∂U, ∂A, G A]` of every chunk (`[b, h, chunks, c, n]`, `[.., c, d]`, `[.., c, d]`) from
/// `q`, `∂Y`, `(A, U, T)` and `∂X` after every chunk with the decay's power `power`, where
/// the kernel takes them.
pub(crate) fn moment_grads(
    q: &Tensor<5>,
    dy: &Tensor<5>,
    [a, u, t]: [&Tensor<5>; 3],
    x_after: &Tensor<5>,
    decay: &Decay<5>,
    power: u32,
) -> Option<[Tensor<5>; 3]> {
    use burn::backend::Dispatch;
    let (layout, b) = layout(&[q, u, dy, a, t, x_after], decay)?;
    let (du, da, dq) = <Dispatch as MomentGrads>::moment_grads(
        blocks(q).into_dispatch(),
        blocks(dy).into_dispatch(),
        blocks(a).into_dispatch(),
        blocks(u).into_dispatch(),
        blocks(t).into_dispatch(),
        blocks(x_after).into_dispatch(),
        b.into_dispatch(),
        Grads { layout, power },
    );
    Some([chunked(du, u), chunked(da, q), chunked(dq, q)])
}

/// FLOPs of a kernel of this module if fusion's custom op `id` is its, from its inputs'
/// shapes (`q [blocks, c, d]`, `∂Y [blocks, c, n]`, ...): the multiply-adds of its
/// products, those of the moment product through `T` and `G` over `σ ≥ τ` (columns) or
/// `σ ≤ τ` (rows) only.
pub(crate) fn flops(id: &str, inputs: &[Vec<usize>]) -> Option<f64> {
    if !id.contains("moment_grads") {
        return read::flops(id, inputs);
    }
    let [blocks, c, d] = sizes(&inputs[0]);
    let n = sizes(&inputs[1])[2];
    Some(blocks * (4.0 * c * d * n + c * (c + 1.0) * (3.0 * n + 2.0 * d)))
}
