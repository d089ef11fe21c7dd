//! Scoring a model over a validation set: loss, perplexity and (MQAR) accuracy, with the
//! serial recurrence or the chunked form.

use std::collections::HashSet;

use burn::data::dataloader::batcher::Batcher;
use burn::prelude::*;
use hla_data::batch::{LmBatch, LmBatcher};
use hla_data::mqar;
use hla_data::windows::LmItem;
use hla_model::lm::Lm;
use serde::{Deserialize, Serialize};

use super::progress::Progress;

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Token by token with the constant state (a KV cache for softmax).
    Recurrent,
    /// The chunk-parallel training form.
    Chunked,
}

#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct Evaluation {
    pub mode: Mode,
    /// Mean cross-entropy per scored token (nats).
    pub loss: f64,
    pub perplexity: f64,
    /// MQAR: exact-match accuracy per example, averaged.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub accuracy: Option<f64>,
    pub tokens: usize,
    /// The loss on the tokens that complete a bigram seen earlier in their window, and on
    /// the rest.
    pub recall: Recall,
    /// The loss by position in the window, in buckets of powers of two, when asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub by_position: Option<Vec<Bucket>>,
}

/// The loss of a set of scored tokens.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq)]
pub struct Part {
    /// Mean cross-entropy (nats); 0 without tokens.
    pub loss: f64,
    pub tokens: usize,
}

/// Zoology's split of the loss (arXiv 2312.04927 §3): `hits` are the tokens that complete
/// a bigram (input token, next token) that occurred earlier in the same window, the
/// associative-recall tokens; `other` the rest.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq)]
pub struct Recall {
    pub hits: Part,
    pub other: Part,
}

/// The loss of the tokens at positions `first..=last` of their window (the first target
/// of a window, predicted from one token, is at position 1).
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq)]
pub struct Bucket {
    pub first: usize,
    pub last: usize,
    pub loss: f64,
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
        let Recall { hits, other } = self.recall;
        println!(
            "  recall tokens: loss {:.4} ({} tokens); other tokens: loss {:.4} ({} tokens)",
            hits.loss, hits.tokens, other.loss, other.tokens
        );
        if let Some(buckets) = &self.by_position {
            println!("  {:>15}  {:>8}  {:>10}", "positions", "loss", "tokens");
            for b in buckets {
                let range = format!("{}-{}", b.first, b.last);
                println!("  {range:>15}  {:>8.4}  {:>10}", b.loss, b.tokens);
            }
        }
    }
}

/// Sums of the negative log-likelihood of scored tokens, split by recall and by position.
#[derive(Default)]
struct Tally {
    hits: (f64, usize),
    other: (f64, usize),
    /// Bucket `k` holds positions `2^k ..= 2^(k+1) - 1`.
    buckets: Vec<(f64, usize)>,
    longest: usize,
}

impl Tally {
    /// Adds the scored tokens of `item`, whose negative log-likelihoods are `nll`.
    fn add(&mut self, item: &LmItem, nll: &[f32]) {
        let mut seen = HashSet::new();
        self.longest = self.longest.max(item.inputs.len());
        for (t, (&input, &target)) in item.inputs.iter().zip(&item.targets).enumerate() {
            // Every bigram counts as seen, scored or not.
            let recall = !seen.insert((input, target));
            if !item.mask[t] {
                continue;
            }
            let x = f64::from(nll[t]);
            let part = if recall {
                &mut self.hits
            } else {
                &mut self.other
            };
            *part = (part.0 + x, part.1 + 1);
            let k = (t + 1).ilog2() as usize;
            if self.buckets.len() <= k {
                self.buckets.resize(k + 1, (0.0, 0));
            }
            let bucket = &mut self.buckets[k];
            *bucket = (bucket.0 + x, bucket.1 + 1);
        }
    }

    fn part((sum, tokens): (f64, usize)) -> Part {
        Part {
            loss: if tokens == 0 {
                0.0
            } else {
                sum / tokens as f64
            },
            tokens,
        }
    }

    fn total(&self) -> (f64, usize) {
        (self.hits.0 + self.other.0, self.hits.1 + self.other.1)
    }

