//! Tile products on the tensor cores: a plane (warp) multiplies `16 × 8` by `8 × 16`
//! fragments with cubecl's `cmma` (TF32 for f32 on CUDA, from sm_80 on), each plane of a
//! cube taking output tiles in turn. A device without them gets the same products
//! emulated, each unit of a plane computing the accumulator values its lane holds from the
//! operands in memory: the kernels' tiling (which tiles, strides, layouts and lengths) is
//! then checked on lavapipe, and only the fragments' own loads, product and store go
//! unchecked there (their CUDA code compiles offline, `crate::ptx_tests`).

use burn::prelude::Device;
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
    device_mma(like.client.properties())
}

/// The tile products a kernel on `device` plans with: where the cost model plans a GPU
/// ([`super::PlannedGpu`]) that GPU's ([`planned`]), else the device's own ([`mma`]);
/// `None` off a CubeCL device.
pub(crate) fn planned_mma(device: &Device) -> Option<Mma> {
    match super::planning() {
        true => planned(),
        false => super::properties(device).and_then(|p| device_mma(&p)),
    }
}

/// [`mma`] on a device with `properties`.
fn device_mma(properties: &DeviceProperties) -> Option<Mma> {
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

/// The tile products of a kernel whose tiles `fit` [`mma`]'s fragments and whose cube
/// holds `floats` shared floats, where `like`'s device runs them and has that shared
/// memory.
pub(crate) fn tiles_within(
    like: &CubeTensor,
    fit: impl FnOnce(&Mma) -> bool,
    floats: usize,
) -> Option<Mma> {
    let mma = mma(like)?;
    let shared = like.client.properties().hardware.max_shared_memory_size;
    (fit(&mma) && 4 * floats <= shared).then_some(mma)
}

/// Whether the cost model plans a tile kernel on an H100 or H200 ([`CUDA_TF32`], `shared`
/// bytes a cube): its tiles `fit` the fragments, its cube's `floats` shared floats fit,
/// and the tensor cores are not turned off.
pub(crate) fn planned_within(fit: impl FnOnce(&Mma) -> bool, floats: usize, shared: usize) -> bool {
    planned().is_some_and(|mma| fit(&mma)) && 4 * floats <= shared
}

/// The tile products the cost model plans on an H100 or H200: [`CUDA_TF32`], unless the
/// tensor cores are turned off.
pub(crate) fn planned() -> Option<Mma> {
    (tensor_cores() != TensorCores::Off).then_some(CUDA_TF32)
}

/// The units of a tile kernel's cube: [`PLANES`] planes, fewer where the device's cubes
/// are smaller.
pub(crate) fn tile_units(mma: &Mma, max_units: usize) -> usize {
    mma.plane * PLANES.min(max_units / mma.plane).max(1)
}

/// One operand of a tile product, `rows × len` (a product's left) or `len × cols` (its
/// right): read from `data` by rows `stride` apart, or when `cols` by columns `stride`
/// apart (so `Rᵀ` is read from `R`'s rows).
#[derive(CubeType, Clone)]
pub(crate) struct Operand<'a> {
    data: &'a [f32],
    stride: usize,
    #[cube(comptime)]
    cols: bool,
}

#[cube]
impl<'a> Operand<'a> {
    /// An operand stored by columns `stride` apart when `cols`, else by rows.
    pub(crate) fn new(data: &'a [f32], stride: usize, #[comptime] cols: bool) -> Operand<'a> {
        Operand::<'a> { data, stride, cols }
    }

    /// An operand stored by rows `stride` apart.
    pub(crate) fn rows(data: &'a [f32], stride: usize) -> Operand<'a> {
        Operand::new(data, stride, false)
    }

    /// An operand stored by columns `stride` apart.
    pub(crate) fn cols(data: &'a [f32], stride: usize) -> Operand<'a> {
        Operand::new(data, stride, true)
    }
}

// Kernels pass operands and products on as values.
impl Clone for OperandExpand<'_> {
    fn clone(&self) -> Self {
        self.clone_unchecked()
    }
}

impl Clone for ProductExpand<'_> {
    fn clone(&self) -> Self {
        self.clone_unchecked()
    }
}

/// `A B` over `len` (a multiple of `mma.k`; 0: no product).
#[derive(CubeType, Clone)]
pub(crate) struct Product<'a> {
    a: Operand<'a>,
    b: Operand<'a>,
    len: usize,
}

#[cube]
impl<'a> Product<'a> {
    pub(crate) fn new(a: Operand<'a>, b: Operand<'a>, len: usize) -> Product<'a> {
        Product::<'a> { a, b, len }
    }
}

/// One `m × n` tile of `A B`, written to `out` (rows `out_stride` apart) by the calling
/// plane (every unit of the plane calls it alike).
#[cube]
pub(crate) fn tile_product(
    product: Product,
    out: &mut [f32],
    out_stride: usize,
    #[comptime] mma: Mma,
) {
    let none = Product::new(product.a.clone(), product.b.clone(), 0);
    tile_sum(product, none, out, out_stride, mma);
}

/// One `m × n` tile of `A B + A₂ B₂`, as [`tile_product`].
#[cube]
pub(crate) fn tile_sum(
    first: Product,
    second: Product,
    out: &mut [f32],
    out_stride: usize,
    #[comptime] mma: Mma,
) {
    let none = Product::new(first.a.clone(), first.b.clone(), 0);
    let init = first.a.clone();
    tile_sums(
        first,
        second,
        none.clone(),
        none,
        init,
        out,
        out_stride,
        false,
        mma,
    );
}

