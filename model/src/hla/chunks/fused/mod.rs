//! The step every order's chunk equations end with, as one CubeCL kernel in shared memory:
//! per chunk, with a state `X` at its start, keys-like rows `R` and values `V`,
//!
//! ```text
//! M = D^p ⊙ (Q Rᵀ),   Y = diag(a^p) Q X + M V
//! ```
//!
//! (first order: `R = K`, `X = S`, `Y = O`; hla2: `R = A`, `X = Z`, `p = 2`; AHLA twice,
//! for `B` and `O`; third order three times, for `B`, for `A` (`V = K`, `X = Sᵀ`) and for
//! `O` with `p = 3`). The node's forward pass on a GPU device runs it in place of the
//! composed matmuls, masks and scales wherever no gradient is tracked. One cube per chunk
//! of every sequence and head, one unit per token: the cube copies `X`, then `R` and `V`,
//! into shared memory once; each unit computes its token's rows from there, its query and
//! accumulators in registers, and writes `M` (when asked) and `Y` once. The products run
//! on the CUDA cores; where a device has tensor cores, the step runs as their tiles
//! instead ([`tiles`]). Also the layout and the cube functions the orders' own fused
//! kernels share ([`kernel`]).

pub(crate) mod kernel;
pub(crate) mod pass;
pub(crate) mod pass_kernel;
pub(crate) mod pass_tiles;
pub(crate) mod tiles;

use burn::backend::TensorMetadata;
use burn::backend::fusion::custom::TensorSpec;
use burn::backend::tensor::FloatTensor;
use burn::backend::{Backend, backend_extension};
use burn::prelude::*;
use burn::tensor::Shape;
use burn_cubecl::CubeBackend;
use burn_cubecl::cubecl::prelude::{CubeCount, CubeDim};
use burn_cubecl::tensor::CubeTensor;

use crate::backend::gpu::mma::{Mma, planned_within, tile_units, tiles_within};
use crate::backend::gpu::{
    contiguous, cubes, empty, rows_per_unit, shared_bytes, unit_budget, units,
};
use crate::hla::decay::Decay;
use kernel::{GatesLaunch, output_kernel, shared_buffer};

/// How a call's chunks are laid out: the heads, the chunks of a sequence, the gates'
/// `[gb, gh]` and whether they decay (without, the gates are not read).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Layout {
    pub(crate) heads: usize,
    pub(crate) chunks: usize,
    pub(crate) gates: [usize; 2],
    pub(crate) decayed: bool,
}

impl Layout {
    /// The kernels' argument that finds each chunk's gates.
    pub(crate) fn gate_arg(&self) -> GatesLaunch {
        let [gb, gh] = self.gates;
        GatesLaunch::new(self.chunks, self.heads, gb, gh)
    }
}

/// What one output call computes: the decay's power `p`, whether `M` is written, and
/// whether the kernel reads `X` from its transpose (the tensor given is `Xᵀ`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Output {
    pub(crate) layout: Layout,
    pub(crate) power: u32,
    pub(crate) scores: bool,
    pub(crate) transposed: bool,
}

/// The kernel on a CubeCL device (every GPU device runs it through fusion as one custom
/// op). Shapes: `q`, `r` `[blocks, c, d]`, `v` `[blocks, c, dv]`, `x` `[blocks, d, dv]`
/// (`[blocks, dv, d]`, `X`'s transpose, when `output.transposed`), with blocks = batch ×
/// heads × chunks; the cumulative log gates `b [gb · gh, chunks · c]`.
#[backend_extension(Cube, Fusion)]
pub(crate) trait ChunkOutput: Backend {
    /// `(M [blocks, c, c], Y [blocks, c, dv])`; `M` is `[1]` and unwritten unless
    /// `output.scores`.
    #[fusion(meta = output_specs)]
    fn chunk_output(
        q: FloatTensor<Self>,
        r: FloatTensor<Self>,
        v: FloatTensor<Self>,
        x: FloatTensor<Self>,
        b: FloatTensor<Self>,
        output: Output,
    ) -> (FloatTensor<Self>, FloatTensor<Self>);
}

fn output_specs(
    q: &TensorSpec,
    _r: &TensorSpec,
    v: &TensorSpec,
    _x: &TensorSpec,
    _b: &TensorSpec,
    output: &Output,
) -> (TensorSpec, TensorSpec) {
    let [blocks, c] = [q.shape[0], q.shape[1]];
    let m = match output.scores {
        true => Shape::new([blocks, c, c]),
        false => Shape::new([1]),
    };
    (
        TensorSpec::new(m, q.dtype),
        TensorSpec::new(Shape::new([blocks, c, v.shape[2]]), q.dtype),
    )
}

