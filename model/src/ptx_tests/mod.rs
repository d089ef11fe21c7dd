//! The CUDA code generation of the GPU kernels, checked without a GPU
//! (`scripts/cuda-build.sh --test`): cubecl-cuda turns kernels into PTX with LLVM's NVPTX
//! target, and the LLVM the build linked (Debian's LLVM 22 standing in for tracel's
//! bundle) compiles a toolchain probe, a TF32 tensor-core tile product (`cmma`) and every
//! kernel the node (its passes, output step and moment products on TF32 tensor cores
//! too), the fused chunk steps and the tiled attention launch, at flash-linear-attention's
//! head width (d 128, chunks of 64) for an H100/H200 (sm_90): the node's on CUDA cores in
//! [`node`], on tensor cores in [`tiles`], the attention's in [`attention`].

use std::ffi::CStr;
use std::sync::Arc;

use burn_cubecl::cubecl;
use cubecl::ir::features::{Features, MmaConfig, TypeUsage};
use cubecl::ir::{
    DeviceIdentity, ElemType, FloatKind, HardwareProperties, MemoryDeviceProperties, nvidia::SmArch,
};
use cubecl::prelude::*;
use cubecl::{Compiler, CubeKernel};
use cubecl_llvm::nvptx::ptx_version::PtxVersion;
use cubecl_llvm::{LlvmTarget, PlironArtifact, PlironCompiler, PlironOptions};

use crate::hla::chunks::fused::kernel::GatesCompilationArg;
use crate::hla::chunks::fused::pass_kernel::Walk;
use crate::hla::node::fused::kernel::Sums;

/// `$module::$Kernel::new` (a kernel's launch definition) for `$units` units a cube on
/// [`properties`]' GPU: its tensor arguments, named as the kernel names them, each its own
/// buffer ([`tensor`]), then its other arguments in order.
macro_rules! kernel {
    ($module:ident::$kernel:ident, $units:expr, [$($tensor:ident)*] $(, $arg:expr)* $(,)?) => {
        $module::$kernel::new(
            $crate::ptx_tests::settings($units),
            $crate::ptx_tests::properties(),
            std::sync::Arc::new(burn_cubecl::cubecl::prelude::TargetProperties::default()),
            $(kernel!(@tensor $tensor),)*
            $($arg),*
        )
    };
    (@tensor $tensor:ident) => {
        $crate::ptx_tests::tensor()
    };
}

mod attention;
mod node;
mod tiles;

/// Tokens per chunk, and the head width of queries, keys and values.
const C: usize = 64;
const D: usize = 128;
/// What a kernel that tiles through shared memory compiles to, and one whose tile
/// products run on the TF32 tensor cores besides.
const SHARED: [&str; 2] = [".shared", "bar.sync"];
const PRODUCTS: [&str; 4] = [".shared", "bar.sync", "mma.sync", ".tf32"];

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

/// `out = lhs · rhs` for a 16 × 16 tile with 16 terms, on the tensor cores: two TF32
/// 16 × 16 × 8 products accumulated in f32 (`lhs` row-major 16 × 16, `rhs` row-major
/// 16 × 16), the way a fused kernel's tile product would run on CUDA.
#[cube(launch)]
fn tf32_tile(lhs: &[tf32], rhs: &[tf32], out: &mut [f32]) {
    let acc = cmma::Matrix::<f32>::from_value(
        cmma::MatrixIdent::Accumulator,
        16usize,
        16usize,
        8usize,
        cmma::MatrixLayout::Undefined,
        0.0,
    );
    for step in 0..2usize {
        let a = cmma::Matrix::<tf32>::from_slice(
            cmma::MatrixIdent::A,
            16usize,
            16usize,
            8usize,
            cmma::MatrixLayout::RowMajor,
            &lhs[step * 8..],
            16,
        );
        let b = cmma::Matrix::<tf32>::from_slice(
            cmma::MatrixIdent::B,
            16usize,
            16usize,
            8usize,
            cmma::MatrixLayout::RowMajor,
            &rhs[step * 8 * 16..],
            16,
        );
        cmma::execute(&a, &b, &acc, &acc);
    }
    cmma::store(out, &acc, 16, cmma::MatrixLayout::RowMajor);
}

