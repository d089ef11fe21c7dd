//! What every GPU kernel's launch needs from a CubeCL device: how many units a cube may
//! have and how many rows a unit may own ([`rows`] holds the cube functions of such
//! units), grids of any size, whether a call's buffers fit the device, and the kernels'
//! buffers: uninitialised contiguous outputs and contiguous inputs, guarded by the tests
//! ([`guard`]).

pub(crate) mod guard;
pub(crate) mod mma;
pub(crate) mod rows;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};

use burn::prelude::*;
use burn::tensor::{DType, Shape};
use burn_cubecl::cubecl::ir::{ElemType, FloatKind};
use burn_cubecl::cubecl::prelude::{CubeCount, DeviceProperties};
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;

/// Units per cube: wgpu's portable limit, or the device's own where it is lower.
pub(crate) fn units(like: &CubeTensor) -> u32 {
    cube_units(like.client.properties())
}

/// [`units`] on a device with `properties`.
fn cube_units(properties: &DeviceProperties) -> u32 {
    let hardware = &properties.hardware;
    hardware
        .max_cube_dim
        .0
        .min(hardware.max_units_per_cube)
        .min(256)
}

/// Whether `like`'s device is a CPU (lavapipe, wgpu's `DeviceType::Cpu`), which CubeCL
/// reports as no physical card: kernels that give a unit several rows give it more there.
pub(crate) fn on_cpu(like: &CubeTensor) -> bool {
    like.client.properties().identity.physical.is_none()
}

/// The rows a unit may own and the f32 values its rows (query, output and accumulators)
/// may hold.
pub(crate) struct UnitBudget {
    rows: usize,
    floats: usize,
}

/// On a GPU a unit has at most 255 32-bit registers (NVIDIA's limit): its rows take up to
/// half of them (two rows of the attention's forward pass at width 32, one at width 64).
const GPU_UNIT: UnitBudget = UnitBudget {
    rows: 4,
    floats: 128,
};

/// On a CPU device (lavapipe) a unit's values live in the CPU's caches, and each value read
/// from shared memory is a memory access that serves every row the unit owns. Measured on
/// lavapipe (2026-12-06, the attention's kernels at B1 H4 T2048 d32): 4, 8, 16 and 32 rows
/// a unit took the forward kernel 889, 495, 331 and 384 ms, the key kernel 904, 625, 473
/// and 579 ms.
const CPU_UNIT: UnitBudget = UnitBudget {
    rows: 16,
    floats: 2048,
};

/// The rows a unit owns in a tile of `rows` rows when each row takes `floats` values: the
/// most within `budget` (and [`cap_unit_rows`]'s cap) that divides the tile (a power of
/// two), and at least one.
pub(crate) fn rows_per_unit(rows: usize, floats: usize, budget: &UnitBudget) -> usize {
    let cap = UNIT_ROWS.load(Ordering::Relaxed);
    let mut per_unit = budget.rows.min(rows).min(cap);
    while per_unit > 1 && (per_unit * floats > budget.floats || !rows.is_multiple_of(per_unit)) {
        per_unit /= 2;
    }
    per_unit
}

/// The most rows a unit owns, below its budget's: a test sets a small one so that a CPU
/// device (whose budget gives a small tile to one unit) runs its kernels' tiles over
/// several units, as a GPU does. `usize::MAX`: the budget's.
static UNIT_ROWS: AtomicUsize = AtomicUsize::new(usize::MAX);

/// Caps the rows a unit of the GPU kernels owns at `max` (`None`: its budget's).
#[doc(hidden)]
pub fn cap_unit_rows(max: Option<usize>) {
    UNIT_ROWS.store(max.unwrap_or(usize::MAX).max(1), Ordering::Relaxed);
}

/// The budget of a unit's rows on `like`'s device.
pub(crate) fn unit_budget(like: &CubeTensor) -> &'static UnitBudget {
    if on_cpu(like) { &CPU_UNIT } else { &GPU_UNIT }
}

