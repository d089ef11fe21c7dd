//! The `cuda` build, checked without a GPU (`scripts/cuda-build.sh --test`): the LLVM it
//! linked (Debian's LLVM 22 standing in for tracel's bundle) turns a CubeCL kernel into
//! PTX, and the binary gives one message where no CUDA driver is installed.
#![cfg(feature = "cuda")]

use std::ffi::CStr;
use std::process::Command;
use std::sync::Arc;

use cubecl::ir::features::Features;
use cubecl::ir::{DeviceIdentity, HardwareProperties, MemoryDeviceProperties, nvidia::SmArch};
use cubecl::prelude::*;
use cubecl::{Compiler, CubeKernel};
use cubecl_llvm::nvptx::ptx_version::PtxVersion;
use cubecl_llvm::{LlvmTarget, PlironArtifact, PlironCompiler, PlironOptions};

/// Each unit's neighbour in the cube, through shared memory after a barrier,
/// exponentiated (libdevice's `__nv_expf`).
#[cube(launch)]
fn neighbour_exp(input: &[f32], output: &mut [f32]) {
    let mut shared = Shared::<[f32]>::new_slice(64usize);
    let unit = UNIT_POS as usize;
    shared[unit] = input[ABSOLUTE_POS];
    sync_cube();
    output[ABSOLUTE_POS] = shared[(unit + 1) % 64].exp();
}

/// What the compiler may assume of the GPU: an Ampere-class part.
fn properties() -> Arc<DeviceProperties> {
    let hardware = HardwareProperties {
        load_width: 128,
        vector_register_count: None,
        plane_size_min: 32,
        plane_size_max: 32,
        max_bindings: 32,
        max_shared_memory_size: 48 * 1024,
        max_cube_count: (u32::MAX, u16::MAX as u32, u16::MAX as u32),
        max_units_per_cube: 1024,
        max_cube_dim: (1024, 1024, 64),
        num_streaming_multiprocessors: None,
        num_tensor_cores: None,
        min_tensor_cores_dim: None,
        num_cpu_cores: None,
        last_level_cache_size: None,
        max_vector_size: VectorSize::MAX,
        cube_mma_reserved_shared_memory: 0,
    };
    Arc::new(DeviceProperties::new(
        Features::default(),
        MemoryDeviceProperties::new(u64::MAX, 256),
        hardware,
        cubecl::profile::TimingMethod::Device,
        DeviceIdentity {
            name: "offline".into(),
            fingerprint: "offline".into(),
            physical: None,
        },
    ))
}

/// The PTX of `kernel` for compute capability `arch`, as a CUDA 12.8 driver takes it.
fn ptx(kernel: impl CubeKernel, arch: u32) -> String {
    let options = PlironOptions {
        sm_arch: Some(SmArch::new(arch, false)),
        ptx_version: PtxVersion::for_driver(12080),
        ..Default::default()
    };
    let mut compiler = PlironCompiler {
        target: LlvmTarget::Nvptx,
    };
    let artifact = compiler
        .compile(kernel.define(), &options)
        .unwrap_or_else(|e| panic!("the kernel does not compile: {e:?}"));
    let PlironArtifact::NvptxCode(module) = artifact else {
        panic!("the NVPTX target gave something else than PTX");
    };
    // SAFETY: the module's PTX is NUL-terminated.
    unsafe { CStr::from_ptr(module.ptx.as_ptr()) }
        .to_string_lossy()
        .into_owned()
}

#[test]
fn the_linked_llvm_compiles_a_kernel_to_ptx() {
    let settings = KernelSettings::new(
        *CubeDim::new_1d(64),
        ExecutionMode::Checked,
        AddressType::U32,
    );
    let kernel = neighbour_exp::NeighbourExp::new(
        settings,
        properties(),
        Arc::new(TargetProperties::default()),
        BufferCompilationArg { inplace: None },
        BufferCompilationArg { inplace: None },
    );
    let ptx = ptx(kernel, 80);
    for expected in [
        ".target sm_80",
        ".entry",
        ".shared",
        "bar.sync",
        "ex2.approx",
    ] {
        assert!(ptx.contains(expected), "no {expected:?} in the PTX:\n{ptx}");
    }
    // libdevice was linked in: the module defines `__nv_expf` and leaves no function for
    // the driver to find.
    assert!(ptx.contains("__nv_expf("), "no libdevice exp:\n{ptx}");
    assert!(
        !ptx.contains(".extern .func"),
        "an unresolved function:\n{ptx}"
    );
}

#[test]
fn no_cuda_driver_is_one_message() {
    let libcuda = [
        "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
        "/usr/lib64/libcuda.so.1",
    ];
    if libcuda.iter().any(|p| std::path::Path::new(p).exists()) {
        eprintln!("skipped: this machine has a CUDA driver");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_hla"))
        .args(["train", "--device", "cuda", "--config"])
        .arg(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs/smoke.toml"))
        .arg("--out")
        .arg(dir.path().join("run"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("cannot start the CUDA device cuda:0: no CUDA driver"),
        "{stderr}"
    );
    assert!(!dir.path().join("run").exists(), "nothing is written");
}
