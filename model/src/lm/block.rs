//! A pre-norm block: `x + mixer(norm(x))`, then `x + mlp(norm(x))` when it has an MLP.

use burn::nn::{Dropout, DropoutConfig, LayerNorm, RmsNorm};
use burn::prelude::*;

use super::LmConfig;
use super::mixer::{Mixer, MixerState};
use super::mlp::Mlp;
use super::norm::{either, pre_norm};
use crate::hla::Form;

#[derive(Module, Debug)]
pub struct Block {
    /// The mixer's pre-norm: one of the two, by `LmConfig::norm`.
    mixer_norm: Option<RmsNorm>,
    mixer_layer_norm: Option<LayerNorm>,
    mixer: Mixer,
    mlp: Option<Mlp>,
    dropout: Dropout,
}

impl Block {
    pub fn new(config: &LmConfig, device: &Device) -> Self {
        let (mixer_norm, mixer_layer_norm) = pre_norm(config.norm, config.d_model, device);
        Self {
            mixer_norm,
            mixer_layer_norm,
            mixer: Mixer::new(config, device),
            mlp: config.mlp.then(|| Mlp::new(config, device)),
            dropout: DropoutConfig::new(config.dropout).init(),
        }
    }

    /// `x [batch, time, d_model]` → same shape, continuing from `state`; the next state
    /// when `keep`.
    pub fn forward(
        &self,
        x: Tensor<3>,
        state: Option<MixerState>,
        form: Form,
        keep: bool,
    ) -> (Tensor<3>, Option<MixerState>) {
        let (mixed, state) = self.mixer.forward(
            either(&self.mixer_norm, &self.mixer_layer_norm, x.clone()),
            state,
            form,
            keep,
        );
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
