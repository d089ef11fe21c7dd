//! What a chunk adds to a state, `Kᵀ diag(e^p) U` (`X ← ρ^p X + Kᵀ diag(e^p) U`), as one
//! CubeCL kernel in shared memory: each unit scales its token's row of `U` into shared
//! memory, the cube copies `K` beside it, and its units share the `d × n` sums.

use burn::backend::TensorMetadata;
use burn::backend::fusion::custom::TensorSpec;
use burn::backend::tensor::FloatTensor;
use burn::backend::{Backend, backend_extension};
use burn::prelude::*;
use burn::tensor::Shape;
use burn_cubecl::CubeBackend;
use burn_cubecl::kernel::into_contiguous;

use super::kernel::update_kernel;
use super::{Layout, blocks, chunked, grid, layout, sizes};
use crate::backend::gpu::empty;
use crate::hla::decay::Decay;

/// What one call computes: the chunks' layout and the decay's power `p`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Update {
    pub(crate) layout: Layout,
    pub(crate) power: u32,
}

/// The kernel on a CubeCL device (every GPU device runs it through fusion as one custom
/// op). Shapes: `k` `[blocks, c, d]`, `u` `[blocks, c, n]`, with blocks = batch × heads
/// × chunks; the cumulative log gates `b [gb · gh, chunks · c]`.
#[backend_extension(Cube, Fusion)]
pub(crate) trait ChunkUpdate: Backend {
    /// `Kᵀ diag(e^p) U`, `[blocks, d, n]`.
    #[fusion(meta = update_spec)]
    fn chunk_update(
        k: FloatTensor<Self>,
        u: FloatTensor<Self>,
        b: FloatTensor<Self>,
        update: Update,
    ) -> FloatTensor<Self>;
}

fn update_spec(k: &TensorSpec, u: &TensorSpec, _b: &TensorSpec, _update: &Update) -> TensorSpec {
    TensorSpec::new(Shape::new([k.shape[0], k.shape[2], u.shape[2]]), k.dtype)
}

impl ChunkUpdate for CubeBackend {
    fn chunk_update(
        k: FloatTensor<Self>,
        u: FloatTensor<Self>,
        b: FloatTensor<Self>,
        update: Update,
    ) -> FloatTensor<Self> {
        let [k, u, b] = [k, u, b].map(into_contiguous);
        let ([blocks, c, d], n) = (k.shape().dims::<3>(), u.shape().dims::<3>()[2]);
        let out = empty(&k, [blocks, d, n]);
        let (count, dim) = grid(&k, blocks, c);
        update_kernel::launch(
            &k.client.clone(),
            count,
            dim,
            k.into_tensor_arg(),
            u.into_tensor_arg(),
            b.into_tensor_arg(),
            out.clone().into_tensor_arg(),
            update.layout.gate_arg(),
            update.power as f32,
            c,
            d,
            n,
            update.layout.decayed,
        );
        out
    }
}

/// `Kᵀ diag(e^p) U` of every chunk (`[b, h, chunks, d, n]`) from `k` and `u` with the
/// decay's power `power`, where the kernel takes them.
pub(crate) fn update(
    k: &Tensor<5>,
    u: &Tensor<5>,
    decay: &Decay<5>,
    power: u32,
) -> Option<Tensor<5>> {
    use burn::backend::Dispatch;
    let (layout, b) = layout(&[k, u], decay)?;
    let out = <Dispatch as ChunkUpdate>::chunk_update(
        blocks(k).into_dispatch(),
        blocks(u).into_dispatch(),
        b.into_dispatch(),
        Update { layout, power },
    );
    Some(chunked(out, k))
}

/// FLOPs of the kernel if fusion's custom op `id` is its, from its inputs' shapes (`k
/// [blocks, c, d]`, `u [blocks, c, n]`): the multiply-adds of its product.
pub(crate) fn flops(id: &str, inputs: &[Vec<usize>]) -> Option<f64> {
    if !id.contains("chunk_update") {
        return None;
    }
    let [blocks, c, d] = sizes(&inputs[0]);
    let n = sizes(&inputs[1])[2];
    Some(blocks * 2.0 * c * d * n)
}
