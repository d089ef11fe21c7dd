//! The SwiGLU feed-forward after its pre-norm, `down(silu(W₁ x) ⊙ W₂ x)`: `W₁` and `W₂` as
//! one projection `[W₁ | W₂]`, whose gate `silu(a) ⊙ b` runs as one fused kernel on CPU
//! devices ([`fused`]).

pub(crate) mod fused;

use burn::module::Initializer;
use burn::nn::{Linear, LinearConfig, RmsNorm, RmsNormConfig, SwiGlu, SwiGluConfig};
use burn::prelude::*;
use burn::tensor::activation::silu;

use super::LmConfig;
use super::linear::{linear, project};
use super::norm::rms_norm;

#[derive(Module, Debug)]
pub struct Mlp {
    norm: RmsNorm,
    /// `W₁` (`linear_inner`, under the SiLU) and `W₂` (`linear_outer`).
    up: SwiGlu,
    down: Linear,
}

impl Mlp {
    pub fn new(config: &LmConfig, device: &Device) -> Self {
        let (d, d_ff) = (config.d_model, config.d_ff());
        let normal = |std| Initializer::Normal { mean: 0.0, std };
        Self {
            norm: RmsNormConfig::new(d).init(device),
            up: SwiGluConfig::new(d, d_ff)
                .with_initializer(normal(config.init_std))
                .init(device),
            down: LinearConfig::new(d_ff, d)
                .with_bias(false)
                .with_initializer(normal(config.residual_std()))
                .init(device),
        }
    }

    /// `x [batch, time, d_model]` → same shape.
    pub fn forward(&self, x: Tensor<3>) -> Tensor<3> {
        let x = rms_norm(&self.norm, x);
        let up = Tensor::cat(
            vec![
                self.up.linear_inner.weight.val(),
                self.up.linear_outer.weight.val(),
            ],
            1,
        );
        linear(&self.down, swiglu(project(x, up)))
    }
}

/// `silu(a) ⊙ b` for `x = [a | b] [.., 2n]` → `[.., n]`.
pub fn swiglu<const D: usize>(x: Tensor<D>) -> Tensor<D> {
    #[cfg(any(feature = "ndarray", feature = "flex"))]
    if crate::fused::applies(&x) {
        use crate::fused::FusedOps;
        let y = <burn::backend::Dispatch as FusedOps>::swiglu(x.into_dispatch());
        return Tensor::from_dispatch(y);
    }
    swiglu_composed(x)
}

/// The composed form of [`swiglu`], its test oracle.
pub fn swiglu_composed<const D: usize>(x: Tensor<D>) -> Tensor<D> {
    let n = x.dims()[D - 1] / 2;
    silu(x.clone().narrow(D - 1, 0, n)) * x.narrow(D - 1, n, n)
}