/// `cubes` cubes on `like`'s device, spread over the grid's axes where one
/// axis is not enough (65,535 cubes on wgpu): the kernels read their linear position
/// (`CUBE_POS`, `ABSOLUTE_POS`) and stop past the last cube or unit they need, since a
/// spread grid may hold a few more.
pub(crate) fn cubes(like: &CubeTensor, cubes: usize) -> CubeCount {
    let (x, y, z) = like.client.properties().hardware.max_cube_count;
    let axis = GRID_AXIS.load(Ordering::Relaxed);
    let [x, y, z] = spread(cubes, [x, y, z].map(|m| m.min(axis)));
    CubeCount::Static(x, y, z)
}

/// The most cubes along one axis of a grid, below the device's own limit: a test sets a
/// small one to run the spread grids of [`cubes`] at small sizes. `u32::MAX`: the
/// device's.
static GRID_AXIS: AtomicU32 = AtomicU32::new(u32::MAX);

/// Caps every axis of the GPU kernels' grids at `max` cubes (`None`: the device's limits),
/// so that a test reaches a grid spread over several axes without 65,536 cubes.
#[doc(hidden)]
pub fn cap_grid_axis(max: Option<u32>) {
    GRID_AXIS.store(max.unwrap_or(u32::MAX).max(1), Ordering::Relaxed);
}

/// `[x, y, z]` cubes holding at least `cubes`, with at most `max[i]` along axis `i`: as
/// few along `y` and `z` as the limits allow, so at most `x − 1` cubes per `y` row and
/// one `x·y` plane are idle.
///
/// # Panics
///
/// If `max` cannot hold `cubes` (over 2⁴⁸ cubes on wgpu, so no buffer a kernel can index
/// reaches it).
fn spread(cubes: usize, max: [u32; 3]) -> [u32; 3] {
    let x = cubes.clamp(1, max[0] as usize);
    let rows = cubes.div_ceil(x);
    let y = rows.clamp(1, max[1] as usize);
    let z = rows.div_ceil(y);
    assert!(
        z <= max[2] as usize,
        "{cubes} cubes exceed the grid {max:?}"
    );
    [x, y, z].map(|n| n as u32)
}

/// Elements a kernel can index: they index with 32-bit integers.
const MAX_ELEMENTS: usize = u32::MAX as usize;

/// What one buffer of a kernel may hold on a device.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Limits {
    /// The largest buffer the device binds to a kernel, in bytes (on wgpu its
    /// `max_storage_buffer_binding_size`, under 4 GiB on Vulkan).
    pub(crate) binding_bytes: u64,
}

impl Limits {
    /// The limits of a CubeCL device; `None` elsewhere.
    pub(crate) fn of(device: &Device) -> Option<Self> {
        properties(device).map(|p| Self {
            binding_bytes: p.memory.max_page_size,
        })
    }

    /// Whether a kernel can take f32 buffers of these lengths: each one bound whole and
    /// indexed with 32-bit integers. Where they do not, the caller runs the composed form
    /// (Burn's ops, whose intermediates are smaller: no saved chunk states, no workspace).
    pub(crate) fn fit(&self, floats: impl IntoIterator<Item = usize>) -> bool {
        floats.into_iter().all(|n| {
            let bytes = (n as u64).saturating_mul(4);
            n <= MAX_ELEMENTS && bytes <= self.binding_bytes
        })
    }
}

/// Whether f32 buffers of these lengths fit a kernel on `device` ([`Limits::fit`]).
pub(crate) fn fits(device: &Device, floats: impl IntoIterator<Item = usize>) -> bool {
    Limits::of(device).is_some_and(|limits| limits.fit(floats))
}

/// Whether `device` is a CubeCL device whose f32 matmuls Burn runs on TF32 tensor cores
/// (see [`super::tf32_matmuls`]).
pub(crate) fn tf32_matmuls(device: &Device) -> bool {
    properties(device).is_some_and(|p| p.supports_type(ElemType::Float(FloatKind::TF32)))
}

