//! Tile products on the tensor cores: a plane (warp) multiplies `16 × 8` by `8 × 16`
//! fragments with cubecl's `cmma` (TF32 for f32 on CUDA, from sm_80 on), each plane of a
//! cube taking output tiles in turn. A device without them gets the same products
//! emulated, each unit of a plane computing the accumulator values its lane holds from the
//! operands in memory: the kernels' tiling (which tiles, strides, layouts and lengths) is
//! then checked on lavapipe, and only the fragments' own loads, product and store go
//! unchecked there (their CUDA code compiles offline, `crate::ptx_tests`).

use burn_cubecl::cubecl;
use burn_cubecl::tensor::CubeTensor;
use cubecl::ir::features::MmaConfig;
use cubecl::ir::{ElemType, FloatKind};
use cubecl::prelude::*;

use crate::backend::{TensorCores, tensor_cores};

/// The fragments a tile product runs on (compile-time): `m × k` by `k × n`, a plane of
/// `plane` units, and whether on the tensor cores (`cmma`) or emulated.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Mma {
    pub(crate) m: usize,
    pub(crate) n: usize,
    pub(crate) k: usize,
    pub(crate) plane: usize,
    pub(crate) tensor: bool,
}

/// The TF32 fragment shape CUDA's tensor cores take for f32 operands.
const FRAGMENT: [usize; 3] = [16, 16, 8];

/// The tile products of an H100 or H200 (what the cost model plans for): TF32 fragments,
/// warps of 32.
pub(crate) const CUDA_TF32: Mma = Mma {
    m: FRAGMENT[0],
    n: FRAGMENT[1],
    k: FRAGMENT[2],
    plane: 32,
    tensor: true,
};

/// Planes per cube of a tile kernel: four warps (128 units) on CUDA.
const PLANES: usize = 4;

/// The tile products `like`'s device runs ([`tensor_cores`]): TF32 `cmma` where it has
/// them, emulated where asked; `None` elsewhere, where they are off, and where its planes
/// do not have one size a kernel can compile for.
pub(crate) fn mma(like: &CubeTensor) -> Option<Mma> {
    let properties = like.client.properties();
    let hardware = &properties.hardware;
    let plane = hardware.plane_size_max as usize;
    let [m, n, k] = FRAGMENT;
    let tf32 = ElemType::Float(FloatKind::TF32);
    let tensor = properties.features.matmul.cmma.contains(&MmaConfig {
        a_type: tf32,
        b_type: tf32,
        cd_type: ElemType::Float(FloatKind::F32),
        m: m as u32,
        k: k as u32,
        n: n as u32,
    });
    let even = plane > 0 && hardware.plane_size_min as usize == plane && (m * n) % plane == 0;
    let on = match tensor_cores() {
        TensorCores::Device => tensor,
        TensorCores::Off => false,
        TensorCores::Emulated => true,
    };
    (on && even).then_some(Mma {
        m,
        n,
        k,
        plane,
        tensor,
    })
}

/// The units of a tile kernel's cube: [`PLANES`] planes, fewer where the device's cubes
/// are smaller.
pub(crate) fn tile_units(mma: &Mma, max_units: usize) -> usize {
    mma.plane * PLANES.min(max_units / mma.plane).max(1)
}

/// One `m × n` tile of `A B + A₂ B₂`, written to `out` (rows `out_stride` apart), by the
/// calling plane (every unit of the plane calls it alike). `A [m, len]` is read from `a`
/// (rows `a_stride` apart), `B [len, n]` from `b`, by rows `b_stride` apart, or when
/// `b_cols` by columns (so `Rᵀ` is read from `R`'s rows); likewise the second product,
/// with `len2` (0: none). The lengths are multiples of `mma.k`.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn tile_product(
    a: &[f32],
    a_stride: usize,
    b: &[f32],
    b_stride: usize,
    len: usize,
    a2: &[f32],
    a2_stride: usize,
    b2: &[f32],
    b2_stride: usize,
    len2: usize,
    out: &mut [f32],
    out_stride: usize,
    #[comptime] b_cols: bool,
    #[comptime] b2_cols: bool,
    #[comptime] mma: Mma,
) {
    if comptime!(mma.tensor) {
        let acc = cmma::Matrix::<f32>::from_value(
            cmma::MatrixIdent::Accumulator,
            mma.m,
            mma.n,
            mma.k,
            cmma::MatrixLayout::Undefined,
            0.0,
        );
        fragments_product(a, a_stride, b, b_stride, len, b_cols, &acc, mma);
        fragments_product(a2, a2_stride, b2, b2_stride, len2, b2_cols, &acc, mma);
        cmma::store(out, &acc, out_stride as u32, cmma::MatrixLayout::RowMajor);
    } else {
        let lane = UNIT_POS as usize % mma.plane;
        // A loop, not unrolled: lavapipe compiles a kernel with barriers as coroutines,
        // and unrolled products make it slow to compile.
        for j in 0..comptime!(mma.m * mma.n / mma.plane) {
            let at = lane + j * mma.plane;
            let (row, col) = (at / mma.n, at % mma.n);
            let mut sum = emulated_dot(a, a_stride, b, b_stride, len, b_cols, row, col);
            sum += emulated_dot(a2, a2_stride, b2, b2_stride, len2, b2_cols, row, col);
            out[row * out_stride + col] = sum;
        }
    }
}

/// `acc += A B` on the tensor cores, `len / k` fragment products.
#[cube]
#[allow(clippy::too_many_arguments)]
fn fragments_product(
    a: &[f32],
    a_stride: usize,
    b: &[f32],
    b_stride: usize,
    len: usize,
    #[comptime] b_cols: bool,
    acc: &cmma::Matrix<f32>,
    #[comptime] mma: Mma,
) {
    let b_layout = comptime!(match b_cols {
        true => cmma::MatrixLayout::ColMajor,
        false => cmma::MatrixLayout::RowMajor,
    });
    let mut fa = unsafe {
        cmma::Matrix::<tf32>::uninitialized(
            cmma::MatrixIdent::A,
            mma.m,
            mma.n,
            mma.k,
            cmma::MatrixLayout::RowMajor,
        )
    };
    let mut fb = unsafe {
        cmma::Matrix::<tf32>::uninitialized(cmma::MatrixIdent::B, mma.m, mma.n, mma.k, b_layout)
    };
    let mut kk = 0usize;
    while kk < len {
        cmma::load(&mut fa, &a[kk..], a_stride as u32);
        let mut from = kk * b_stride;
        if b_cols {
            from = kk;
        }
        cmma::load(&mut fb, &b[from..], b_stride as u32);
        cmma::execute(&fa, &fb, acc, acc);
        kk += mma.k;
    }
}

/// `(A B)[row, col]` over `len`, from the operands in memory: what a fragment product
/// leaves in that value of the accumulator.
#[cube]
#[allow(clippy::too_many_arguments)]
fn emulated_dot(
    a: &[f32],
    a_stride: usize,
    b: &[f32],
    b_stride: usize,
    len: usize,
    #[comptime] b_cols: bool,
    row: usize,
    col: usize,
) -> f32 {
    let mut sum = 0.0f32;
    for kk in 0..len {
        let mut at = kk * b_stride + col;
        if b_cols {
            at = col * b_stride + kk;
        }
        sum += a[row * a_stride + kk] * b[at];
    }
    sum
}
