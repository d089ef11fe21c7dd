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
mod tests {
    use burn::tensor::{DeviceKind, Distribution};

    use super::super::gates_layout;
    use super::*;
    use crate::agreement::relative_rms_error;
    use crate::hla::chunks::Chunks;

    /// The cost model's grid of a pass is its launch's: on an H100's tensor cores whole
    /// fragment rows of the state a cube (a 128 × 128 state in four cubes, as in
    /// registers; the last cube of an 80-row state holds 16 rows) where the chunk and
    /// state tile into fragments and the shared memory holds a cube's tiles; else a cube
    /// of whole warps per sequence for a small state, cubes of at most `units` for a large
    /// one.
    #[test]
    fn a_pass_plans_a_cube_per_tile_of_a_sequences_state() {
        use crate::backend::gpu::mma::CUDA_TF32;
        let h100 = 227 * 1024;
        let tiles = |c: usize, state| Grid::plan(Some(CUDA_TF32), h100, 256, c, state);
        let part = |part| Grid::Tiles {
            mma: CUDA_TF32,
            part,
        };
        assert_eq!(tiles(64, [128, 128]), part(32));
        assert_eq!(part(32).cubes([128, 128]), 4);
        assert_eq!(
            Grid::plan(None, h100, 256, 64, [128, 128]).cubes([128, 128]),
            4
        );
        assert_eq!(tiles(64, [64, 64]), part(64));
        assert_eq!(tiles(64, [80, 128]).cubes([80, 128]), 3);
        let registers = Grid::Blocks { dim: 256 };
        assert_eq!(tiles(64, [72, 64]), registers);
        assert_eq!(tiles(12, [64, 64]), registers);
        let lavapipe = 32 * 1024;
        assert_eq!(
            Grid::plan(Some(CUDA_TF32), lavapipe, 256, 64, [128, 128]),
            registers
        );
        assert_eq!(cube_tiles(4, 256), (32, 1));
        assert_eq!(cube_tiles(1024, 256), (256, 4));
        let inputs = |rows, cols| vec![vec![1], vec![24, 8, rows], vec![24, 8, cols], vec![1]];
        let outputs = |rows, cols| vec![vec![8, 3, rows * cols], vec![2, 4, rows, cols]];
        let planned = |id, [rows, cols]: [usize; 2]| {
            let shapes = (&inputs(rows, cols)[..], &outputs(rows, cols)[..]);
            planned_grid(id, shapes, h100, 256).map(|(cubes, _)| cubes)
        };
        assert_eq!(planned("chunk_pass", [8, 8]), Some(8));
        assert_eq!(planned("chunk_pass", [128, 129]), Some(8 * 5));
        assert_eq!(planned("chunk_output", [8, 8]), None);
    }

    /// The register-block kernel against the composed update and scan
    /// ([`pass_against_composed`]) over a ragged 70 × 69 state, several cubes a sequence.
    #[test]
    fn the_pass_is_the_update_and_the_scan() {
        pass_against_composed(8, [70, 69]);
    }

    /// The tile kernel (emulated: lavapipe has no tensor cores) as
    /// [`the_pass_is_the_update_and_the_scan`]: chunks of two fragment lengths, an 80 × 128
    /// state in cubes of 32 rows, the last cube holding 16.
    #[test]
    fn the_tile_pass_is_the_update_and_the_scan() {
        use crate::backend::{TensorCores, set_tensor_cores};
        set_tensor_cores(TensorCores::Emulated);
        pass_against_composed(16, [80, 128]);
        set_tensor_cores(TensorCores::default());
    }

    /// The kernel against the composed update and scan (forward: `Kᵀ diag(e^p) U` added
    /// after the decay; back: `Kᵀ diag(a^p) U` from the last chunk), over a ragged last
    /// chunk, chunks of `c` and `[rows, cols]` states: without decay, with gates per
    /// sequence and head and with a per-head decay (p = 2), from a start state given as a
    /// transposed view and from zeros.
    fn pass_against_composed(c: usize, [rows, cols]: [usize; 2]) {
        let device = Device::wgpu(DeviceKind::DefaultDevice);
        let _bounds = crate::backend::gpu::guard::Scope::new();
        let (bs, h, time) = (2, 3, 37);
        let chunks = Chunks::new(time, c);
        let normal = Distribution::Normal(0.0, 1.0);
        let uniform = Distribution::Uniform(-0.3, 0.0);
        let k = chunks.split(Tensor::<4>::random([bs, h, time, rows], normal, &device));
        let u = chunks.split(Tensor::<4>::random([bs, h, time, cols], normal, &device));
        let per_token = Tensor::<3>::random([bs, h, time], uniform, &device);
        let per_head = Tensor::<3>::random([1, h, 1], uniform, &device).expand([1, h, time]);
        for log_g in [None, Some(per_token), Some(per_head)] {
            let decay = chunks.decay(log_g.as_ref());
            for (back, zero) in [(false, false), (true, false), (false, true), (true, true)] {
                let start = Tensor::<4>::random([bs, h, cols, rows], normal, &device);
                let start = (!zero).then(|| start.swap_dims(2, 3));
                let gates = gates_layout(&k, &decay);
                let (states, end) = gpu_pass(start.as_ref(), [&k, &u], gates, (2, back));
                let factor = |x: Tensor<5>| match back {
                    false => decay.until_end(x, 2.0),
                    true => decay.since_start(x, 2.0),
                };
                let updates = k.clone().transpose().matmul(factor(u.clone()));
                let (want_states, want_end) = match back {
                    false => chunks.scan(start, updates, &decay, 2),
                    true => chunks.scan_back(start, updates, &decay, 2),
                };
                let errors = [
                    relative_rms_error(states, want_states),
                    relative_rms_error(end, want_end),
                ];
                let gates = log_g.as_ref().map(|g| g.dims());
                assert!(
                    errors.iter().all(|e| *e < 1e-5),
                    "gates {gates:?}, back {back}, zero start {zero}: relative RMS {errors:?}"
                );
            }
        }
    }
}
