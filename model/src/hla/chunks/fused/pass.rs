//! A state's pass over the chunks with its updates made inside, as one CubeCL kernel: what
//! a chunk update and the scan over the chunks ([`crate::hla::chunks::gpu`]) do in two
//! launches, with every chunk's update a tensor of states written and read between them.
//! Per chunk `m`, from the chunk's `K [c, rows]` and `U [c, cols]`,
//!
//! ```text
//! X_{m+1} = ρ_m^p X_m + Kᵀ diag(f^p) U
//! ```
//!
//! with `f = e` (decay to the chunk's end: a state's update in the forward pass) or `f = a`
//! (decay from its start: the gradient a state's read sends back, `Qᵀ diag(a^p) ∂Y`, walked
//! from the last chunk). One cube per tile of a sequence's state values, one unit per
//! block of 4 × 4 of them (4 rows, 4 columns a quarter of the state apart): the cube
//! copies each chunk's `K` and `U` into shared memory (`c·(rows + cols)` floats) and
//! scales `K`'s rows by `f^p`; each unit sums its block's `c` outer products of four keys
//! and four values and carries its block from chunk to chunk in registers (each value
//! read from shared memory serves four multiply-adds; a warp's reads of a row of `U` fall
//! in distinct banks).

use burn::backend::TensorMetadata;
use burn::backend::fusion::custom::TensorSpec;
use burn::backend::tensor::FloatTensor;
use burn::backend::{Backend, backend_extension};
use burn::prelude::*;
use burn::tensor::Shape;
use burn_cubecl::CubeBackend;
use burn_cubecl::cubecl::prelude::CubeDim;

pub(crate) use super::pass_kernel::Walk;
use super::pass_kernel::{TILE, pass_kernel};
use super::pass_tiles::{pass_tiles_kernel, tile_rows, tiles_fit, tiles_shared};
use super::{Layout, blocks, layout, sizes};
use crate::backend::gpu::mma::{Mma, mma, planned, planned_mma, tile_units};
use crate::backend::gpu::{
    contiguous, cubes, empty, guard, max_units, multiprocessors, shared_bytes, units,
};
use crate::hla::decay::Decay;

/// What one call computes: the chunks' layout, the decay's power `p`, how it walks and
/// the shape of its end state `[b, h, rows, cols]`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Pass {
    pub(crate) layout: Layout,
    pub(crate) power: u32,
    pub(crate) walk: Walk,
    pub(crate) end: [usize; 4],
}

/// The kernel on a CubeCL device (every GPU device runs it through fusion as one custom
/// op). Shapes: `start` `[b, h, rows, cols]` (any strides; any tensor from zeros), `k`
/// `[blocks, c, rows]`, `u` `[blocks, c, cols]` with blocks = batch × heads × chunks, the
/// cumulative log gates `b [gb · gh, chunks · c]`.
#[backend_extension(Cube, Fusion)]
pub(crate) trait ChunkPass: Backend {
    /// `(states [seqs, chunks, rows · cols], end [b, h, rows, cols])`: the state every
    /// chunk starts from and after the last (back: after every chunk, and before the
    /// first).
    #[fusion(meta = pass_specs)]
    fn chunk_pass(
        start: FloatTensor<Self>,
        k: FloatTensor<Self>,
        u: FloatTensor<Self>,
        b: FloatTensor<Self>,
        pass: Pass,
    ) -> (FloatTensor<Self>, FloatTensor<Self>);
}

fn pass_specs(
    _start: &TensorSpec,
    k: &TensorSpec,
    u: &TensorSpec,
    _b: &TensorSpec,
    pass: &Pass,
) -> (TensorSpec, TensorSpec) {
    let [b, h, rows, cols] = pass.end;
    let states = [b * h, pass.layout.chunks, rows * cols];
    debug_assert_eq!([k.shape[2], u.shape[2]], [rows, cols]);
    (
        TensorSpec::new(Shape::new(states), k.dtype),
        TensorSpec::new(Shape::new(pass.end), k.dtype),
    )
}