impl ChunkOutput for CubeBackend {
    fn chunk_output(
        q: FloatTensor<Self>,
        r: FloatTensor<Self>,
        v: FloatTensor<Self>,
        x: FloatTensor<Self>,
        b: FloatTensor<Self>,
        output: Output,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let [q, r, v, x, b] = [q, r, v, x, b].map(contiguous);
        let ([blocks, c, d], dv) = (q.shape().dims::<3>(), v.shape().dims::<3>()[2]);
        let m = match output.scores {
            true => empty(&q, [blocks, c, c]),
            false => empty(&q, [1]),
        };
        let y = empty(&q, [blocks, c, dv]);
        if let Some(mma) = tiled(&q, c, d, dv) {
            launch_tiles(q, r, v, x, b, (&m, &y), output, mma);
            return (m, y);
        }
        // A unit's rows: q and the sums of Y.
        let (count, dim, per_unit) = grid(&q, blocks, c, d + dv);
        output_kernel::launch(
            &q.client.clone(),
            count,
            dim,
            q.into_tensor_arg(),
            r.into_tensor_arg(),
            v.into_tensor_arg(),
            x.into_tensor_arg(),
            b.into_tensor_arg(),
            m.clone().into_tensor_arg(),
            y.clone().into_tensor_arg(),
            output.layout.gate_arg(),
            output.power as f32,
            c,
            d,
            dv,
            output.layout.decayed,
            output.scores,
            output.transposed,
            per_unit,
        );
        (m, y)
    }
}

/// The tile products the output step runs on where `q`'s device has tensor cores (or a
/// test emulates them) and a chunk tiles into their fragments within its shared memory.
pub(crate) fn tiled(q: &CubeTensor, c: usize, d: usize, dv: usize) -> Option<Mma> {
    let fit = |mma: &Mma| tiles::tiles_fit(mma, c, d, dv);
    tiles_within(q, fit, tiles::tiles_shared(c, d))
}

/// [`tiles::output_tiles_kernel`] into `(m, y)`, a cube per block.
#[allow(clippy::too_many_arguments)]
pub(crate) fn launch_tiles(
    q: CubeTensor,
    r: CubeTensor,
    v: CubeTensor,
    x: CubeTensor,
    b: CubeTensor,
    (m, y): (&CubeTensor, &CubeTensor),
    output: Output,
    mma: Mma,
) {
    let ([blocks, c, d], dv) = (q.shape().dims::<3>(), v.shape().dims::<3>()[2]);
    let dim = CubeDim::new_1d(tile_units(&mma, units(&q) as usize) as u32);
    tiles::output_tiles_kernel::launch(
        &q.client.clone(),
        cubes(&q, blocks),
        dim,
        q.into_tensor_arg(),
        r.into_tensor_arg(),
        v.into_tensor_arg(),
        x.into_tensor_arg(),
        b.into_tensor_arg(),
        m.clone().into_tensor_arg(),
        y.clone().into_tensor_arg(),
        output.layout.gate_arg(),
        output.power as f32,
        c,
        d,
        dv,
        output.layout.decayed,
        output.scores,
        output.transposed,
        mma,
    );
}

/// A cube per block of `c` tokens, and the tokens a unit owns when each token's rows take
/// `floats` registers ([`rows_per_unit`]): `(count, dim, per_unit)`.
pub(crate) fn grid(
    like: &CubeTensor,
    blocks: usize,
    c: usize,
    floats: usize,
) -> (CubeCount, CubeDim, usize) {
    let per_unit = rows_per_unit(c, floats, unit_budget(like));
    let dim = CubeDim::new_1d((c / per_unit) as u32);
    (cubes(like, blocks), dim, per_unit)
}

/// The chunks' tensors `[b, h, chunks, rows, cols]` as the kernels' `[blocks, rows, cols]`.
pub(crate) fn blocks(x: &Tensor<5>) -> Tensor<3> {
    let [b, h, n, rows, cols] = x.dims();
    x.clone().reshape([b * h * n, rows, cols])
}

/// The kernels' `[blocks, rows, cols]` as `[b, h, chunks, rows, cols]` like `like`'s.
pub(crate) fn chunked(x: FloatTensor<burn::backend::Dispatch>, like: &Tensor<5>) -> Tensor<5> {
    let [b, h, n, ..] = like.dims();
    let [_, rows, cols] = x.shape().dims::<3>();
    Tensor::<3>::from_dispatch(x).reshape([b, h, n, rows, cols])
}

