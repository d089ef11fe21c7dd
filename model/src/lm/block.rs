//! A pre-norm block: `x + mixer(norm(x))`, then `x + mlp(norm(x))` when it has an MLP.

use burn::nn::{Dropout, DropoutConfig, RmsNorm, RmsNormConfig};
use burn::prelude::*;

use super::LmConfig;
use super::mixer::{Mixer, MixerState};
use super::mlp::Mlp;
use super::norm::rms_norm;
use crate::hla::Form;

#[derive(Module, Debug)]
pub struct Block {
    mixer_norm: RmsNorm,
    mixer: Mixer,
    mlp: Option<Mlp>,
    dropout: Dropout,
}

impl Block {
    pub fn new(config: &LmConfig, device: &Device) -> Self {
        Self {
            mixer_norm: RmsNormConfig::new(config.d_model).init(device),
            mixer: Mixer::new(config, device),
            mlp: config.mlp.then(|| Mlp::new(config, device)),
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
            .forward(rms_norm(&self.mixer_norm, x.clone()), state, form);
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
