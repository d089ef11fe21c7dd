//! The language model: token embedding, pre-norm blocks whose token mixer is chosen by
//! the config per layer (HLA, linear attention or softmax attention), final RMSNorm,
//! output head.
//!
//! Three ways to run, on the same weights: [`Lm::forward`] (chunk-parallel, training),
//! [`Lm::prefill`] (chunk-parallel over a prompt, keeping the state) and [`Lm::step`]
//! (the serial recurrence, one token at a time; a KV cache for softmax attention).

pub mod attention;
mod block;
mod config;
pub mod conv;
pub mod head;
#[cfg(all(test, cpu_kernels))]
mod kernel_tests;
pub mod linear;
pub(crate) mod mixer;
pub mod mlp;
pub mod norm;

pub use config::{
    ConfigError, DecayKind, FeatureMap, LmConfig, MixerKind, MlpKind, NormKind, Positions,
};
pub use head::{HeadLoss, TokenScores, token_nll};
pub use mixer::{DENOMINATOR_EPS, GATE_TEMPERATURE, L2_EPS, MixerState};

use burn::nn::{Dropout, Embedding, LayerNorm, Linear, RmsNorm};
use burn::prelude::*;

use crate::hla::Form;
use block::Block;

#[derive(Module, Debug)]
pub struct Lm {
    embedding: Embedding,
    /// Learned absolute positions, `[max_seq_len, d_model]`.
    positions: Option<Embedding>,
    blocks: Vec<Block>,
    /// The final norm: one of the two, by `LmConfig::norm`.
    norm: Option<RmsNorm>,
    layer_norm: Option<LayerNorm>,
    /// `None`: tied to the embedding.
    head: Option<Linear>,
    dropout: Dropout,
    /// The chunk-parallel form of training and prefill.
    #[module(skip)]
    form: Form,
}

/// The per-sequence state of every layer between [`Lm::prefill`] and [`Lm::step`] calls:
/// each layer's own, an HLA state or a KV cache by its mixer.
#[derive(Debug, Clone)]
pub struct LmState {
    batch: usize,
    layers: Vec<Option<MixerState>>,
    position: usize,
}

impl LmState {
    /// Tokens seen so far.
    pub fn position(&self) -> usize {
        self.position
    }

    /// Sequences in the batch.
    pub fn batch(&self) -> usize {
        self.batch
    }
}

impl Lm {
    /// `tokens [batch, time]` → logits `[batch, time, vocab]`, chunk-parallel (training).
    pub fn forward(&self, tokens: Tensor<2, Int>) -> Tensor<3> {
        let mut state = self.init_state(tokens.dims()[0]);
        let x = self.features(tokens, &mut state, self.form, false);
        self.logits(x)
    }

    /// `tokens [batch, time]`, `at [n]` flat positions `row · time + col` → the logits
    /// there, `[n, vocab]`, chunk-parallel: what a loss over a few scored positions needs,
    /// without the head's cost at every other position.
    pub fn forward_at(&self, tokens: Tensor<2, Int>, at: Tensor<1, Int>) -> Tensor<2> {
        self.logits(self.rows(tokens, Some(at)))
    }

    /// `tokens [batch, time]` → the blocks' output rows (before the final norm) at the flat
    /// positions `at [n]` (`row · time + col`), or at every position (`None`: `[batch ·
    /// time, d_model]`, row-major), chunk-parallel: the input of [`Lm::head_loss`] and
    /// [`Lm::scores`].
    pub fn rows(&self, tokens: Tensor<2, Int>, at: Option<Tensor<1, Int>>) -> Tensor<2> {
        let mut state = self.init_state(tokens.dims()[0]);
        let x = self.features(tokens, &mut state, self.form, false);
        let [batch, time, d_model] = x.dims();
        let x = x.reshape([batch * time, d_model]);
        match at {
            Some(at) => x.select(0, at),
            None => x,
        }
    }

    /// An empty state (no token seen) for `batch` sequences.
    pub fn init_state(&self, batch: usize) -> LmState {
        LmState {
            batch,
            layers: vec![None; self.blocks.len()],
            position: 0,
        }
    }