/// What the compiler may assume of the GPU: a Hopper-class part (227 KiB of shared
/// memory a cube) with TF32 tensor cores, whose 16 × 16 × 8 fragments the NVPTX lowering
/// takes (cubecl-cuda advertises them from sm_80 on).
fn properties() -> Arc<DeviceProperties> {
    let hardware = HardwareProperties {
        load_width: 128,
        vector_register_count: None,
        plane_size_min: 32,
        plane_size_max: 32,
        max_bindings: 32,
        max_shared_memory_size: 227 * 1024,
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
    let mut properties = DeviceProperties::new(
        Features::default(),
        MemoryDeviceProperties::new(u64::MAX, 256),
        hardware,
        cubecl::profile::TimingMethod::Device,
        DeviceIdentity {
            name: "offline".into(),
            fingerprint: "offline".into(),
            physical: None,
        },
    );
    let tf32 = ElemType::Float(FloatKind::TF32);
    properties.register_type_usage(tf32, TypeUsage::Conversion);
    properties.features.matmul.cmma.insert(MmaConfig {
        a_type: tf32,
        b_type: tf32,
        cd_type: ElemType::Float(FloatKind::F32),
        m: 16,
        k: 8,
        n: 16,
    });
    Arc::new(properties)
}

/// A launch of `units` units a cube, bounds-checked as the kernels launch.
fn settings(units: usize) -> KernelSettings {
    KernelSettings::new(
        *CubeDim::new_1d(units as u32),
        ExecutionMode::Checked,
        AddressType::U32,
    )
}

/// A tensor argument that is its own buffer.
fn tensor() -> TensorCompilationArg {
    TensorCompilationArg {
        meta: TensorMetaCompilationArg { len: (), rank: () },
        buffer: BufferCompilationArg { inplace: None },
    }
}

/// The argument that finds each chunk's gates.
fn gates() -> GatesCompilationArg {
    GatesCompilationArg {
        chunks: (),
        heads: (),
        gb: (),
        gh: (),
    }
}

/// The moment products' sums with ∂Q's and ∂A's terms so far and a state's read, `tied`
/// or not, the read `transposed` or not, and with `gates` the gates' gradient added to an
/// earlier kernel's.
fn sums(tied: bool, transposed: bool, gates: bool) -> Sums {
    Sums {
        q: true,
        a: true,
        tied,
        read: true,
        transposed,
        gates,
        summed: gates,
    }
}

/// A decayed pass over the chunks forward, and back from zeros.
fn walks() -> [Walk; 2] {
    [false, true].map(|back| Walk {
        decayed: true,
        back,
        zero_start: back,
    })
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

/// The PTX of `kernel` (named `name`) for sm_90; fails unless it is a whole module with
/// an entry, every function it calls defined, and each of `expected` in it.
fn assert_compiles(name: &str, kernel: impl CubeKernel, expected: &[&str]) -> String {
    let ptx = ptx(kernel, 90);
    for want in [".target sm_90", ".entry"].iter().chain(expected) {
        assert!(ptx.contains(want), "{name}: no {want:?} in the PTX:\n{ptx}");
    }
    assert!(
        !ptx.contains(".extern .func"),
        "{name}: an unresolved function:\n{ptx}"
    );
    ptx
}

#[test]
fn the_linked_llvm_compiles_a_kernel_to_ptx() {
    let kernel = neighbour_exp::NeighbourExp::new(
        settings(64),
        properties(),
        Arc::new(TargetProperties::default()),
        BufferCompilationArg { inplace: None },
        BufferCompilationArg { inplace: None },
    );
    let ptx = assert_compiles(
        "neighbour_exp",
        kernel,
        &[".shared", "bar.sync", "ex2.approx"],
    );
    // libdevice was linked in: the module defines `__nv_expf`.
    assert!(ptx.contains("__nv_expf("), "no libdevice exp:\n{ptx}");
}

#[test]
fn a_tf32_tensor_core_tile_compiles_to_ptx() {
    let kernel = tf32_tile::Tf32Tile::new(
        settings(32),
        properties(),
        Arc::new(TargetProperties::default()),
        BufferCompilationArg { inplace: None },
        BufferCompilationArg { inplace: None },
        BufferCompilationArg { inplace: None },
    );
    assert_compiles("tf32_tile", kernel, &["mma.sync", ".tf32"]);
}
