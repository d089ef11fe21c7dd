//! Guarded buffers: the GPU kernels' tests' bounds check.
//!
//! CubeCL's validation mode reports an out-of-bounds index with `printf`, which its WGSL
//! compiler drops, so on wgpu (lavapipe in CI) it cannot fail a test. While a [`Scope`]
//! lives, every buffer the kernels are given or make instead carries a guard band past
//! its end, inside the binding the kernel sees, as long as the buffer and at least
//! [`MIN_BAND`] words: an index up to twice the buffer's length lands in it (past the
//! binding, wgpu reads 0 and drops a write). Then
//!
//! * a read out of bounds reads an input's band, NaNs ([`INPUT_BAND`]), which reach the
//!   result (and fail its comparison) unless the kernel masks them away with a select;
//! * a write out of bounds changes a band (an output's is a finite value no kernel
//!   computes, [`OUTPUT_BAND`], so that adding to it changes it too), which the scope's
//!   end reads back and reports ([`Scope::breaches`]), naming where the buffer was made;
//! * an output starts as NaNs, so a value the kernel leaves unwritten and a caller reads
//!   fails the comparison too.
//!
//! Off (no scope), the kernels' buffers are Burn's own, unpadded. The switch is the
//! process's (fusion launches the kernels on its device's thread, not the test's), so
//! scopes take turns: each reports the buffers made in its own time.

use std::panic::Location;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};

use burn::backend::TensorMetadata;
use burn::tensor::{DType, Shape};
use burn_cubecl::CubeDevice;
use burn_cubecl::cubecl::client::Client;
use burn_cubecl::cubecl::server::Handle;
use burn_cubecl::ops::into_data_sync;
use burn_cubecl::tensor::CubeTensor;

/// The fewest words of the band past a guarded buffer.
const MIN_BAND: usize = 64;

/// The words of the band past a buffer of `floats` values.
fn band(floats: usize) -> usize {
    floats.max(MIN_BAND)
}

/// An input's band: a quiet NaN with a payload (a NaN read past the end and written past
/// an output's end changes that band).
const INPUT_BAND: u32 = 0x7fc5_a5a5;

/// An output's band: about 1.5e16, a value no kernel writes by chance.
const OUTPUT_BAND: u32 = 0x5a5a_5a5a;

/// What a guarded output holds before its kernel writes it: a NaN.
const UNWRITTEN_BITS: u32 = 0x7fc0_0000;

/// Held by the live scope.
static TURN: Mutex<()> = Mutex::new(());

/// Whether a scope lives: the kernels' buffers are guarded.
static GUARDING: AtomicBool = AtomicBool::new(false);

/// The guarded buffers made since the live scope began, not yet checked.
static GUARDED: Mutex<Vec<Guarded>> = Mutex::new(Vec::new());

/// [`GUARDED`], whatever a test that panicked holding it left.
fn guarded_list() -> MutexGuard<'static, Vec<Guarded>> {
    GUARDED.lock().unwrap_or_else(|e| e.into_inner())
}

/// One guarded buffer: its whole allocation, band included.
struct Guarded {
    client: Client,
    handle: Handle,
    shape: Shape,
    /// Where an output was made (an input is named by its shape).
    made_at: Option<&'static Location<'static>>,
}

impl Guarded {
    /// What broke the band, if anything did.
    fn breach(self) -> Option<String> {
        let bytes = self
            .client
            .read_one(self.handle)
            .expect("reading a guard band");
        let floats = self.shape.num_elements();
        let want = band_bits(self.made_at.is_some());
        let changed = words(&bytes[floats * 4..])
            .enumerate()
            .filter(|(_, w)| *w != want)
            .map(|(i, _)| i)
            .collect::<Vec<_>>();
        let (first, last) = (changed.first()?, changed.last()?);
        let buffer = match self.made_at {
            Some(at) => format!("an output made at {at}"),
            None => "an input".into(),
        };
        Some(format!(
            "a kernel wrote past the end of {buffer}, of shape {:?}: {} of the {} guard \
             words from {first} to {last} changed",
            self.shape.as_slice(),
            changed.len(),
            band(floats)
        ))
    }
}