/// One `m × n` tile of `A₁ B₁ + … + A₄ B₄` (a product of length 0 adds nothing), plus `C`
/// by rows from `init` when `add`, as [`tile_product`].
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn tile_sums(
    first: Product,
    second: Product,
    third: Product,
    fourth: Product,
    init: Operand,
    out: &mut [f32],
    out_stride: usize,
    #[comptime] add: bool,
    #[comptime] mma: Mma,
) {
    if comptime!(mma.tensor) {
        let mut acc = cmma::Matrix::<f32>::from_value(
            cmma::MatrixIdent::Accumulator,
            mma.m,
            mma.n,
            mma.k,
            cmma::MatrixLayout::Undefined,
            0.0,
        );
        if add {
            cmma::load_with_layout(
                &mut acc,
                init.data,
                init.stride as u32,
                cmma::MatrixLayout::RowMajor,
            );
        }
        fragments_product(first, &acc, mma);
        fragments_product(second, &acc, mma);
        fragments_product(third, &acc, mma);
        fragments_product(fourth, &acc, mma);
        cmma::store(out, &acc, out_stride as u32, cmma::MatrixLayout::RowMajor);
    } else {
        let lane = UNIT_POS as usize % mma.plane;
        // A loop, not unrolled: lavapipe compiles a kernel with barriers as coroutines,
        // and unrolled products make it slow to compile.
        for j in 0..comptime!(mma.m * mma.n / mma.plane) {
            let at = lane + j * mma.plane;
            let (row, col) = (at / mma.n, at % mma.n);
            let mut sum = emulated_dot(first.clone(), row, col);
            sum += emulated_dot(second.clone(), row, col);
            sum += emulated_dot(third.clone(), row, col);
            sum += emulated_dot(fourth.clone(), row, col);
            if add {
                sum += init.data[row * init.stride + col];
            }
            out[row * out_stride + col] = sum;
        }
    }
}

/// One `m × n` tile of `C + A B` written over `C` in `out` (rows `out_stride` apart), as
/// [`tile_product`]: an accumulator kept in shared memory.
#[cube]
pub(crate) fn tile_accumulate(
    product: Product,
    out: &mut [f32],
    out_stride: usize,
    #[comptime] mma: Mma,
) {
    if comptime!(mma.tensor) {
        let mut acc = cmma::Matrix::<f32>::from_value(
            cmma::MatrixIdent::Accumulator,
            mma.m,
            mma.n,
            mma.k,
            cmma::MatrixLayout::Undefined,
            0.0,
        );
        cmma::load_with_layout(
            &mut acc,
            &out[0..],
            out_stride as u32,
            cmma::MatrixLayout::RowMajor,
        );
        fragments_product(product, &acc, mma);
        cmma::store(out, &acc, out_stride as u32, cmma::MatrixLayout::RowMajor);
    } else {
        let lane = UNIT_POS as usize % mma.plane;
        for j in 0..comptime!(mma.m * mma.n / mma.plane) {
            let at = lane + j * mma.plane;
            let (row, col) = (at / mma.n, at % mma.n);
            out[row * out_stride + col] += emulated_dot(product.clone(), row, col);
        }
    }
}

/// `acc += A B` on the tensor cores, `len / k` fragment products.
#[cube]
fn fragments_product(product: Product, acc: &cmma::Matrix<f32>, #[comptime] mma: Mma) {
    let (a, b) = (product.a, product.b);
    let a_layout = comptime!(layout(a.cols));
    let b_layout = comptime!(layout(b.cols));
    let mut fa = unsafe {
        cmma::Matrix::<tf32>::uninitialized(cmma::MatrixIdent::A, mma.m, mma.n, mma.k, a_layout)
    };
    let mut fb = unsafe {
        cmma::Matrix::<tf32>::uninitialized(cmma::MatrixIdent::B, mma.m, mma.n, mma.k, b_layout)
    };
    let mut kk = 0usize;
    while kk < product.len {
        // A's kk-th column starts kk values in by rows, kk rows in by columns; B's row
        // the other way round.
        let (mut a_at, mut b_at) = (kk, kk * b.stride);
        if comptime!(a.cols) {
            a_at = kk * a.stride;
        }
        if comptime!(b.cols) {
            b_at = kk;
        }
        cmma::load(&mut fa, &a.data[a_at..], a.stride as u32);
        cmma::load(&mut fb, &b.data[b_at..], b.stride as u32);
        cmma::execute(&fa, &fb, acc, acc);
        kk += mma.k;
    }
}

/// A fragment's layout in memory: by columns or by rows.
fn layout(cols: bool) -> cmma::MatrixLayout {
    match cols {
        true => cmma::MatrixLayout::ColMajor,
        false => cmma::MatrixLayout::RowMajor,
    }
}

/// `(A B)[row, col]` from the operands in memory: what a fragment product leaves in that
/// value of the accumulator.
#[cube]
fn emulated_dot(product: Product, row: usize, col: usize) -> f32 {
    let (a, b) = (product.a, product.b);
    let mut sum = 0.0f32;
    for kk in 0..product.len {
        let (mut a_at, mut b_at) = (row * a.stride + kk, kk * b.stride + col);
        if comptime!(a.cols) {
            a_at = kk * a.stride + row;
        }
        if comptime!(b.cols) {
            b_at = col * b.stride + kk;
        }
        sum += a.data[a_at] * b.data[b_at];
    }
    sum
}