impl ChunkPass for CubeBackend {
    fn chunk_pass(
        start: FloatTensor<Self>,
        k: FloatTensor<Self>,
        u: FloatTensor<Self>,
        b: FloatTensor<Self>,
        pass: Pass,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let [k, u, b] = [k, u, b].map(contiguous);
        let start = guard::input(start);
        let [_, c, rows] = k.shape().dims::<3>();
        let cols = u.shape().dims::<3>()[2];
        let [bs, h, ..] = pass.end;
        let chunks = pass.layout.chunks;
        let (states, end) = (
            empty(&k, [bs * h, chunks, rows * cols]),
            empty(&k, pass.end),
        );
        let shared = k.client.properties().hardware.max_shared_memory_size;
        let units = units(&k) as usize;
        let grid = Grid::plan(mma(&k), shared, units, c, [rows, cols]);
        let parts = grid.cubes([rows, cols]);
        // Both kernels take the same arguments but their cube's units and the tiles'.
        macro_rules! launch {
            ($kernel:ident, $units:expr $(, $tiles:expr)*) => {
                $kernel::launch(
                    &k.client.clone(),
                    cubes(&k, bs * h * parts),
                    CubeDim::new_1d($units as u32),
                    start.into_tensor_arg(),
                    k.into_tensor_arg(),
                    u.into_tensor_arg(),
                    b.into_tensor_arg(),
                    states.clone().into_tensor_arg(),
                    end.clone().into_tensor_arg(),
                    pass.layout.gate_arg(),
                    pass.power as f32,
                    parts,
                    c,
                    rows,
                    cols,
                    pass.walk,
                    $($tiles),*
                )
            };
        }
        match grid {
            Grid::Tiles { mma, part } => {
                launch!(pass_tiles_kernel, tile_units(&mma, units), part, mma)
            }
            Grid::Blocks { dim } => launch!(pass_kernel, dim),
        }
        (states, end)
    }
}

/// How a pass's cubes cover each sequence's `[rows, cols]` state.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Grid {
    /// On the tensor cores ([`super::pass_tiles`]): `part` rows of it a cube, in `mma`'s
    /// tiles.
    Tiles { mma: Mma, part: usize },
    /// In registers ([`pass_kernel`]): a unit per `TILE × TILE` block, `dim` units a cube.
    Blocks { dim: usize },
}

impl Grid {
    /// The grid of a pass over chunks of `c` tokens: on `mma`'s tiles where the chunk and
    /// state tile into its fragments and a cube's tiles fit in `shared` bytes, else in
    /// register blocks, cubes of at most `units`.
    fn plan(mma: Option<Mma>, shared: usize, units: usize, c: usize, state: [usize; 2]) -> Self {
        let [rows, cols] = state;
        let tiles = mma
            .filter(|mma| tiles_fit(mma, c, rows, cols))
            .map(|mma| (mma, tile_rows(&mma, rows, cols)))
            .filter(|&(_, part)| 4 * tiles_shared(c, part, cols) <= shared);
        match tiles {
            Some((mma, part)) => Grid::Tiles { mma, part },
            None => Grid::Blocks {
                dim: cube_tiles(owned(state), units).0,
            },
        }
    }

    /// The cubes of one sequence's state.
    fn cubes(&self, [rows, cols]: [usize; 2]) -> usize {
        match *self {
            Grid::Tiles { part, .. } => rows.div_ceil(part),
            Grid::Blocks { dim } => owned([rows, cols]).div_ceil(dim),
        }
    }
}

/// The pass of a state `X` from `start` (zeros when `None`) over the chunks' `K [b, h,
/// chunks, c, rows]` and `U [.., c, cols]` forward with `f = e` and the decay's power
/// `power`, where the kernel takes them (as the fused kernels, [`layout`], whose shared
/// tiles hold the pass's `c·(rows + cols)` floats): `(states [b, h, chunks, rows, cols],
/// end [b, h, rows, cols])`.
pub(crate) fn pass(
    start: Option<&Tensor<4>>,
    ku: [&Tensor<5>; 2],
    decay: (&Decay<5>, u32),
) -> Option<(Tensor<5>, Tensor<4>)> {
    walk(start, ku, decay, false)
}

/// [`pass`] walking back from the last chunk with `f = a`, as a state's gradient `∂X`
/// goes: from `last`, `(∂X after every chunk, ∂X before the first)`.
pub(crate) fn pass_back(
    last: Option<&Tensor<4>>,
    ku: [&Tensor<5>; 2],
    decay: (&Decay<5>, u32),
) -> Option<(Tensor<5>, Tensor<4>)> {
    walk(last, ku, decay, true)
}

/// [`pass`] or [`pass_back`].
fn walk(
    start: Option<&Tensor<4>>,
    [k, u]: [&Tensor<5>; 2],
    (decay, power): (&Decay<5>, u32),
    back: bool,
) -> Option<(Tensor<5>, Tensor<4>)> {
    let [bs, h, n, c, rows] = k.dims();
    let cols = u.dims()[4];
    let device = k.device();
    let applies = start.is_none_or(crate::backend::takes_gpu_step)
        && crate::backend::gpu::fits(&device, [bs * h * n * rows * cols])
        && fills(&device, bs * h, c, [rows, cols]);
    let gates = layout(&[k, u], decay).filter(|_| applies)?;
    Some(gpu_pass(start, [k, u], gates, (power, back)))
}

