//! The language model as burn-train sees it: one batch in, loss and logits out.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use burn::prelude::*;
use burn::train::Interrupter;
use burn::train::{InferenceStep, SequenceOutput, TrainOutput, TrainStep};
use hla_data::batch::LmBatch;
use hla_model::lm::{Lm, token_nll};

#[derive(Module, Debug)]
pub struct Trainee {
    pub lm: Lm,
    #[module(skip)]
    pub guard: NanGuard,
    /// Scales each batch's loss before the backward pass: burn-train adds up the gradients
    /// of the batches of one optimiser step (accumulated, or one per device), so
    /// `1 / batches per step` makes their sum the mean over the step's examples.
    #[module(skip)]
    pub gradient_scale: f64,
}

/// Stops training at the first non-finite loss, naming the optimiser step.
#[derive(Clone, Default)]
pub struct NanGuard {
    interrupter: Option<Interrupter>,
    batches: Arc<AtomicUsize>,
    first_step: usize,
    batches_per_step: usize,
}

impl std::fmt::Debug for NanGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("NanGuard")
    }
}

impl NanGuard {
    /// A guard for a run that starts at `first_step` and computes `batches_per_step`
    /// batches per optimiser step (accumulated batches times devices).
    pub fn new(interrupter: Interrupter, first_step: usize, batches_per_step: usize) -> Self {
        Self {
            interrupter: Some(interrupter),
            batches: Arc::default(),
            first_step,
            batches_per_step,
        }
    }

    fn check(&self, loss: &Tensor<1>) {
        let Some(interrupter) = &self.interrupter else {
            return;
        };
        let batch = self.batches.fetch_add(1, Ordering::SeqCst);
        let value = loss.clone().into_scalar::<f32>();
        if !value.is_finite() {
            let step = self.first_step + batch / self.batches_per_step.max(1) + 1;
            interrupter.stop(Some(&format!("the loss became {value} at step {step}")));
        }
    }
}

impl Trainee {
    /// Chunked forward and the mean loss over the scored targets. Where only some are
    /// scored (MQAR) the logits are computed there alone, as a `[1, scored, vocab]`
    /// sequence; otherwise every position's, with unscored targets set to 0, the pad token
    /// of the accuracy metric (MQAR's filler, never a value).
    pub fn forward_batch(&self, batch: LmBatch) -> SequenceOutput {
        if let Some(at) = batch.scored {
            let [rows, time] = batch.targets.dims();
            let logits = self
                .lm
                .forward_at(batch.inputs, at.clone())
                .unsqueeze_dim(0);
            let targets = batch.targets.reshape([rows * time]).select(0, at);
            let targets: Tensor<2, Int> = targets.unsqueeze_dim(0);
            let loss = token_nll(logits.clone(), targets.clone()).mean();
            return SequenceOutput::new(loss, logits, None, targets);
        }
        let logits = self.lm.forward(batch.inputs);
        let (loss, _) = masked_mean_nll(
            logits.clone(),
            batch.targets.clone(),
            batch.target_mask.clone(),
        );
        let targets = batch.targets.mask_fill(batch.target_mask.bool_not(), 0);
        SequenceOutput::new(loss, logits, None, targets)
    }
}

/// The mean NLL over scored positions and their count.
pub fn masked_mean_nll(
    logits: Tensor<3>,
    targets: Tensor<2, Int>,
    mask: Tensor<2, Bool>,
) -> (Tensor<1>, usize) {
    let nll = token_nll(logits, targets);
    let weight = mask.float();
    let count = weight.clone().sum().into_scalar::<f32>() as usize;
    ((nll * weight).sum() / count.max(1) as f64, count)
}

impl TrainStep for Trainee {
    type Input = LmBatch;
    type Output = SequenceOutput;

    fn step(&self, batch: LmBatch) -> TrainOutput<SequenceOutput> {
        let output = self.forward_batch(batch);
        self.guard.check(&output.loss);
        // One batch per step: no scaling, so one device trains exactly as before.
        let grads = if self.gradient_scale == 1.0 {
            output.loss.backward()
        } else {
            (output.loss.clone() * self.gradient_scale).backward()
        };
        TrainOutput::new(self, grads, output)
    }
}

impl InferenceStep for Trainee {
    type Input = LmBatch;
    type Output = SequenceOutput;

    fn step(&self, batch: LmBatch) -> SequenceOutput {
        self.forward_batch(batch)
    }
}

#[cfg(test)]
mod tests {
    use burn::data::dataloader::batcher::Batcher;
    use hla_data::batch::LmBatcher;
    use hla_data::mqar::{MqarConfig, MqarSetting};
    use hla_model::lm::{LmConfig, MixerKind};

    use super::*;

    /// On MQAR (a few scored positions) the loss from the logits at the scored positions
    /// alone equals the masked mean over all positions' logits; the batch says where.
    #[test]
    fn scored_positions_give_the_masked_loss() {
        let device = Device::default();
        let task = MqarConfig {
            vocab_size: 64,
            settings: vec![MqarSetting {
                seq_len: 32,
                num_kv_pairs: 4,
                train_examples: 3,
                test_examples: 0,
            }],
            power_a: 0.01,
            random_non_queries: true,
            seed: 3,
        };
        let batch = LmBatcher.batch(task.train().unwrap(), &device);
        assert_eq!(batch.scored.as_ref().map(|at| at.dims()), Some([12]));
        let lm = LmConfig::new(64)
            .with_mixer(MixerKind::Hla2)
            .with_d_model(16)
            .with_n_heads(2)
            .with_n_layers(1)
            .init(&device);
        let all = masked_mean_nll(
            lm.forward(batch.inputs.clone()),
            batch.targets.clone(),
            batch.target_mask.clone(),
        )
        .0;
        let trainee = Trainee {
            lm,
            guard: NanGuard::default(),
            gradient_scale: 1.0,
        };
        let output = trainee.forward_batch(batch);
        let (a, b) = (all.into_scalar::<f32>(), output.loss.into_scalar::<f32>());
        assert!((a - b).abs() <= 1e-5 * a.abs(), "{a} vs {b}");
        assert_eq!(output.targets.dims(), [1, 12]);
    }
}
