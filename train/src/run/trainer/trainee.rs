//! The language model as burn-train sees it: one batch in, loss and logits out.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use burn::lr_scheduler::module_lr_scheduler::ModuleLearningRate;
use burn::optim::{GradientsParams, ModuleOptimizer};
use burn::prelude::*;
use burn::tensor::ExecutionError;
use burn::train::metric::{Adaptor, ItemLazy, LossInput};
use burn::train::{InferenceStep, Interrupter, TrainOutput, TrainStep};
use hla_data::batch::LmBatch;
use hla_model::lm::Lm;

use super::metrics::TokenCounts;

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
    /// The limit of the global gradient norm (`train.clip = "global"`), clipped once per
    /// optimiser step on the step's summed gradient, so that accumulation and several
    /// devices clip as one device does.
    #[module(skip)]
    pub global_clip: Option<f64>,
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

/// What a batch gives burn-train: the loss and the counts of the metrics, no logits.
pub struct LmOutput {
    /// `[1]`: the mean negative log-likelihood of the scored tokens.
    pub loss: Tensor<1>,
    /// `[1]`: how many scored tokens the model predicted (no gradient).
    pub hits: Tensor<1>,
    /// Scored tokens.
    pub tokens: usize,
}

impl ItemLazy for LmOutput {
    fn sync(self) -> Result<Self, ExecutionError> {
        self.loss.device().flush()?;
        Ok(Self {
            loss: self.loss.without_autodiff(),
            hits: self.hits.without_autodiff(),
            tokens: self.tokens,
        })
    }
}

impl Adaptor<LossInput> for LmOutput {
    fn adapt(&self) -> LossInput {
        LossInput::new(self.loss.clone())
    }
}

impl Adaptor<TokenCounts> for LmOutput {
    fn adapt(&self) -> TokenCounts {
        TokenCounts {
            loss: self.loss.clone(),
            hits: self.hits.clone(),
            tokens: self.tokens,
        }
    }
}

impl Trainee {
    /// Chunked forward and the mean loss over the scored targets, by the fused head on
    /// CPU devices: the head runs at the scored positions only (all of them for text, a
    /// few per example for MQAR).
    pub fn forward_batch(&self, batch: LmBatch) -> LmOutput {
        let [rows, time] = batch.targets.dims();
        let targets = batch.targets.reshape([rows * time]);
        let targets = match &batch.scored {
            Some(at) => targets.select(0, at.clone()),
            None => targets,
        };
        let x = self.lm.rows(batch.inputs, batch.scored);
        let head = self.lm.head_loss(x, targets);
        LmOutput {
            loss: head.loss,
            hits: head.hits,
            tokens: head.rows,
        }
    }
}

impl TrainStep for Trainee {
    type Input = LmBatch;
    type Output = LmOutput;

    fn step(&self, batch: LmBatch) -> TrainOutput<LmOutput> {
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

    /// burn-train calls this with the step's final gradient (the accumulated batches, the
    /// devices' shares added up on the main device, or all-reduced by DDP).
    fn optimize(
        self,
        optim: &mut ModuleOptimizer,
        lr: ModuleLearningRate,
        mut grads: GradientsParams,
    ) -> Self {
        if let Some(max_norm) = self.global_clip {
            hla_model::optim::clip_global_norm(&self, &mut grads, max_norm);
        }
        optim.step(lr, self, grads)
    }
}

impl InferenceStep for Trainee {
    type Input = LmBatch;
    type Output = LmOutput;

    fn step(&self, batch: LmBatch) -> LmOutput {
        self.forward_batch(batch)
    }
}

#[cfg(test)]
mod tests {
    use burn::data::dataloader::batcher::Batcher;
    use hla_data::batch::LmBatcher;
    use hla_data::mqar::{MqarConfig, MqarSetting};
    use hla_model::lm::{LmConfig, MixerKind, token_nll};

    use super::*;

    /// On MQAR (a few scored positions) the loss and hits from the head at the scored
    /// positions alone equal the masked mean and count over all positions' logits; the
    /// batch says where.
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
        let logits = lm.forward(batch.inputs.clone());
        let mask = batch.target_mask.clone().float();
        let nll = token_nll(logits.clone(), batch.targets.clone()) * mask.clone();
        let all = nll.sum() / 12.0;
        let hits = logits
            .argmax(2)
            .squeeze_dim::<2>(2)
            .equal(batch.targets.clone());
        let all_hits = (hits.float() * mask).sum().into_scalar::<f32>();
        let trainee = Trainee {
            lm,
            guard: NanGuard::default(),
            gradient_scale: 1.0,
            global_clip: None,
        };
        let output = trainee.forward_batch(batch);
        let (a, b) = (all.into_scalar::<f32>(), output.loss.into_scalar::<f32>());
        assert!((a - b).abs() <= 1e-5 * a.abs(), "{a} vs {b}");
        assert_eq!(output.tokens, 12);
        assert_eq!(output.hits.into_scalar::<f32>(), all_hits);
    }
}
