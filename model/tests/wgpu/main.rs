//! The GPU path: on the wgpu device the HLA forms (outputs, final states, gradients) and
//! one training step of the language model give ndarray's numbers for the same inputs
//! and weights, and the GPU kernels and the nodes give their composed forms' numbers
//! ([`hla`], [`attention`], [`lm`]). Shapes stay small: a software Vulkan device
//! (lavapipe, in CI) compiles every shader on the CPU. The tests take turns ([`SWITCH`]):
//! they switch the process-wide kernels (by default a GPU runs the nodes, not the GPU
//! kernels).
#![cfg(all(feature = "wgpu", feature = "ndarray"))]

#[path = "../common/mod.rs"]
mod common;

mod attention;
mod hla;
mod lm;

use burn::prelude::*;
use hla_model::backend::{GuardScope, Kernels, set_kernels};

/// A GPU sums in another order than a CPU, so f32 results differ by more than between
/// the forms on one device (1e-4).
const TOL: f64 = 1e-3;

fn gpu() -> Device {
    Device::wgpu(burn::tensor::DeviceKind::DefaultDevice)
}

#[allow(deprecated)]
fn cpu() -> Device {
    Device::ndarray()
}

/// The same values as a plain tensor on the CPU, where the comparison is made.
fn to_cpu<const D: usize>(t: Tensor<D>) -> Tensor<D> {
    Tensor::from_data(t.into_data(), &cpu())
}

/// The tests switch the process-wide kernels; they take turns.
static SWITCH: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// A test's turn at [`SWITCH`] with the kernels set to `kernels`: the GPU kernels' tests
/// turn them on (they are off by default), others the composed forms; the default comes
/// back when the turn ends. The kernels plan their grids for [`TURN_MULTIPROCESSORS`]
/// meanwhile, and their buffers are guarded: a kernel that writes past the end of one
/// fails the test when the turn ends, one that reads past it reads NaNs.
fn kernels(kernels: Kernels) -> Turn {
    let guard = SWITCH.lock().unwrap_or_else(|e| e.into_inner());
    set_kernels(kernels);
    hla_model::backend::plan_multiprocessors(Some(TURN_MULTIPROCESSORS));
    Turn {
        _bounds: GuardScope::new(),
        _guard: guard,
    }
}

/// The multiprocessors a test's turn plans for: one, so that the node's passes over the
/// chunks run whole on a real GPU too (its small cases would not fill one, and the passes
/// would split, [`plan_multiprocessors`]), as on lavapipe.
const TURN_MULTIPROCESSORS: usize = 1;

/// Its fields drop in order: the bounds are checked before the next test's turn.
struct Turn {
    _bounds: GuardScope,
    _guard: std::sync::MutexGuard<'static, ()>,
}

impl Drop for Turn {
    fn drop(&mut self) {
        set_kernels(Kernels::default());
        hla_model::backend::plan_multiprocessors(None);
    }
}

/// What `f` returns, and the names of the kernels it launched.
fn launched<T>(f: impl FnOnce() -> T) -> (T, Vec<String>) {
    use burn_cubecl::cubecl::logging::{LaunchObservation, LaunchObserver};
    use std::sync::{Arc, Mutex};
    #[derive(Default)]
    struct Names(Mutex<Vec<String>>);
    impl LaunchObserver for Names {
        fn launched(&self, kernel: &'static str) {
            self.0.lock().unwrap().push(kernel.to_string());
        }
    }
    let names = Arc::new(Names::default());
    let observation = LaunchObservation::new(names.clone());
    let out = f();
    drop(observation);
    let names = names.0.lock().unwrap().clone();
    (out, names)
}

/// Caps the kernels' grid axes at `max` cubes while the guard lives.
fn cap_grid(max: u32) -> Restore {
    hla_model::backend::cap_grid_axis(Some(max));
    Restore(|| hla_model::backend::cap_grid_axis(None))
}

/// Caps the rows a kernel's unit owns at `max` while the guard lives: on lavapipe, whose
/// budget gives a small chunk's tokens to one unit, the chunk then spreads over several
/// units, as on a GPU.
fn cap_rows(max: usize) -> Restore {
    hla_model::backend::cap_unit_rows(Some(max));
    Restore(|| hla_model::backend::cap_unit_rows(None))
}

/// Plans the kernels' grids for a GPU of `count` multiprocessors while the guard lives
/// (lavapipe reports none), then for the turn's again.
fn plan_multiprocessors(count: usize) -> Restore {
    hla_model::backend::plan_multiprocessors(Some(count));
    Restore(|| hla_model::backend::plan_multiprocessors(Some(TURN_MULTIPROCESSORS)))
}

/// Runs the tile kernels' tensor-core products emulated while the guard lives (lavapipe has
/// no tensor cores).
fn emulate_tensor_cores() -> Restore {
    use hla_model::backend::{TensorCores, set_tensor_cores};
    set_tensor_cores(TensorCores::Emulated);
    Restore(|| set_tensor_cores(TensorCores::default()))
}

/// Undoes a process-wide test setting when dropped (the test holds its [`SWITCH`] turn).
struct Restore(fn());

impl Drop for Restore {
    fn drop(&mut self) {
        (self.0)();
    }
}
