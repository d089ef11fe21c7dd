//! The parallel steps of the chunk equations ([`super::chunked`]) as one CubeCL kernel
//! each, in shared memory: the node's forward pass on a GPU device runs these in place of
//! the composed matmuls, masks and scales (a dozen launches each) wherever no gradient
//! is tracked. Per chunk, with the state at its start:
//!
//! ```text
//! moments:  W = D ⊙ (Q Kᵀ),  A = diag(a) Q Sᵀ + W K,  ΔZ = Aᵀ diag(e²) V
//! outputs:  P = D² ⊙ (Q Aᵀ),  O = diag(a²) Q Z + P V
//! ```
//!
//! One cube per chunk of every sequence and head, one unit per token of the chunk: the
//! cube copies `S` (then `K`, then `V`; for the outputs `Z`, then `A` and `V`) into shared
//! memory once, and each unit computes its token's rows from there, its query and
//! accumulators in registers. Each of `W`, `A`, `ΔZ`, `P` and `O` is written once; no
//! intermediate reaches global memory. The products run on the CUDA cores.

mod kernel;

use burn::backend::TensorMetadata;
use burn::backend::fusion::custom::TensorSpec;
use burn::backend::tensor::FloatTensor;
use burn::backend::{Backend, backend_extension};
use burn::prelude::*;
use burn::tensor::Shape;
use burn_cubecl::CubeBackend;
use burn_cubecl::cubecl::prelude::{CubeCount, CubeDim};
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::tensor::CubeTensor;

use crate::backend::gpu::{cubes, empty, shared_bytes};
use crate::hla::decay::Decay;
use kernel::{moments_kernel, outputs_kernel, shared_buffer};

/// How a call's chunks are laid out: the heads, the chunks of a sequence, the gates'
/// `[gb, gh]` and whether they decay (without, the gates are not read).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Layout {
    pub(crate) heads: usize,
    pub(crate) chunks: usize,
    pub(crate) gates: [usize; 2],
    pub(crate) decayed: bool,
}

/// The kernels on a CubeCL device (every GPU device runs each through fusion as one
/// custom op). Shapes: `q`, `k` `[blocks, c, d]`, `v` `[blocks, c, dv]`, the states at
/// the chunks' starts `s` `[blocks, d, d]`, `z` `[blocks, d, dv]`, with blocks = batch ×
/// heads × chunks; the cumulative log gates `b [gb · gh, chunks · c]`.
#[backend_extension(Cube, Fusion)]
pub(crate) trait Hla2Fused: Backend {
    /// `(W [blocks, c, c], A [blocks, c, d], ΔZ [blocks, d, dv])`.
    #[fusion(meta = moments_specs)]
    fn hla2_moments(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        s: FloatTensor<Self>,
        b: FloatTensor<Self>,
        layout: Layout,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>);

    /// `(P [blocks, c, c], O [blocks, c, dv])`.
    #[fusion(meta = outputs_specs)]
    fn hla2_outputs(
        q: FloatTensor<Self>,
        a: FloatTensor<Self>,
        v: FloatTensor<Self>,
        z: FloatTensor<Self>,
        b: FloatTensor<Self>,
        layout: Layout,
    ) -> (FloatTensor<Self>, FloatTensor<Self>);
}

fn moments_specs(
    q: &TensorSpec,
    _k: &TensorSpec,
    v: &TensorSpec,
    _s: &TensorSpec,
    _b: &TensorSpec,
    _layout: &Layout,
) -> (TensorSpec, TensorSpec, TensorSpec) {
    let [blocks, c, d] = [q.shape[0], q.shape[1], q.shape[2]];
    let spec = |dims: [usize; 3]| TensorSpec::new(Shape::new(dims), q.dtype);
    (
        spec([blocks, c, c]),
        spec([blocks, c, d]),
        spec([blocks, d, v.shape[2]]),
    )
}

