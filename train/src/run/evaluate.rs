//! Scoring a model over a validation set: loss, perplexity and (MQAR) accuracy, with the
//! serial recurrence or the chunked form.

use burn::data::dataloader::batcher::Batcher;
use burn::prelude::*;
use hla_data::batch::{LmBatch, LmBatcher};
use hla_data::mqar;
use hla_data::windows::LmItem;
use hla_model::lm::Lm;
use serde::Serialize;

use super::progress::Progress;

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Token by token with the constant state (a KV cache for softmax).
    Recurrent,
    /// The chunk-parallel training form.
    Chunked,
}

#[derive(Serialize, Debug, Clone, Copy)]
pub struct Evaluation {
    pub mode: Mode,
    /// Mean cross-entropy per scored token (nats).
    pub loss: f64,
    pub perplexity: f64,
    /// MQAR: exact-match accuracy per example, averaged.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub accuracy: Option<f64>,
    pub tokens: usize,
}

impl Evaluation {
    pub fn print(&self) {
        print!(
            "{:?} validation: loss {:.4}  perplexity {:.3}",
            self.mode, self.loss, self.perplexity
        );
        if let Some(accuracy) = self.accuracy {
            print!("  accuracy {accuracy:.4}");
        }
        println!("  ({} tokens)", self.tokens);
    }
}

/// Windows scored at once by the recurrence: its steps are serial, so every window of a
/// validation split of modest size goes in one batch (a step's work grows with the batch,
/// its overhead does not).
const RECURRENT_BATCH: usize = 256;
/// Windows per batch of the chunked form.
const CHUNKED_BATCH: usize = 64;

/// Scores `items` (already in validation order) in batches, showing progress on stderr
/// under `label`: each batch's rows go through the head's scoring, which on CPU devices
/// keeps no `[rows, vocab]` logits.
pub fn evaluate(
    lm: &Lm,
    items: &[LmItem],
    mqar: bool,
    mode: Mode,
    device: &Device,
    label: &str,
) -> Evaluation {
    let batch_size = match mode {
        Mode::Recurrent => RECURRENT_BATCH,
        Mode::Chunked => CHUNKED_BATCH,
    };
    let total = items.iter().map(|item| item.inputs.len()).sum();
    let mut progress = Progress::new(label, total, "tokens");
    let (mut nll_sum, mut tokens) = (0.0f64, 0usize);
    let mut per_example = Vec::new();
    for chunk in items.chunks(batch_size) {
        let batch = LmBatcher.batch(chunk.to_vec(), device);
        let [rows, time] = batch.inputs.dims();
        let scores = match mode {
            Mode::Chunked => {
                let x = lm.rows(batch.inputs.clone(), None);
                progress.advance(chunk.iter().map(|item| item.inputs.len()).sum());
                let scores = lm.scores(x, batch.targets.clone().reshape([rows * time]));
                (
                    scores.nll.reshape([rows, time]),
                    scores.hits.reshape([rows, time]),
                )
            }
            Mode::Recurrent => recurrent_scores(lm, &batch, &mut progress),
        };
        let (nll, hits) = scores;
        let mask = batch.target_mask.clone();
        nll_sum += (nll * mask.clone().float()).sum().into_scalar::<f32>() as f64;
        let scored = bools(mask);
        tokens += scored.iter().filter(|&&m| m).count();
        if mqar {
            let hits = bools(hits);
            for (h, m) in hits.chunks(time).zip(scored.chunks(time)) {
                if m.contains(&true) {
                    per_example.push(mqar::accuracy(h, m, time));
                }
            }
        }
    }
    progress.finish();
    let accuracy = mqar.then(|| per_example.iter().sum::<f64>() / per_example.len().max(1) as f64);
    let loss = nll_sum / tokens.max(1) as f64;
    Evaluation {
        mode,
        loss,
        perplexity: loss.exp(),
        accuracy,
        tokens,
    }
}

/// Most rows of the blocks' output kept before the head scores them (in floats): the
/// head runs fastest on many rows at once, the rows cost memory.
const ROWS_HELD: usize = 1 << 24;

/// A bool tensor's values, whatever the device stores a bool as (ndarray and flex a byte,
/// wgpu a `u32`).
fn bools(t: Tensor<2, Bool>) -> Vec<bool> {
    t.into_data().iter::<bool>().collect()
}

/// Each target's negative log-likelihood and hit `[batch, time]` by the serial recurrence,
/// one token of every window at a time; the head scores the rows of several steps at once
/// (no logits kept).
fn recurrent_scores(
    lm: &Lm,
    batch: &LmBatch,
    progress: &mut Progress,
) -> (Tensor<2>, Tensor<2, Bool>) {
    let [rows, time] = batch.inputs.dims();
    let mut state = lm.init_state(rows);
    let column = |x: &Tensor<2, Int>, t: usize| x.clone().slice(s![.., t..=t]).squeeze_dim(1);
    let (mut nll, mut hits) = (Vec::new(), Vec::new());
    let mut held: Vec<Tensor<2>> = Vec::new();
    let mut first = 0;
    for t in 0..time {
        let x = lm.step_rows(column(&batch.inputs, t), &mut state);
        let group = (ROWS_HELD / x.dims()[1].max(1) / rows.max(1)).max(1);
        held.push(x);
        progress.advance(rows);
        if held.len() == group || t + 1 == time {
            // Rows step-major: step `first + s` of window `r` is row `s · rows + r`.
            let steps = held.len();
            let x = Tensor::cat(std::mem::take(&mut held), 0);
            let targets = batch.targets.clone().slice(s![.., first..first + steps]);
            let targets = targets.swap_dims(0, 1).reshape([steps * rows]);
            let scores = lm.scores(x, targets);
            nll.push(scores.nll.reshape([steps, rows]).swap_dims(0, 1));
            hits.push(scores.hits.reshape([steps, rows]).swap_dims(0, 1));
            first += steps;
        }
    }
    (Tensor::cat(nll, 1), Tensor::cat(hits, 1))
}