/// [`walk`]'s kernel call with the chunks' layout and gates `b` ([`super::gates_layout`]),
/// wherever the tensors are on a CubeCL device.
fn gpu_pass(
    start: Option<&Tensor<4>>,
    [k, u]: [&Tensor<5>; 2],
    (layout, b): (Layout, Tensor<2>),
    (power, back): (u32, bool),
) -> (Tensor<5>, Tensor<4>) {
    use burn::backend::Dispatch;
    let [bs, h, n, _, rows] = k.dims();
    let cols = u.dims()[4];
    let walk = Walk {
        decayed: layout.decayed,
        back,
        zero_start: start.is_none(),
    };
    let pass = Pass {
        layout,
        power,
        walk,
        end: [bs, h, rows, cols],
    };
    // From zeros the kernel reads no start: a tensor with no values stands in.
    let start = start.map_or_else(
        || Tensor::<1>::empty([1], &k.device()).into_dispatch(),
        |x| x.clone().into_dispatch(),
    );
    let (states, end) = <Dispatch as ChunkPass>::chunk_pass(
        start,
        blocks(k).into_dispatch(),
        blocks(u).into_dispatch(),
        b.into_dispatch(),
        pass,
    );
    (
        Tensor::<3>::from_dispatch(states).reshape([bs, h, n, rows, cols]),
        Tensor::from_dispatch(end),
    )
}

/// Whether the pass of `seqs` sequences' `[rows, cols]` states over chunks of `c` has a
/// cube for every multiprocessor of `device` ([`multiprocessors`]; a CPU device has none
/// to fill), its grid planned as the device's launch plans it (a GPU the cost model plans
/// for: as that GPU's, [`planned_mma`]). Its cubes walk the chunks one after another,
/// each chunk's product on one multiprocessor: with fewer, most of a GPU idles through
/// the pass, and the composed update (one matmul over every chunk at once) and scan (a
/// unit per state value) run instead, at the cost of the updates' tensor written and read
/// back and one more launch.
fn fills(device: &Device, seqs: usize, c: usize, state: [usize; 2]) -> bool {
    let units = max_units(device).unwrap_or(1);
    let shared = shared_bytes(device).unwrap_or(0);
    let grid = Grid::plan(planned_mma(device), shared, units, c, state);
    multiprocessors(device).is_none_or(|count| seqs * grid.cubes(state) >= count)
}

/// The `TILE × TILE` blocks of a `[rows, cols]` state.
fn owned([rows, cols]: [usize; 2]) -> usize {
    rows.div_ceil(TILE) * cols.div_ceil(TILE)
}

/// The units of a cube and the cubes of a sequence for a state of `owned` blocks, with
/// cubes of at most `units`: one unit per `TILE × TILE` block, in cubes of whole warps
/// where a sequence has fewer blocks than a cube holds.
fn cube_tiles(owned: usize, units: usize) -> (usize, usize) {
    let dim = units.min(owned.next_multiple_of(32));
    (dim, owned.div_ceil(dim))
}

/// The cubes of the kernel and whether its products run on the tensor cores, if fusion's
/// custom op `id` is its, as an H100 or H200 plans it ([`planned`] tile products, `shared`
/// bytes and at most `units` units a cube), from its inputs' shapes (`start`, `k [blocks,
/// c, rows]`, ...) and its outputs' (the states, `end [b, h, rows, cols]`).
pub(crate) fn planned_grid(
    id: &str,
    (inputs, outputs): (&[Vec<usize>], &[Vec<usize>]),
    shared: usize,
    units: usize,
) -> Option<(usize, bool)> {
    if !id.contains("chunk_pass") {
        return None;
    }
    let [b, h, rows, cols] = <[usize; 4]>::try_from(outputs.get(1)?.as_slice()).ok()?;
    let c = *inputs.get(1)?.get(1)?;
    let grid = Grid::plan(planned(), shared, units, c, [rows, cols]);
    let tensor = matches!(grid, Grid::Tiles { .. });
    Some((b * h * grid.cubes([rows, cols]), tensor))
}

/// FLOPs of the kernel if fusion's custom op `id` is its, from its inputs' shapes (`start`,
/// `k [blocks, c, rows]`, `u [blocks, c, cols]`): the multiply-adds of every chunk's
/// update and the decay of the state.
pub(crate) fn flops(id: &str, inputs: &[Vec<usize>]) -> Option<f64> {
    if !id.contains("chunk_pass") {
        return None;
    }
    let [blocks, c, rows] = sizes(&inputs[1]);
    let cols = sizes(&inputs[2])[2];
    Some(blocks * rows * cols * (2.0 * c + 2.0))
}

#[cfg(all(test, feature = "wgpu"))]
mod tests;