/// The most units a cube of a CubeCL device launches with, as [`units`] caps them;
/// `None` elsewhere.
pub(crate) fn max_units(device: &Device) -> Option<usize> {
    properties(device).map(|p| cube_units(&p) as usize)
}

/// The shared memory a cube of a CubeCL device may hold, in bytes, as the kernels plan
/// their tiles ([`PlannedGpu`] may stand in for the device's); `None` elsewhere.
pub(crate) fn shared_bytes(device: &Device) -> Option<usize> {
    let planned = PLANNED_SHARED_BYTES.load(Ordering::Relaxed);
    properties(device).map(|p| match planned {
        0 => p.hardware.max_shared_memory_size,
        planned => planned,
    })
}

/// The shared memory the kernels plan for in place of the device's (0: the device's).
static PLANNED_SHARED_BYTES: AtomicUsize = AtomicUsize::new(0);

/// While it lives, the kernels plan their tiles for `shared` bytes of shared memory per
/// cube and their grids for `multiprocessors` instead of the device's own: the cost
/// model's dry run plans as a named GPU would on a device with less (lavapipe's 32 KiB
/// against an H100's 227, and no multiprocessors), where a launch the device could not
/// compile is counted and dropped, never run.
pub(crate) struct PlannedGpu {
    before: [usize; 2],
}

impl PlannedGpu {
    pub(crate) fn new(shared: usize, multiprocessors: usize) -> Self {
        Self {
            before: [
                PLANNED_SHARED_BYTES.swap(shared, Ordering::Relaxed),
                PLANNED_MULTIPROCESSORS.swap(multiprocessors, Ordering::Relaxed),
            ],
        }
    }
}

impl Drop for PlannedGpu {
    fn drop(&mut self) {
        let [shared, multiprocessors] = self.before;
        PLANNED_SHARED_BYTES.store(shared, Ordering::Relaxed);
        PLANNED_MULTIPROCESSORS.store(multiprocessors, Ordering::Relaxed);
    }
}

/// The streaming multiprocessors a CubeCL device runs cubes on at once, as the kernels
/// plan their grids: a planned GPU's ([`plan_multiprocessors`]), else the device's own
/// where its runtime reads them (cuda), else 64 on a GPU that says none (wgpu; cubecl's
/// own launches assume as many), and `None` on a CPU device (lavapipe: a few cores, each
/// running a cube's units one after another, so a grid of few cubes loses nothing there).
pub(crate) fn multiprocessors(device: &Device) -> Option<usize> {
    let properties = properties(device)?;
    let planned = PLANNED_MULTIPROCESSORS.load(Ordering::Relaxed);
    let hardware = &properties.hardware;
    match (planned, hardware.num_streaming_multiprocessors) {
        (0, Some(reported)) => Some(reported as usize),
        (0, None) => properties.identity.physical.is_some().then_some(64),
        (planned, _) => Some(planned),
    }
}

/// The multiprocessors the kernels plan for in place of the device's (0: the device's).
static PLANNED_MULTIPROCESSORS: AtomicUsize = AtomicUsize::new(0);

/// Plans the GPU kernels' grids for `count` streaming multiprocessors (`None`: the
/// device's, [`multiprocessors`]): the cost model's dry run plans as a named GPU would,
/// and a test reaches the grids of a large GPU on lavapipe.
#[doc(hidden)]
pub fn plan_multiprocessors(count: Option<usize>) {
    PLANNED_MULTIPROCESSORS.store(count.unwrap_or(0), Ordering::Relaxed);
}

/// Whether the kernels plan for a GPU other than the device ([`PlannedGpu`] lives).
pub(crate) fn planning() -> bool {
    PLANNED_SHARED_BYTES.load(Ordering::Relaxed) != 0
}

