//! The SwiGLU feed-forward after its pre-norm, `down(silu(W₁ x) ⊙ W₂ x)`, whose gate
//! `silu(a) ⊙ b` runs as one fused kernel on CPU devices ([`fused`]).

pub(crate) mod fused;

use burn::module::Initializer;
use burn::nn::{Linear, LinearConfig, RmsNorm, RmsNormConfig, SwiGlu, SwiGluConfig};
use burn::prelude::*;
use burn::tensor::activation::silu;

use super::LmConfig;
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
        let gate = self.up.linear_inner.forward(x.clone());
        let value = self.up.linear_outer.forward(x);
        self.down.forward(swiglu(gate, value))
    }
}

/// `silu(a) ⊙ b` for `a`, `b` of one shape.
pub fn swiglu<const D: usize>(a: Tensor<D>, b: Tensor<D>) -> Tensor<D> {
    #[cfg(any(feature = "ndarray", feature = "flex"))]
    if crate::fused::applies(&a) && a.shape() == b.shape() {
        use crate::fused::FusedOps;
        let y = <burn::backend::Dispatch as FusedOps>::swiglu(a.into_dispatch(), b.into_dispatch());
        return Tensor::from_dispatch(y);
    }
    swiglu_composed(a, b)
}

/// The composed form of [`swiglu`], its test oracle.
pub fn swiglu_composed<const D: usize>(a: Tensor<D>, b: Tensor<D>) -> Tensor<D> {
    silu(a) * b
}
