//! The node's kernels on TF32 tensor cores (four warps a cube).

use super::{C, D, PRODUCTS, assert_compiles, gates, sums, walks};
use crate::backend::gpu::mma::CUDA_TF32;
use crate::hla::chunks::fused::pass_tiles::pass_tiles_kernel;
use crate::hla::chunks::fused::tiles::output_tiles_kernel;
use crate::hla::node::fused::kernel::Sums;
use crate::hla::node::fused::tiles::grads_tiles_kernel;

/// The output step, `X` by rows and by columns.
#[test]
fn the_output_tiles_compile_to_ptx() {
    for transposed in [false, true] {
        let tiles = kernel!(
            output_tiles_kernel::OutputTilesKernel,
            128,
            [q r v x b m y],
            gates(), (),
            C, D, D, true, true, transposed, CUDA_TF32,
        );
        assert_compiles("output_tiles_kernel", tiles, &PRODUCTS);
    }
}

/// The backward's moment products alone and with every sum (tied, the read by columns
/// and by rows), without and with the gates' gradient.
#[test]
fn the_moment_product_tiles_compile_to_ptx() {
    let all = [
        sums(true, true, false),
        sums(false, false, true),
        sums(true, true, true),
    ];
    for case in [Sums::default()].into_iter().chain(all) {
        let grads = kernel!(
            grads_tiles_kernel::GradsTilesKernel,
            128,
            [q dy a u t x b dq_in da_in x_start log_g_in du da dq log_g],
            gates(), (),
            C, D, D, true, case, CUDA_TF32,
        );
        assert_compiles("grads_tiles_kernel", grads, &PRODUCTS);
    }
}

/// A state's pass over the chunks, forward and back from zeros, 32 rows of the state a
/// cube (as at d 128).
#[test]
fn the_pass_tiles_compile_to_ptx() {
    for walk in walks() {
        let pass = kernel!(
            pass_tiles_kernel::PassTilesKernel,
            128,
            [start k u b states end],
            gates(), (), (),
            C, D, D, walk, 32, CUDA_TF32,
        );
        assert_compiles("pass_tiles_kernel", pass, &PRODUCTS);
    }
}
