//! The scan over the chunks ([`super::Chunks::scan`], [`super::Chunks::scan_back`]) as one
//! CubeCL kernel: one unit per state value walks the chunks in order (or back from the
//! last), reading every chunk's update once and writing every state once. The composed
//! scan builds the decay mask and multiplies by it: `2 (n + 1)²` FLOPs per state value
//! over `n` chunks, a dozen launches, and a copy of the updates with the initial state in
//! front. This one runs where no gradient is tracked (the node's passes, evaluation), so
//! it has no backward pass of its own: the node's backward pass runs it back.

use burn::backend::TensorMetadata;
use burn::backend::fusion::custom::TensorSpec;
use burn::backend::tensor::FloatTensor;
use burn::backend::{Backend, backend_extension};
use burn::tensor::Shape;
use burn_cubecl::CubeBackend;
use burn_cubecl::cubecl;
use cubecl::prelude::*;

use crate::backend::gpu::{contiguous, cubes, empty, guard, units};
use crate::hla::gpu::blocks::{gate_row, state_at};

/// How a scan runs: its sequences' heads, the gates' `[gb, gh]`, whether it decays, the
/// decay's power `p`, which way it walks, whether it starts from zeros (the start state
/// is then not read, and any tensor stands in for it) and the shape of its end state.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Scan {
    pub(crate) heads: usize,
    pub(crate) gates: [usize; 2],
    pub(crate) decayed: bool,
    pub(crate) power: u32,
    pub(crate) reverse: bool,
    pub(crate) zero_start: bool,
    pub(crate) end: [usize; 4],
}

/// The scan kernel on a CubeCL device (every GPU device runs it through fusion, as one
/// custom op).
#[backend_extension(Cube, Fusion)]
pub(crate) trait ScanKernels: Backend {
    /// `X_{m+1} = ρ_m^p X_m + Δ_m` from `start [b, h, rows, cols]` (any strides: a part of
    /// a packed state is read where it lies) over `deltas [seqs, chunks, rows · cols]`,
    /// with `log ρ_m` the last of chunk `m`'s cumulative log gates `b [gb · gh, chunks ·
    /// c]` (read only when `scan.decayed`; seqs are batch × heads): the chunks' decay needs
    /// no tensor of its own. Forward: the state every chunk starts from and the state after
    /// the last one. With `scan.reverse` the chunks run from the last: the state after
    /// every chunk and the state before the first. Returns `(states [seqs, chunks, rows ·
    /// cols], end [b, h, rows, cols])`. With `scan.zero_start` the scan starts from zeros
    /// (a zero initial state, or no gradient of the final one) without reading `start`.
    #[fusion(meta = scan_specs)]
    fn chunk_scan(
        start: FloatTensor<Self>,
        deltas: FloatTensor<Self>,
        b: FloatTensor<Self>,
        scan: Scan,
    ) -> (FloatTensor<Self>, FloatTensor<Self>);
}

fn scan_specs(
    _start: &TensorSpec,
    deltas: &TensorSpec,
    _b: &TensorSpec,
    scan: &Scan,
) -> (TensorSpec, TensorSpec) {
    let end = TensorSpec::new(Shape::new(scan.end), deltas.dtype);
    (deltas.clone(), end)
}

impl ScanKernels for CubeBackend {
    fn chunk_scan(
        start: FloatTensor<Self>,
        deltas: FloatTensor<Self>,
        b: FloatTensor<Self>,
        scan: Scan,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let [deltas, b] = [deltas, b].map(contiguous);
        let start = guard::input(start);
        let [seqs, chunks, cols] = deltas.shape().dims::<3>();
        let c = b.shape().dims::<2>()[1] / chunks;
        let (states, end) = (
            empty(&deltas, [seqs, chunks, cols]),
            empty(&deltas, scan.end),
        );
        let dim = CubeDim::new_1d(units(&deltas));
        let count = cubes(&deltas, (seqs * cols).div_ceil(dim.num_elems() as usize));
        let [gb, gh] = scan.gates;
        scan_kernel::launch(
            &deltas.client.clone(),
            count,
            dim,
            start.into_tensor_arg(),
            deltas.into_tensor_arg(),
            b.into_tensor_arg(),
            states.clone().into_tensor_arg(),
            end.clone().into_tensor_arg(),
            chunks,
            c,
            cols,
            scan.heads,
            gb,
            gh,
            scan.power as f32,
            scan.decayed,
            scan.reverse,
            scan.zero_start,
        );
        (states, end)
    }
}

/// [`ScanKernels::chunk_scan`], one unit per `(sequence, column)`: consecutive units
/// read consecutive columns, so every chunk's read and write is coalesced.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn scan_kernel(
    start: &Tensor<f32>,
    deltas: &Tensor<f32>,
    b: &Tensor<f32>,
    states: &mut Tensor<f32>,
    end: &mut Tensor<f32>,
    chunks: usize,
    c: usize,
    cols: usize,
    heads: usize,
    gb: usize,
    gh: usize,
    power: f32,
    #[comptime] decayed: bool,
    #[comptime] reverse: bool,
    #[comptime] zero_start: bool,
) {
    let at = ABSOLUTE_POS;
    // A grid spread over its axes may hold a few more units than values.
    if at >= end.len() {
        terminate!();
    }
    let seq = at / cols;
    let col = at % cols;
    let gate = gate_row(seq, heads, gb, gh) * chunks;
    let mut x = 0.0f32;
    if !zero_start {
        let part = start.shape(3);
        x = start[state_at(start, seq, heads, col / part, col % part)];
    }
    for i in 0..chunks {
        let mut m = i;
        if reverse {
            m = chunks - 1 - i;
        }
        let idx = (seq * chunks + m) * cols + col;
        states[idx] = x;
        let mut rho = 1.0f32;
        if decayed {
            rho = (power * b[(gate + m) * c + c - 1]).exp();
        }
        x = rho * x + deltas[idx];
    }
    end[at] = x;
}