fn outputs_specs(
    q: &TensorSpec,
    _a: &TensorSpec,
    v: &TensorSpec,
    _z: &TensorSpec,
    _b: &TensorSpec,
    _layout: &Layout,
) -> (TensorSpec, TensorSpec) {
    let [blocks, c] = [q.shape[0], q.shape[1]];
    let spec = |dims: [usize; 3]| TensorSpec::new(Shape::new(dims), q.dtype);
    (spec([blocks, c, c]), spec([blocks, c, v.shape[2]]))
}

impl Hla2Fused for CubeBackend {
    fn hla2_moments(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        s: FloatTensor<Self>,
        b: FloatTensor<Self>,
        layout: Layout,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        let [q, k, v, s, b] = [q, k, v, s, b].map(into_contiguous);
        let ([blocks, c, d], dv) = (q.shape().dims::<3>(), v.shape().dims::<3>()[2]);
        let (w, a, dz) = (
            empty(&q, [blocks, c, c]),
            empty(&q, [blocks, c, d]),
            empty(&q, [blocks, d, dv]),
        );
        let (count, dim) = grid(&q, blocks, c);
        let [gb, gh] = layout.gates;
        moments_kernel::launch(
            &q.client.clone(),
            count,
            dim,
            q.into_tensor_arg(),
            k.into_tensor_arg(),
            v.into_tensor_arg(),
            s.into_tensor_arg(),
            b.into_tensor_arg(),
            w.clone().into_tensor_arg(),
            a.clone().into_tensor_arg(),
            dz.clone().into_tensor_arg(),
            layout.chunks,
            layout.heads,
            gb,
            gh,
            c,
            d,
            dv,
            layout.decayed,
        );
        (w, a, dz)
    }

    fn hla2_outputs(
        q: FloatTensor<Self>,
        a: FloatTensor<Self>,
        v: FloatTensor<Self>,
        z: FloatTensor<Self>,
        b: FloatTensor<Self>,
        layout: Layout,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let [q, a, v, z, b] = [q, a, v, z, b].map(into_contiguous);
        let ([blocks, c, d], dv) = (q.shape().dims::<3>(), v.shape().dims::<3>()[2]);
        let (p, o) = (empty(&q, [blocks, c, c]), empty(&q, [blocks, c, dv]));
        let (count, dim) = grid(&q, blocks, c);
        let [gb, gh] = layout.gates;
        outputs_kernel::launch(
            &q.client.clone(),
            count,
            dim,
            q.into_tensor_arg(),
            a.into_tensor_arg(),
            v.into_tensor_arg(),
            z.into_tensor_arg(),
            b.into_tensor_arg(),
            p.clone().into_tensor_arg(),
            o.clone().into_tensor_arg(),
            layout.chunks,
            layout.heads,
            gb,
            gh,
            c,
            d,
            dv,
            layout.decayed,
        );
        (p, o)
    }
}

/// A cube of `c` units per block.
fn grid(like: &CubeTensor, blocks: usize, c: usize) -> (CubeCount, CubeDim) {
    (cubes(like, blocks), CubeDim::new_1d(c as u32))
}

/// FLOPs of one chunk's work in the kernel of fusion's custom op `id` (a chunk of `c`
/// tokens, widths `d` and `dv`): the multiply-adds of its products, the masked ones
/// (`W`, `W K`, `P`, `P V`) over `σ ≤ τ` only; `None` for another op.
pub(crate) fn chunk_flops(id: &str, [c, d, dv]: [usize; 3]) -> Option<f64> {
    let (c, d, dv) = (c as f64, d as f64, dv as f64);
    let causal = c * (c + 1.0);
    if id.contains("hla2_moments") {
        Some(2.0 * c * d * d + 2.0 * causal * d + 2.0 * c * d * dv)
    } else if id.contains("hla2_outputs") {
        Some(2.0 * c * d * dv + causal * (d + dv))
    } else {
        None
    }
}

/// The chunks' tensors `[b, h, chunks, rows, cols]` as the kernels' `[blocks, rows, cols]`.
fn blocks(x: &Tensor<5>) -> Tensor<3> {
    let [b, h, n, rows, cols] = x.dims();
    x.clone().reshape([b * h * n, rows, cols])
}

