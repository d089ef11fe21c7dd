//! Projections `x W` of every linear layer (bias-free) and the tied output head `x Eᵀ`, one
//! CPU kernel each way on CPU devices ([`cpu`]): rows of every leading dimension in
//! one product, transposed operands read in place, and one autodiff node.

pub(crate) mod cpu;

use burn::nn::Linear;
use burn::prelude::*;

/// `layer` applied to `x [.., d_in]` → `[.., d_out]`.
pub fn linear<const D: usize>(layer: &Linear, x: Tensor<D>) -> Tensor<D> {
    match &layer.bias {
        None => project(x, layer.weight.val()),
        Some(_) => layer.forward(x),
    }
}

/// `x W` for `x [.., d_in]` and `W [d_in, d_out]` (the layout of Burn's `Linear`).
pub fn project<const D: usize>(x: Tensor<D>, weight: Tensor<2>) -> Tensor<D> {
    fused_or(x, weight, false)
}

/// `x Eᵀ` for `x [.., d_in]` and `E [d_out, d_in]` (the embedding table as output head).
pub fn project_transposed<const D: usize>(x: Tensor<D>, weight: Tensor<2>) -> Tensor<D> {
    fused_or(x, weight, true)
}

/// The composed form of [`project`] (`transposed`: of [`project_transposed`]), the test
/// oracle.
pub fn project_composed<const D: usize>(
    x: Tensor<D>,
    weight: Tensor<2>,
    transposed: bool,
) -> Tensor<D> {
    let weight = if transposed {
        weight.transpose()
    } else {
        weight
    };
    burn::tensor::module::linear(x, weight, None)
}

fn fused_or<const D: usize>(x: Tensor<D>, weight: Tensor<2>, transposed: bool) -> Tensor<D> {
    #[cfg(cpu_kernels)]
    if crate::backend::takes_cpu_kernel(&x) {
        use cpu::LinearCpuOps;
        let dims = x.dims();
        let d_out = weight.dims()[if transposed { 0 } else { 1 }];
        let rows = x.reshape([-1, dims[D - 1] as i32]);
        let y = <burn::backend::Dispatch as LinearCpuOps>::project(
            rows.into_dispatch(),
            weight.into_dispatch(),
            transposed,
        );
        let mut out = dims;
        out[D - 1] = d_out;
        return Tensor::<2>::from_dispatch(y).reshape(out);
    }
    project_composed(x, weight, transposed)
}
