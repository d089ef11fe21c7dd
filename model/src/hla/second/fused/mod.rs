//! hla2's moments step of the chunk equations ([`super::chunked`]) as one CubeCL kernel in
//! shared memory; its outputs step is the output kernel every order shares, and `Z`'s
//! updates `Aᵀ diag(e²) V` the pass over the chunks every state takes
//! ([`crate::hla::chunks::fused`]). Per chunk, with the key moment `S` at its start,
//!
//! ```text
//! W = D ⊙ (Q Kᵀ),   A = diag(a) Q Sᵀ + W K
//! ```
//!
//! One cube per chunk of every sequence and head, one unit per token: the cube copies
//! `S`, then `K` into shared memory once; each unit computes its token's rows of `W` and
//! `A` from there, its query and accumulators in registers, and writes each once. The
//! products run on the CUDA cores; where a device has tensor cores, the step runs as the
//! output step's tiles instead (`R = V = K`, `X = Sᵀ`, `p = 1`:
//! [`crate::hla::chunks::fused::tiles`]).

pub(crate) mod kernel;

use burn::backend::TensorMetadata;
use burn::backend::fusion::custom::TensorSpec;
use burn::backend::tensor::FloatTensor;
use burn::backend::{Backend, backend_extension};
use burn::prelude::*;
use burn::tensor::Shape;
use burn_cubecl::CubeBackend;

use crate::backend::gpu::{contiguous, empty};
use crate::hla::chunks::fused::{
    Layout, Output, blocks, chunked, grid, launch_tiles, layout, sizes, tiled,
};
use crate::hla::decay::Decay;
use kernel::moments_kernel;

/// The kernel on a CubeCL device (every GPU device runs it through fusion as one custom
/// op). Shapes: `q`, `k` `[blocks, c, d]`, the key moment at the chunks' starts `s`
/// `[blocks, d, d]`, with blocks = batch × heads × chunks; the cumulative log gates `b
/// [gb · gh, chunks · c]`.
#[backend_extension(Cube, Fusion)]
pub(crate) trait Hla2Fused: Backend {
    /// `(W [blocks, c, c], A [blocks, c, d])`.
    #[fusion(meta = moments_specs)]
    fn hla2_moments(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        s: FloatTensor<Self>,
        b: FloatTensor<Self>,
        layout: Layout,
    ) -> (FloatTensor<Self>, FloatTensor<Self>);
}

fn moments_specs(
    q: &TensorSpec,
    _k: &TensorSpec,
    _s: &TensorSpec,
    _b: &TensorSpec,
    _layout: &Layout,
) -> (TensorSpec, TensorSpec) {
    let [blocks, c, d] = [q.shape[0], q.shape[1], q.shape[2]];
    let spec = |dims: [usize; 3]| TensorSpec::new(Shape::new(dims), q.dtype);
    (spec([blocks, c, c]), spec([blocks, c, d]))
}

impl Hla2Fused for CubeBackend {
    fn hla2_moments(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        s: FloatTensor<Self>,
        b: FloatTensor<Self>,
        layout: Layout,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let [q, k, s, b] = [q, k, s, b].map(contiguous);
        let [blocks, c, d] = q.shape().dims::<3>();
        let (w, a) = (empty(&q, [blocks, c, c]), empty(&q, [blocks, c, d]));
        if let Some(mma) = tiled(&q, c, d, d) {
            // The output step's tiles: R = V = K, X = Sᵀ (read from S by columns), p = 1.
            let output = Output {
                layout,
                power: 1,
                scores: true,
                transposed: true,
            };
            launch_tiles(q, k.clone(), k, s, b, (&w, &a), output, mma);
            return (w, a);
        }
        // A unit's rows: q and the sums of A.
        let (count, dim, per_unit) = grid(&q, blocks, c, 2 * d);
        moments_kernel::launch(
            &q.client.clone(),
            count,
            dim,
            q.into_tensor_arg(),
            k.into_tensor_arg(),
            s.into_tensor_arg(),
            b.into_tensor_arg(),
            w.clone().into_tensor_arg(),
            a.clone().into_tensor_arg(),
            layout.gate_arg(),
            c,
            d,
            layout.decayed,
            per_unit,
        );
        (w, a)
    }
}

/// FLOPs of the moments kernel if fusion's custom op `id` is its, from its inputs' shapes
/// (`q`, `k [blocks, c, d]`, ...): the multiply-adds of its products, `W` and `W K` over
/// `σ ≤ τ` only.
pub(crate) fn flops(id: &str, inputs: &[Vec<usize>]) -> Option<f64> {
    if !id.contains("hla2_moments") {
        return None;
    }
    let [blocks, c, d] = sizes(&inputs[0]);
    Some(blocks * (2.0 * c * d * d + 2.0 * c * (c + 1.0) * d))
}

/// `(W, A)` of every chunk (`[b, h, chunks, c, c]`, `[.., c, d]`) from `q`, `k` and the
/// key moment at every chunk's start, where the kernel takes them.
pub(crate) fn moments(
    q: &Tensor<5>,
    k: &Tensor<5>,
    s_start: &Tensor<5>,
    decay: &Decay<5>,
) -> Option<(Tensor<5>, Tensor<5>)> {
    use burn::backend::Dispatch;
    let (layout, b) = layout(&[q, k, s_start], decay)?;
    let (w, a) = <Dispatch as Hla2Fused>::hla2_moments(
        blocks(q).into_dispatch(),
        blocks(k).into_dispatch(),
        blocks(s_start).into_dispatch(),
        b.into_dispatch(),
        layout,
    );
    Some((chunked(w, q), chunked(a, q)))
}