/// The call's layout and gates `b [gb · gh, chunks · c]` (without decay any tensor: the
/// kernels do not read it), if the fused kernels take `tensors` (`q` first, `v`, of
/// width `dv`, second): f32 on a CubeCL device that no gradient tracks, with the GPU
/// kernels or the nodes on, every tensor with the query's batch and heads (not keys
/// shared by the heads), a chunk no longer than a cube, and the shared tiles within the
/// device's shared memory.
pub(crate) fn layout(tensors: &[&Tensor<5>], decay: &Decay<5>) -> Option<(Layout, Tensor<2>)> {
    use crate::backend::takes_gpu_step;
    let (q, v) = (tensors[0], tensors[1]);
    let [b, h, _, c, d] = q.dims();
    let dv = v.dims()[4];
    let device = q.device();
    let floats = c * d + shared_buffer(c, d, dv);
    let applies = tensors
        .iter()
        .all(|x| takes_gpu_step(*x) && x.dims()[..2] == [b, h])
        && 4 * floats <= shared_bytes(&device)?
        && c <= crate::backend::gpu::max_units(&device)?
        && crate::backend::gpu::fits(&device, tensors.iter().map(|x| x.shape().num_elements()));
    applies.then(|| gates_layout(q, decay))
}

/// The layout of chunks laid out like `q [b, h, chunks, c, d]` and the gates `b [gb · gh,
/// chunks · c]` (without decay any tensor: the kernels do not read it).
pub(crate) fn gates_layout(q: &Tensor<5>, decay: &Decay<5>) -> (Layout, Tensor<2>) {
    let [b, h, chunks, c, d] = q.dims();
    let gates = decay.log_decay();
    let [gb, gh] = gates
        .as_ref()
        .map_or([1, 1], |g| [g.dims()[0], g.dims()[1]]);
    let layout = Layout {
        heads: h,
        chunks,
        gates: [gb, gh],
        decayed: gates.is_some(),
    };
    let b = gates.map_or_else(
        || q.clone().reshape([b * h * chunks, c * d]),
        |g| g.reshape([gb * gh, chunks * c]),
    );
    (layout, b)
}

/// `(M, Y)` of every chunk (`[b, h, chunks, c, c]` when `scores`, `[.., c, dv]`) from `q`,
/// `r`, `v` and `x` at every chunk's start, with the decay's power `power`, where the
/// kernel takes them.
pub(crate) fn output(
    [q, r, v, x]: [&Tensor<5>; 4],
    decay: &Decay<5>,
    power: u32,
    (scores, transposed): (bool, bool),
) -> Option<(Option<Tensor<5>>, Tensor<5>)> {
    use burn::backend::Dispatch;
    let (layout, b) = layout(&[q, v, r, x], decay)?;
    let output = Output {
        layout,
        power,
        scores,
        transposed,
    };
    let (m, y) = <Dispatch as ChunkOutput>::chunk_output(
        blocks(q).into_dispatch(),
        blocks(r).into_dispatch(),
        blocks(v).into_dispatch(),
        blocks(x).into_dispatch(),
        b.into_dispatch(),
        output,
    );
    let m = scores.then(|| {
        let [bs, h, n, c, _] = q.dims();
        Tensor::<3>::from_dispatch(m).reshape([bs, h, n, c, c])
    });
    Some((m, chunked(y, v)))
}

/// Whether fusion's custom op `id` is the output step (or hla2's moments) on tensor-core
/// tiles on an H100 or H200 ([`tiles`], with `shared` bytes a cube), from its inputs'
/// shapes: what the cost model plans for those GPUs, the tensor cores not turned off.
pub(crate) fn planned_tiles(id: &str, inputs: &[Vec<usize>], shared: usize) -> bool {
    let moments = id.contains("hla2_moments");
    if !(moments || id.contains("chunk_output")) {
        return false;
    }
    let [_, c, d] = sizes(&inputs[0]).map(|n| n as usize);
    // hla2's moments run as the output step's tiles with `V = K`.
    let dv = if moments { d } else { inputs[2][2] };
    let fit = |mma: &Mma| tiles::tiles_fit(mma, c, d, dv);
    planned_within(fit, tiles::tiles_shared(c, d), shared)
}

/// FLOPs of a kernel of this module (the output's, the pass's) if fusion's custom op `id`
/// is its, from its inputs' shapes (`q [blocks, c, d]`, `r`, `v [blocks, c, dv]`, ...):
/// the multiply-adds of its products, the masked ones over `σ ≤ τ` only.
pub(crate) fn flops(id: &str, inputs: &[Vec<usize>]) -> Option<f64> {
    if !id.contains("chunk_output") {
        return pass::flops(id, inputs);
    }
    let [blocks, c, d] = sizes(&inputs[0]);
    let dv = sizes(&inputs[2])[2];
    Some(blocks * (2.0 * c * d * dv + c * (c + 1.0) * (d + dv)))
}

/// A `[blocks, rows, cols]` shape as floats.
pub(crate) fn sizes(shape: &[usize]) -> [f64; 3] {
    [shape[0], shape[1], shape[2]].map(|n| n as f64)
}
