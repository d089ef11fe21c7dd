//! The feed-forward after its pre-norm: SwiGLU, `down(silu(W₁ x) ⊙ W₂ x)`, with `W₁` and
//! `W₂` as one projection `[W₁ | W₂]` whose gate `silu(a) ⊙ b` runs as one CPU kernel on
//! CPU devices ([`cpu`]); or GPT-2's `down(gelu(W x))`.

pub(crate) mod cpu;

use burn::module::Initializer;
use burn::nn::{LayerNorm, Linear, LinearConfig, RmsNorm, SwiGlu, SwiGluConfig};
use burn::prelude::*;
use burn::tensor::activation::{gelu, silu};

use super::linear::{linear, project};
use super::norm::{either, pre_norm};
use super::{LmConfig, MlpKind};

#[derive(Module, Debug)]
pub struct Mlp {
    /// The pre-norm: one of the two, by `LmConfig::norm`.
    norm: Option<RmsNorm>,
    layer_norm: Option<LayerNorm>,
    /// SwiGLU's `W₁` (`linear_inner`, under the SiLU) and `W₂` (`linear_outer`).
    up: Option<SwiGlu>,
    /// GELU's `W`.
    fc: Option<Linear>,
    down: Linear,
}

impl Mlp {
    pub fn new(config: &LmConfig, device: &Device) -> Self {
        let (d, d_ff) = (config.d_model, config.d_ff());
        let normal = |std| Initializer::Normal { mean: 0.0, std };
        let (norm, layer_norm) = pre_norm(config.norm, d, device);
        let swiglu = config.mlp_kind == MlpKind::Swiglu;
        Self {
            norm,
            layer_norm,
            up: swiglu.then(|| {
                SwiGluConfig::new(d, d_ff)
                    .with_initializer(normal(config.init_std))
                    .init(device)
            }),
            fc: (!swiglu).then(|| {
                LinearConfig::new(d, d_ff)
                    .with_bias(false)
                    .with_initializer(normal(config.init_std))
                    .init(device)
            }),
            down: LinearConfig::new(d_ff, d)
                .with_bias(false)
                .with_initializer(normal(config.residual_std()))
                .init(device),
        }
    }

    /// `x [batch, time, d_model]` → same shape.
    pub fn forward(&self, x: Tensor<3>) -> Tensor<3> {
        let x = either(&self.norm, &self.layer_norm, x);
        let hidden = match (&self.up, &self.fc) {
            (Some(up), _) => {
                let w = [&up.linear_inner, &up.linear_outer].map(|l| l.weight.val());
                swiglu(project(x, Tensor::cat(w.into(), 1)))
            }
            (None, Some(fc)) => gelu(linear(fc, x)),
            (None, None) => unreachable!("an MLP has SwiGLU or GELU weights"),
        };
        linear(&self.down, hidden)
    }
}

/// `silu(a) ⊙ b` for `x = [a | b] [.., 2n]` → `[.., n]`.
pub fn swiglu<const D: usize>(x: Tensor<D>) -> Tensor<D> {
    #[cfg(cpu_kernels)]
    if crate::backend::takes_cpu_kernel(&x) {
        use cpu::MlpCpuOps;
        let y = <burn::backend::Dispatch as MlpCpuOps>::swiglu(x.into_dispatch());
        return Tensor::from_dispatch(y);
    }
    swiglu_composed(x)
}

/// The composed form of [`swiglu`], its test oracle.
pub fn swiglu_composed<const D: usize>(x: Tensor<D>) -> Tensor<D> {
    let n = x.dims()[D - 1] / 2;
    silu(x.clone().narrow(D - 1, 0, n)) * x.narrow(D - 1, n, n)
}