/// The bits of an output's band or an input's.
fn band_bits(output: bool) -> u32 {
    if output { OUTPUT_BAND } else { INPUT_BAND }
}

fn words(bytes: &[u8]) -> impl Iterator<Item = u32> + '_ {
    bytes
        .chunks_exact(4)
        .map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]]))
}

/// While it lives, the kernels' buffers are guarded; [`breaches`](Self::breaches) (or
/// the drop, which panics on one unless the thread is already panicking) reports what
/// broke their bands. One scope lives at a time: a second waits for the first to end.
#[doc(hidden)]
pub struct Scope {
    _turn: MutexGuard<'static, ()>,
}

impl Scope {
    /// Guards the kernels' buffers until the scope ends, once no other scope lives.
    #[allow(clippy::new_without_default)]
    pub fn new() -> Self {
        let turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
        guarded_list().clear();
        GUARDING.store(true, Ordering::SeqCst);
        Self { _turn: turn }
    }

    /// What broke the bands of the buffers guarded so far, one line each; they are
    /// forgotten.
    pub fn breaches(&self) -> Vec<String> {
        let guarded = std::mem::take(&mut *guarded_list());
        guarded.into_iter().filter_map(Guarded::breach).collect()
    }
}

impl Drop for Scope {
    fn drop(&mut self) {
        GUARDING.store(false, Ordering::SeqCst);
        if std::thread::panicking() {
            return;
        }
        let breaches = self.breaches();
        assert!(breaches.is_empty(), "{}", breaches.join("\n"));
    }
}

fn guarding() -> bool {
    GUARDING.load(Ordering::SeqCst)
}

/// `x` in a guarded buffer of its own, contiguous, while a scope lives; else `x`.
pub(crate) fn input(x: CubeTensor) -> CubeTensor {
    if !guarding() || x.dtype != DType::F32 {
        return x;
    }
    let (client, device, shape) = (x.client.clone(), x.device.clone(), x.shape());
    let data = into_data_sync(x);
    guarded(client, device, shape, data.as_bytes(), None)
}

/// An uninitialised contiguous f32 tensor of `shape` on `like`'s device: guarded and full
/// of NaNs while a scope lives.
#[track_caller]
pub(crate) fn output(like: &CubeTensor, shape: Shape) -> Option<CubeTensor> {
    let made_at = Location::caller();
    guarding().then(|| {
        let body = UNWRITTEN_BITS.to_le_bytes().repeat(shape.num_elements());
        let (client, device) = (like.client.clone(), like.device.clone());
        guarded(client, device, shape, &body, Some(made_at))
    })
}

/// A tensor of `shape` holding `body`, in a buffer that ends in the band.
fn guarded(
    client: Client,
    device: CubeDevice,
    shape: Shape,
    body: &[u8],
    made_at: Option<&'static Location<'static>>,
) -> CubeTensor {
    let floats = shape.num_elements();
    let mut bytes = body.to_vec();
    bytes.extend(
        band_bits(made_at.is_some())
            .to_le_bytes()
            .repeat(band(floats)),
    );
    let handle = client.create_from_slice(&bytes);
    guarded_list().push(Guarded {
        client: client.clone(),
        handle: handle.clone(),
        shape: shape.clone(),
        made_at,
    });
    CubeTensor::new_contiguous(client, device, shape, handle, DType::F32)
}

#[cfg(all(test, feature = "wgpu"))]
mod tests {
    use burn::backend::TensorMetadata;
    use burn::backend::fusion::custom::TensorSpec;
    use burn::backend::tensor::FloatTensor;
    use burn::backend::{Backend, Dispatch, backend_extension};
    use burn::prelude::*;
    use burn::tensor::DeviceKind;
    use burn_cubecl::CubeBackend;
    use burn_cubecl::cubecl::prelude::{CubeCount, CubeDim};

