//! The language model as burn-train sees it: one batch in, loss and logits out.

use burn::prelude::*;
use burn::train::{InferenceStep, SequenceOutput, TrainOutput, TrainStep};
use hla_data::batch::LmBatch;
use hla_model::lm::{Lm, token_nll};

#[derive(Module, Debug)]
pub struct Trainee {
    pub lm: Lm,
}

impl Trainee {
    /// Chunked forward and the mean loss over the scored targets. Unscored targets are
    /// set to 0, the pad token of the accuracy metric (MQAR's filler, never a value).
    fn forward_batch(&self, batch: LmBatch) -> SequenceOutput {
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
        TrainOutput::new(self, output.loss.backward(), output)
    }
}

impl InferenceStep for Trainee {
    type Input = LmBatch;
    type Output = SequenceOutput;

    fn step(&self, batch: LmBatch) -> SequenceOutput {
        self.forward_batch(batch)
    }
}
