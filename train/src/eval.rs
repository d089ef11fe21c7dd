//! `hla eval`: validation loss, perplexity and (MQAR) accuracy over the whole validation
//! split, with the serial recurrence (default) or the chunked form.

use std::path::PathBuf;

use anyhow::Result;
use burn::data::dataloader::batcher::Batcher;
use burn::prelude::*;
use hla_data::batch::LmBatcher;
use hla_data::mqar;
use hla_data::windows::LmItem;
use hla_model::lm::{Lm, token_nll};
use serde::Serialize;

use crate::data::Data;
use crate::run_dir::RunDir;

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Token by token with the constant state (a KV cache for softmax).
    Recurrent,
    /// The chunk-parallel training form.
    Chunked,
}

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The run directory.
    #[arg(long)]
    run: PathBuf,
    #[arg(long, value_enum, default_value_t = Mode::Recurrent)]
    mode: Mode,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
    /// Compute device: flex, ndarray or wgpu (if compiled in).
    #[arg(long, default_value = crate::device::default_name())]
    device: String,
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

pub fn run(args: &Args) -> Result<()> {
    let device = crate::device::parse(&args.device)?;
    let run = RunDir::new(&args.run);
    let config = run.load_config(&[])?;
    let data = Data::load(&config)?;
    let lm = run.load_model(&config, data.vocab_size(), &device)?;
    let result = evaluate(
        &lm,
        &data.full_pass(&config)?,
        data.is_mqar(),
        args.mode,
        &device,
    );
    if args.json {
        println!("{}", serde_json::to_string_pretty(&result)?);
    } else {
        result.print();
    }
    Ok(())
}

/// Scores `items` (already in validation order) in batches.
pub fn evaluate(lm: &Lm, items: &[LmItem], mqar: bool, mode: Mode, device: &Device) -> Evaluation {
    const BATCH: usize = 64;
    let (mut nll_sum, mut tokens) = (0.0f64, 0usize);
    let mut per_example = Vec::new();
    for chunk in items.chunks(BATCH) {
        let batch = LmBatcher.batch(chunk.to_vec(), device);
        let logits = match mode {
            Mode::Chunked => lm.forward(batch.inputs.clone()),
            Mode::Recurrent => recurrent_logits(lm, batch.inputs.clone()),
        };
        let mask = batch.target_mask.clone().float();
        nll_sum += (token_nll(logits.clone(), batch.targets.clone()) * mask.clone())
            .sum()
            .into_scalar::<f32>() as f64;
        tokens += mask.sum().into_scalar::<f32>() as usize;
        if mqar {
            let width = batch.inputs.dims()[1];
            let hits = logits.argmax(2).squeeze_dim::<2>(2).equal(batch.targets);
            let hits: Vec<bool> = hits.into_data().try_to_vec().expect("bool data");
            let scored: Vec<bool> = batch
                .target_mask
                .into_data()
                .try_to_vec()
                .expect("bool data");
            for (h, m) in hits.chunks(width).zip(scored.chunks(width)) {
                if m.contains(&true) {
                    per_example.push(mqar::accuracy(h, m, width));
                }
            }
        }
    }
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

/// Logits of every position by the serial recurrence, one token at a time.
fn recurrent_logits(lm: &Lm, inputs: Tensor<2, Int>) -> Tensor<3> {
    let [batch, time] = inputs.dims();
    let mut state = lm.init_state(batch);
    let steps: Vec<Tensor<3>> = (0..time)
        .map(|t| {
            let token = inputs.clone().slice(s![.., t..=t]).squeeze_dim(1);
            lm.step(token, &mut state).unsqueeze_dim(1)
        })
        .collect();
    Tensor::cat(steps, 1)
}
