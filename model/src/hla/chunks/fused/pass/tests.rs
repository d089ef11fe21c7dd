use burn::tensor::Distribution;

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
    let (device, _bounds) = crate::testing::guarded_wgpu();
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