/// The call's layout and gates `b [gb · gh, chunks · c]` (without decay any tensor: the
/// kernels do not read it), if the kernels take it: f32 on a CubeCL device that no
/// gradient tracks, with the GPU kernels or the nodes on, every tensor with the query's
/// batch and heads (not keys shared by the heads), a chunk no longer than a cube, and
/// the shared tiles within the device's shared memory.
fn layout(tensors: [&Tensor<5>; 4], decay: &Decay<5>) -> Option<(Layout, Tensor<2>)> {
    use crate::backend::takes_gpu_step;
    let [q, _, v, _] = tensors;
    let [b, h, chunks, c, d] = q.dims();
    let dv = v.dims()[4];
    let device = q.device();
    let shared = shared_bytes(&device)?;
    let floats = c * d + shared_buffer(c, d, dv);
    let applies = tensors
        .iter()
        .all(|x| takes_gpu_step(*x) && x.dims()[..2] == [b, h])
        && 4 * floats <= shared
        && c <= crate::backend::gpu::max_units(&device)?
        && crate::backend::gpu::fits(&device, tensors.map(|x| x.shape().num_elements()));
    if !applies {
        return None;
    }
    let gates = decay.log_decay();
    let [gb, gh] = gates
        .as_ref()
        .map_or([1, 1], |g| [g.dims()[0], g.dims()[1]]);
    let b = gates.map_or_else(
        || q.clone().reshape([b * h * chunks, c * d]),
        |g| g.reshape([gb * gh, chunks * c]),
    );
    let layout = Layout {
        heads: h,
        chunks,
        gates: [gb, gh],
        decayed: decay.log_decay().is_some(),
    };
    Some((layout, b))
}

/// `(W, A, ΔZ)` of every chunk (`[b, h, chunks, c, c]`, `[.., c, d]`, `[.., d, dv]`) from
/// `q`, `k`, `v` and the key moment at every chunk's start, where the kernel takes them.
pub(crate) fn moments(
    q: &Tensor<5>,
    k: &Tensor<5>,
    v: &Tensor<5>,
    s_start: &Tensor<5>,
    decay: &Decay<5>,
) -> Option<(Tensor<5>, Tensor<5>, Tensor<5>)> {
    use burn::backend::Dispatch;
    let (layout, b) = layout([q, k, v, s_start], decay)?;
    let [bs, h, n, c, d] = q.dims();
    let dv = v.dims()[4];
    let (w, a, dz) = <Dispatch as Hla2Fused>::hla2_moments(
        blocks(q).into_dispatch(),
        blocks(k).into_dispatch(),
        blocks(v).into_dispatch(),
        blocks(s_start).into_dispatch(),
        b.into_dispatch(),
        layout,
    );
    let chunked = |x: FloatTensor<Dispatch>, rows, cols| {
        Tensor::<3>::from_dispatch(x).reshape([bs, h, n, rows, cols])
    };
    Some((chunked(w, c, c), chunked(a, c, d), chunked(dz, d, dv)))
}

/// `(P, O)` of every chunk (`[b, h, chunks, c, c]`, `[.., c, dv]`) from `q`, `A`, `v`
/// and `Z` at every chunk's start, where the kernel takes them.
pub(crate) fn outputs(
    q: &Tensor<5>,
    a: &Tensor<5>,
    v: &Tensor<5>,
    z_start: &Tensor<5>,
    decay: &Decay<5>,
) -> Option<(Tensor<5>, Tensor<5>)> {
    use burn::backend::Dispatch;
    let (layout, b) = layout([q, a, v, z_start], decay)?;
    let [bs, h, n, c, _] = q.dims();
    let dv = v.dims()[4];
    let (p, o) = <Dispatch as Hla2Fused>::hla2_outputs(
        blocks(q).into_dispatch(),
        blocks(a).into_dispatch(),
        blocks(v).into_dispatch(),
        blocks(z_start).into_dispatch(),
        b.into_dispatch(),
        layout,
    );
    let chunked = |x: FloatTensor<Dispatch>, rows, cols| {
        Tensor::<3>::from_dispatch(x).reshape([bs, h, n, rows, cols])
    };
    Some((chunked(p, c, c), chunked(o, c, dv)))
}