    /// `tokens [batch, time]` → logits `[batch, time, vocab]`, chunk-parallel over a prompt,
    /// continuing from and updating `state`.
    pub fn prefill(&self, tokens: Tensor<2, Int>, state: &mut LmState) -> Tensor<3> {
        let x = self.features(tokens, state, self.form, true);
        self.logits(x)
    }

    /// [`prefill`](Self::prefill) returning the logits after the prompt only, `[batch,
    /// vocab]`: what generation needs, without the head at every prompt position.
    pub fn prefill_last(&self, tokens: Tensor<2, Int>, state: &mut LmState) -> Tensor<2> {
        let x = self.features(tokens, state, self.form, true);
        let [batch, time, d_model] = x.dims();
        self.logits(x.narrow(1, time - 1, 1).reshape([batch, d_model]))
    }

    /// `tokens [batch]` → next-token logits `[batch, vocab]` with the serial recurrence,
    /// updating `state`.
    ///
    /// # Panics
    ///
    /// If `state` was made for another batch size (as does [`prefill`](Self::prefill)).
    pub fn step(&self, tokens: Tensor<1, Int>, state: &mut LmState) -> Tensor<2> {
        self.logits(self.step_rows(tokens, state))
    }

    /// `tokens [batch]` → the blocks' output rows `[batch, d_model]` with the serial
    /// recurrence, updating `state` (as [`step`](Self::step)): what scoring each step
    /// with [`Lm::scores`] needs, without its logits.
    pub fn step_rows(&self, tokens: Tensor<1, Int>, state: &mut LmState) -> Tensor<2> {
        let x = self.features(tokens.unsqueeze_dim(1), state, Form::Recurrent, true);
        x.squeeze_dim(1)
    }

    /// Mean cross-entropy of the next-token predictions for `inputs [batch, time]` against
    /// `targets [batch, time]`, chunk-parallel.
    pub fn loss(&self, inputs: Tensor<2, Int>, targets: Tensor<2, Int>) -> Tensor<1> {
        let n: usize = targets.dims().iter().product();
        self.head_loss(self.rows(inputs, None), targets.reshape([n]))
            .loss
    }

    /// Blocks (layers).
    pub fn num_layers(&self) -> usize {
        self.blocks.len()
    }

    /// Floats of recurrent state per sequence of each layer, first layer first, after
    /// `context` tokens (constant for HLA and linear attention; the KV cache of softmax
    /// attention grows).
    pub fn state_sizes(&self, context: usize) -> Vec<usize> {
        let device = self.embedding.devices()[0].clone();
        self.blocks
            .iter()
            .map(|block| block.state_size(context, &device))
            .collect()
    }

    /// Rows `start..start + time` of the learned positions, `[1, time, d_model]`.
    ///
    /// # Panics
    ///
    /// Past the table's `max_seq_len` rows (callers check `LmConfig::position_limit`).
    fn position_rows(&self, positions: &Embedding, start: usize, time: usize) -> Tensor<3> {
        let limit = positions.weight.dims()[0];
        assert!(
            start + time <= limit,
            "positions {start}..{} are past the {limit} learned positions (model.max_seq_len)",
            start + time
        );
        positions
            .weight
            .val()
            .narrow(0, start, time)
            .unsqueeze_dim(0)
    }

    /// The blocks' output before the final norm, `[batch, time, d_model]`, continuing from
    /// `state` and (when `keep`) updating it; a caller that drops the state (training)
    /// passes `keep = false`, and the mixers make none.
    fn features(
        &self,
        tokens: Tensor<2, Int>,
        state: &mut LmState,
        form: Form,
        keep: bool,
    ) -> Tensor<3> {
        let [batch, time] = tokens.dims();
        assert_eq!(
            batch, state.batch,
            "the state was made for another batch size"
        );
        let mut x = self.embedding.forward(tokens);
        if let Some(positions) = &self.positions {
            x = x + self.position_rows(positions, state.position, time);
        }
        let mut x = self.dropout.forward(x);
        for (block, layer) in self.blocks.iter().zip(state.layers.iter_mut()) {
            let (y, next) = block.forward(x, layer.take(), form, keep);
            x = y;
            *layer = next;
        }
        state.position += time;
        x
    }
}
