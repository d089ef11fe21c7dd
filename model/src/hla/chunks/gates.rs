//! The decay inside every chunk ([`super::Chunks::decay`]) as one CubeCL kernel: the
//! cumulative log gates `b_τ = Σ_{s≤τ} log g_s` counted from each chunk's start, in the
//! layout the fused kernels and the scan read (`[gb · gh, chunks · c]`). The composed
//! form pads the gates, reshapes them into chunks (a copy, for gates shared along time)
//! and sums along the chunk: two launches before any kernel that reads them. This one
//! reads the gates in whatever layout they come (the fixed decay's are one value per head
//! broadcast along time) and runs where no gradient is tracked, as the scan does.

use burn::backend::TensorMetadata;
use burn::backend::fusion::custom::TensorSpec;
use burn::backend::tensor::FloatTensor;
use burn::backend::{Backend, backend_extension};
use burn::prelude::*;
use burn::tensor::Shape;
use burn_cubecl::CubeBackend;
use burn_cubecl::cubecl::prelude::CubeDim;

use crate::backend::gpu::{cubes, empty, guard, units};
use kernel::log_decay_kernel;

/// The kernel on a CubeCL device (every GPU device runs it through fusion, as one custom
/// op).
#[backend_extension(Cube, Fusion)]
pub(crate) trait ChunkGates: Backend {
    /// `b [gb · gh, chunks · c]` from `log_g [gb, gh, time]` (any strides) in chunks of
    /// `c` (`chunks = ⌈time / c⌉`; the gates past `time` are 1, their logs 0).
    #[fusion(meta = gates_spec)]
    fn chunk_log_decay(log_g: FloatTensor<Self>, c: usize) -> FloatTensor<Self>;
}

fn gates_spec(log_g: &TensorSpec, c: &usize) -> TensorSpec {
    let [gb, gh, time] = [log_g.shape[0], log_g.shape[1], log_g.shape[2]];
    let shape = Shape::new([gb * gh, time.div_ceil(*c) * c]);
    TensorSpec::new(shape, log_g.dtype)
}

impl ChunkGates for CubeBackend {
    fn chunk_log_decay(log_g: FloatTensor<Self>, c: usize) -> FloatTensor<Self> {
        let log_g = guard::input(log_g);
        let [gb, gh, time] = log_g.shape().dims::<3>();
        let chunks = time.div_ceil(c);
        let b = empty(&log_g, [gb * gh, chunks * c]);
        let dim = CubeDim::new_1d(units(&b));
        let count = cubes(&b, (gb * gh * chunks).div_ceil(dim.num_elems() as usize));
        log_decay_kernel::launch(
            &b.client.clone(),
            count,
            dim,
            log_g.into_tensor_arg(),
            b.clone().into_tensor_arg(),
            time,
            chunks,
            gh,
            c,
        );
        b
    }
}

/// `b [gb, gh, chunks, c, 1]` of `log_g [gb, gh, time]` in chunks of `c` by the kernel,
/// where it applies: f32 on a CubeCL device that no gradient tracks, with the GPU kernels
/// or the nodes on; `None` elsewhere (the composed steps run).
pub(crate) fn cumulative(log_g: &Tensor<3>, c: usize) -> Option<Tensor<5>> {
    crate::backend::takes_gpu_step(log_g).then(|| gpu_cumulative(log_g, c))
}

/// [`cumulative`]'s kernel call, wherever the gates are on a CubeCL device.
fn gpu_cumulative(log_g: &Tensor<3>, c: usize) -> Tensor<5> {
    use burn::backend::Dispatch;
    let [gb, gh, time] = log_g.dims();
    let b = <Dispatch as ChunkGates>::chunk_log_decay(log_g.clone().into_dispatch(), c);
    Tensor::<2>::from_dispatch(b).reshape([gb, gh, time.div_ceil(c), c, 1])
}

/// The kernel (cubecl's prelude apart: its `Tensor` is not Burn's).
pub(crate) mod kernel {
    use burn_cubecl::cubecl;
    use cubecl::prelude::*;

    /// [`ChunkGates::chunk_log_decay`], one unit per chunk of every gate row, summing along
    /// the chunk.
    #[cube(launch)]
    pub(crate) fn log_decay_kernel(
        log_g: &Tensor<f32>,
        b: &mut Tensor<f32>,
        time: usize,
        chunks: usize,
        gh: usize,
        c: usize,
    ) {
        let at = ABSOLUTE_POS;
        // A grid spread over its axes may hold a few more units than chunks.
        if at * c >= b.len() {
            terminate!();
        }
        let row = at / chunks;
        let start = (at % chunks) * c;
        let base = (row / gh) * log_g.stride(0) + (row % gh) * log_g.stride(1);
        let mut sum = 0.0f32;
        for tau in 0..c {
            if start + tau < time {
                sum += log_g[base + (start + tau) * log_g.stride(2)];
            }
            b[at * c + tau] = sum;
        }
    }
}

#[cfg(all(test, feature = "wgpu"))]
mod tests {
    use burn::tensor::Distribution;

    use super::*;
    use crate::agreement::relative_rms_error;
    use crate::hla::chunks::Chunks;

    /// The kernel against the composed steps (pad, reshape, sum along the chunk), with a
    /// ragged last chunk, for gates per sequence and head and for a per-head decay
    /// broadcast along time (a stride of 0).
    #[test]
    fn the_kernel_is_the_composed_cumulative_sum() {
        let (device, _bounds) = crate::testing::guarded_wgpu();
        let (time, c) = (37, 8);
        let chunks = Chunks::new(time, c);
        let uniform = Distribution::Uniform(-1.0, 0.0);
        let per_token = Tensor::<3>::random([2, 3, time], uniform, &device);
        let per_head = Tensor::<3>::random([1, 3, 1], uniform, &device).expand([1, 3, time]);
        for log_g in [per_token, per_head] {
            let [gb, gh, _] = log_g.dims();
            let want = chunks.gates(&log_g).cumsum(3);
            let error = relative_rms_error(gpu_cumulative(&log_g, c), want);
            assert!(
                error < 1e-6,
                "gates [{gb}, {gh}]: relative RMS error {error}"
            );
        }
    }
}