    use super::Scope;
    use crate::backend::gpu::{contiguous, empty};

    /// `y_i = x_{i + shift} + 1` for `i < len(y) + extra`: a kernel that reads `shift`
    /// values and writes `extra` values past the ends of its buffers.
    #[backend_extension(Cube, Fusion)]
    trait Reach: Backend {
        #[fusion(meta = reach_spec)]
        fn reach(x: FloatTensor<Self>, shift: usize, extra: usize) -> FloatTensor<Self>;
    }

    fn reach_spec(x: &TensorSpec, _: &usize, _: &usize) -> TensorSpec {
        x.clone()
    }

    impl Reach for CubeBackend {
        fn reach(x: FloatTensor<Self>, shift: usize, extra: usize) -> FloatTensor<Self> {
            let x = contiguous(x);
            let y = empty(&x, x.shape());
            kernel::reach_kernel::launch(
                &x.client.clone(),
                CubeCount::Static(1, 1, 1),
                CubeDim::new_1d(1),
                x.into_tensor_arg(),
                y.clone().into_tensor_arg(),
                shift,
                extra,
            );
            y
        }
    }

    mod kernel {
        use burn_cubecl::cubecl;
        use cubecl::prelude::*;

        #[cube(launch)]
        pub(super) fn reach_kernel(
            x: &Tensor<f32>,
            y: &mut Tensor<f32>,
            shift: usize,
            extra: usize,
        ) {
            for i in 0..y.len() + extra {
                y[i] = x[i + shift] + 1.0;
            }
        }
    }

    /// The kernel's `y` for `x = 0, 1, …, 5` on wgpu, as host values.
    fn reach(shift: usize, extra: usize) -> Vec<f32> {
        let device = Device::wgpu(DeviceKind::DefaultDevice);
        let x = Tensor::<1>::from_floats([0.0, 1.0, 2.0, 3.0, 4.0, 5.0], &device);
        let y = <Dispatch as Reach>::reach(x.into_dispatch(), shift, extra);
        let y = Tensor::<1>::from_dispatch(y).into_data();
        y.try_to_vec::<f32>().unwrap()
    }

    /// In bounds, the guarded buffers change nothing.
    #[test]
    fn a_kernel_in_bounds_breaks_no_guard() {
        let scope = Scope::new();
        assert_eq!(reach(0, 0), [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        assert_eq!(scope.breaches(), Vec::<String>::new());
    }

    /// A read past an input's end gives a NaN (unguarded, a checked launch reads 0).
    #[test]
    fn a_read_past_the_end_reads_nan() {
        let y = {
            let _scope = Scope::new();
            reach(1, 0)
        };
        assert!(
            y[..5].iter().all(|v| v.is_finite()) && y[5].is_nan(),
            "{y:?}"
        );
    }

    /// A write past an output's end breaks its guard, and the scope says where the
    /// output was made; dropped, it fails the test.
    #[test]
    fn a_write_past_the_end_is_reported() {
        let scope = Scope::new();
        reach(0, 2);
        let breaches = scope.breaches();
        assert_eq!(breaches.len(), 1, "{breaches:?}");
        let made = include_str!("guard.rs")
            .lines()
            .position(|line| line.contains("let y = empty(&x, x.shape());"))
            .unwrap();
        let made_at = format!(
            "an output made at model/src/backend/gpu/guard.rs:{}:",
            made + 1
        );
        assert!(
            breaches[0].contains(&made_at)
                && breaches[0].contains("2 of the 64 guard words from 0 to 1 changed"),
            "{}",
            breaches[0]
        );
        assert!(scope.breaches().is_empty(), "reported once");
    }

    #[test]
    #[should_panic(expected = "a kernel wrote past the end of an output")]
    fn a_scope_ending_on_a_breach_panics() {
        let _scope = Scope::new();
        reach(0, 1);
    }
}