    fn recall(&self) -> Recall {
        Recall {
            hits: Self::part(self.hits),
            other: Self::part(self.other),
        }
    }

    fn by_position(&self) -> Vec<Bucket> {
        self.buckets
            .iter()
            .enumerate()
            .filter(|(_, (_, tokens))| *tokens > 0)
            .map(|(k, &sums)| {
                let Part { loss, tokens } = Self::part(sums);
                Bucket {
                    first: 1 << k,
                    last: ((1 << (k + 1)) - 1).min(self.longest),
                    loss,
                    tokens,
                }
            })
            .collect()
    }
}

/// Windows scored at once by the recurrence: its steps are serial, so every window of a
/// validation split of modest size goes in one batch (a step's work grows with the batch,
/// its overhead does not).
const RECURRENT_BATCH: usize = 256;
/// Windows per batch of the chunked form.
const CHUNKED_BATCH: usize = 64;

/// What [`evaluate`] reports besides the loss.
#[derive(Clone, Copy, Debug, Default)]
pub struct Report {
    /// MQAR's accuracy per example.
    pub mqar: bool,
    /// The loss by position.
    pub by_position: bool,
}

/// Scores `items` (already in validation order) in batches, showing progress on stderr
/// under `label`: each batch's rows go through the head's scoring, which on CPU devices
/// keeps no `[rows, vocab]` logits.
pub fn evaluate(
    lm: &Lm,
    items: &[LmItem],
    report: Report,
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
    let mut tally = Tally::default();
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
        let nll: Vec<f32> = nll.into_data().iter::<f32>().collect();
        for (item, nll) in chunk.iter().zip(nll.chunks(time)) {
            tally.add(item, nll);
        }
        if report.mqar {
            let scored = bools(batch.target_mask.clone());
            let hits = bools(hits);
            for (h, m) in hits.chunks(time).zip(scored.chunks(time)) {
                if m.contains(&true) {
                    per_example.push(mqar::accuracy(h, m, time));
                }
            }
        }
    }
    progress.finish();
    let accuracy = report
        .mqar
        .then(|| per_example.iter().sum::<f64>() / per_example.len().max(1) as f64);
    let (sum, tokens) = tally.total();
    let loss = sum / tokens.max(1) as f64;
    Evaluation {
        mode,
        loss,
        perplexity: loss.exp(),
        accuracy,
        tokens,
        recall: tally.recall(),
        by_position: report.by_position.then(|| tally.by_position()),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn item(tokens: &[u32]) -> LmItem {
        let n = tokens.len() - 1;
        LmItem {
            inputs: tokens[..n].to_vec(),
            targets: tokens[1..].to_vec(),
            mask: vec![true; n],
        }
    }

    #[test]
    fn recall_tokens_complete_a_bigram_seen_earlier_in_the_window() {
        // a b a b c a b: the bigram (a, b) completes again at positions 3 and 6.
        let (a, b, c) = (1, 2, 3);
        let window = item(&[a, b, a, b, c, a, b]);
        let nll = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
        let mut tally = Tally::default();
        tally.add(&window, &nll);
        let recall = tally.recall();
        assert_eq!(
            recall.hits,
            Part {
                loss: 4.5,
                tokens: 2
            }
        );
        assert_eq!(
            recall.other,
            Part {
                loss: 3.0,
                tokens: 4
            }
        );
        // A second window starts with nothing seen.
        tally.add(&item(&[a, b]), &[10.0]);
        assert_eq!(tally.recall().hits.tokens, 2);
        assert_eq!(tally.total(), (31.0, 7));
    }

    #[test]
    fn positions_fall_in_buckets_of_powers_of_two() {
        let mut tally = Tally::default();
        let mut window = item(&[5, 6, 7, 8, 9, 10]);
        window.mask[1] = false; // an unscored position counts nowhere
        tally.add(&window, &[1.0, 100.0, 3.0, 5.0, 7.0]);
        let buckets: Vec<(usize, usize, f64, usize)> = tally
            .by_position()
            .iter()
            .map(|b| (b.first, b.last, b.loss, b.tokens))
            .collect();
        assert_eq!(buckets, [(1, 1, 1.0, 1), (2, 3, 3.0, 1), (4, 5, 6.0, 2)]);
    }
}
