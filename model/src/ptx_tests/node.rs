//! The node's kernels on CUDA cores (one unit per token or per state row) and its scans.

use super::{C, D, SHARED, assert_compiles, gates, sums, walks};
use crate::hla::chunks::fused::kernel::output_kernel;
use crate::hla::chunks::fused::pass_kernel::pass_kernel;
use crate::hla::chunks::gates::kernel::log_decay_kernel;
use crate::hla::chunks::gpu::scan_kernel;
use crate::hla::node::fused::kernel::{Sums, grads_kernel};
use crate::hla::second::fused::kernel::moments_kernel;

/// The chunk scans over the chunks (forward and back, with the decay, from a start state
/// and from zeros), and the cumulative log gates inside every chunk (gates in any
/// layout): no shared memory.
#[test]
fn the_scans_compile_to_ptx() {
    for reverse in [false, true] {
        let scan = kernel!(
            scan_kernel::ScanKernel,
            256,
            [start deltas b states end],
            (), (), (), (), (), (), (),
            true, reverse, reverse,
        );
        assert_compiles("scan_kernel", scan, &[]);
    }
    let log_decay = kernel!(log_decay_kernel::LogDecayKernel, 256, [log_g b], (), (), (), ());
    assert_compiles("log_decay_kernel", log_decay, &[]);
}

/// The output step (`M` written, `X` by columns) and hla2's moments.
#[test]
fn the_output_and_moments_compile_to_ptx() {
    let output = kernel!(
        output_kernel::OutputKernel,
        C,
        [q r v x b m y],
        gates(), (),
        C, D, D, true, true, true, 1,
    );
    assert_compiles("output_kernel", output, &SHARED);
    let moments = kernel!(
        moments_kernel::MomentsKernel,
        C,
        [q k s b w a],
        gates(),
        C, D, true, 1,
    );
    assert_compiles("moments_kernel", moments, &SHARED);
}

/// A state's pass over the chunks, forward (the updates `Kᵀ diag(e^p) U` inside) and back
/// from zeros (`Qᵀ diag(a^p) ∂Y`).
#[test]
fn the_passes_compile_to_ptx() {
    for walk in walks() {
        let pass = kernel!(
            pass_kernel::PassKernel,
            256,
            [start k u b states end],
            gates(), (), (),
            C, D, D, walk,
        );
        assert_compiles("pass_kernel", pass, &SHARED);
    }
}

/// The moment products: alone, and adding ∂Q's terms so far, a term of ∂A, (tied) ∂U into
/// ∂A and a state's read term of ∂Q (transposed), with the gates' gradient added to an
/// earlier kernel's.
#[test]
fn the_moment_products_compile_to_ptx() {
    for case in [Sums::default(), sums(true, true, true)] {
        let grads = kernel!(
            grads_kernel::GradsKernel,
            C,
            [q dy a u t x b dq_in da_in x_start log_g_in du da dq log_g],
            gates(), (),
            C, D, D, true, case, 1,
        );
        assert_compiles("grads_kernel", grads, &SHARED);
    }
}