/// The properties of a CubeCL device; `None` elsewhere.
pub(crate) fn properties(device: &Device) -> Option<Arc<DeviceProperties>> {
    match device.clone().inner().as_dispatch() {
        burn::backend::DispatchDevice::Cube(cube) => Some(cube.client().properties_shared()),
        #[allow(unreachable_patterns)]
        _ => None,
    }
}

/// An uninitialised contiguous f32 tensor on `like`'s device (the kernels index their
/// outputs as contiguous); guarded while a [`guard::Scope`] lives.
#[track_caller]
pub(crate) fn empty(like: &CubeTensor, shape: impl Into<Shape>) -> CubeTensor {
    let shape = shape.into();
    guard::output(like, shape.clone()).unwrap_or_else(|| {
        let (client, device) = (like.client.clone(), like.device.clone());
        empty_device_contiguous_dtype(client, device, shape, DType::F32)
    })
}

/// `x` as a kernel reads it: contiguous, and guarded while a [`guard::Scope`] lives.
pub(crate) fn contiguous(x: CubeTensor) -> CubeTensor {
    guard::input(into_contiguous(x))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On a GPU, two rows a unit of 64 values, one of 96 or more; on a CPU device sixteen,
    /// fewer past 128 values; never more than the tile's rows (one decoding query), and a
    /// divisor of them.
    #[test]
    fn units_own_the_rows_their_registers_hold() {
        let widths = [64, 96, 128, 256, 512];
        let gpu = widths.map(|floats| rows_per_unit(64, floats, &GPU_UNIT));
        assert_eq!(gpu, [2, 1, 1, 1, 1]);
        let cpu = widths.map(|floats| rows_per_unit(64, floats, &CPU_UNIT));
        assert_eq!(cpu, [16, 16, 16, 8, 4]);
        assert_eq!(rows_per_unit(2, 14, &CPU_UNIT), 2);
        assert_eq!(rows_per_unit(24, 14, &CPU_UNIT), 8);
        assert_eq!(rows_per_unit(1, 14, &GPU_UNIT), 1);
    }

    /// A binding limit of 4 GiB − 1 byte, as many Vulkan devices report.
    const VULKAN: Limits = Limits {
        binding_bytes: u32::MAX as u64,
    };

    #[test]
    fn a_buffer_fits_up_to_the_binding_limit_and_32_bit_indices() {
        let small = Limits {
            binding_bytes: 128 << 20,
        };
        assert!(small.fit([1, 32 << 20]));
        assert!(!small.fit([1, (32 << 20) + 1]));
        assert!(VULKAN.fit([(u32::MAX / 4) as usize]));
        assert!(!VULKAN.fit([(u32::MAX / 4) as usize + 1]));
        let unlimited = Limits {
            binding_bytes: u64::MAX,
        };
        assert!(unlimited.fit([u32::MAX as usize]));
        assert!(!unlimited.fit([u32::MAX as usize + 1]));
        assert!(unlimited.fit([]));
    }

    #[test]
    fn a_grid_spreads_over_its_axes_only_where_one_is_full() {
        let wgpu = [65_535; 3];
        assert_eq!(spread(1, wgpu), [1, 1, 1]);
        assert_eq!(spread(65_535, wgpu), [65_535, 1, 1]);
        assert_eq!(spread(65_536, wgpu), [65_535, 2, 1]);
        assert_eq!(spread(10, [7, 7, 7]), [7, 2, 1]);
        assert_eq!(spread(50, [7, 7, 7]), [7, 7, 2]);
        assert_eq!(spread(343, [7, 7, 7]), [7, 7, 7]);
        for cubes in 1..=343 {
            let [x, y, z] = spread(cubes, [7, 7, 7]).map(|n| n as usize);
            let held = x * y * z;
            assert!(
                held >= cubes && held - cubes < x * y,
                "{cubes}: {x}×{y}×{z}"
            );
        }
    }

    #[test]
    #[should_panic(expected = "exceed the grid")]
    fn a_grid_too_large_for_the_device_is_refused() {
        spread(344, [7, 7, 7]);
    }
}
