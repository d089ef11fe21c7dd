//! A pre-norm block: `x + mixer(norm(x))`, then `x + mlp(norm(x))` when it has an MLP.

use burn::module::Initializer;
use burn::nn::{
    Dropout, DropoutConfig, Linear, LinearConfig, RmsNorm, RmsNormConfig, SwiGlu, SwiGluConfig,
};
use burn::prelude::*;

use super::LmConfig;
use super::mixer::{Mixer, MixerState};
use crate::hla::Form;

#[derive(Module, Debug)]
pub struct Block {
    mixer_norm: RmsNorm,
    mixer: Mixer,
    mlp: Option<Mlp>,
    dropout: Dropout,
}

/// SwiGLU feed-forward after its pre-norm: `down(silu(W₁ x) ⊙ W₂ x)`.
#[derive(Module, Debug)]
pub struct Mlp {
    norm: RmsNorm,
    up: SwiGlu,
    down: Linear,
}

impl Block {
    pub fn new(config: &LmConfig, device: &Device) -> Self {
        let (d, d_ff) = (config.d_model, config.d_ff());
        let normal = |std| Initializer::Normal { mean: 0.0, std };
        Self {
            mixer_norm: RmsNormConfig::new(d).init(device),
            mixer: Mixer::new(config, device),
            mlp: config.mlp.then(|| Mlp {
                norm: RmsNormConfig::new(d).init(device),
                up: SwiGluConfig::new(d, d_ff)
                    .with_initializer(normal(config.init_std))
                    .init(device),
                down: LinearConfig::new(d_ff, d)
                    .with_bias(false)
                    .with_initializer(normal(config.residual_std()))
                    .init(device),
            }),
            dropout: DropoutConfig::new(config.dropout).init(),
        }
    }

    /// `x [batch, time, d_model]` → same shape, continuing from `state`.
    pub fn forward(
        &self,
        x: Tensor<3>,
        state: Option<MixerState>,
        form: Form,
    ) -> (Tensor<3>, MixerState) {
        let (mixed, state) = self
            .mixer
            .forward(self.mixer_norm.forward(x.clone()), state, form);
        let x = x + self.dropout.forward(mixed);
        let x = match &self.mlp {
            Some(mlp) => x.clone() + self.dropout.forward(mlp.forward(x)),
            None => x,
        };
        (x, state)
    }

    pub fn state_size(&self, context: usize, device: &Device) -> usize {
        self.mixer.state_size(context, device)
    }
}

impl Mlp {
    /// `x [batch, time, d_model]` → same shape.
    fn forward(&self, x: Tensor<3>) -> Tensor<3> {
        self.down.forward(self.up.forward(self.norm.forward(x)))
    }
}
