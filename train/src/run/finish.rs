//! The end of a run: the final weights, the validation by the recurrence, nanoGPT's
//! random-batch estimate, `metrics.csv` and `metrics.json` (written last: the run is done).

use std::path::PathBuf;

use anyhow::{Context, Result};
use burn::prelude::*;
use hla_model::lm::{Lm, MixerKind};

use super::config::RunConfig;
use super::data::Data;
use super::evaluate::{Mode, Report, evaluate};
use super::history::History;
use super::run_dir::{RunDir, write_atomic};

/// What training handed back.
pub struct Finished {
    pub lm: Lm,
    /// Training seconds (with the validations during training) of `steps_timed` steps.
    pub seconds: f64,
    /// Every step of the run, or this process's only when a resume lost the time before.
    pub steps_timed: usize,
    /// The segments the run trained in (as saved in `history.json`).
    pub history: History,
}

/// Writes the final weights of a run of `config` into `run`, validates them on `device`
/// (the main one), and writes the metrics files.
pub fn finish(
    config: &RunConfig,
    run: &RunDir,
    device: &Device,
    data: &Data,
    done: Finished,
) -> Result<()> {
    let lm = &done.lm;
    let t = &config.train;
    let weights = lm
        .clone()
        .into_record()
        .into_bytes()
        .context("cannot serialise the model")?;
    write_atomic(&run.model(), &weights)?;

    // The end-of-training validation uses the recurrence for stacks of HLA and linear
    // attention only.
    let mode = if config.model.has(MixerKind::Softmax) {
        Mode::Chunked
    } else {
        Mode::Recurrent
    };
    let items = data.full_pass(config)?;
    let label = format!("{mode:?} validation");
    let report = Report {
        mqar: data.is_mqar(),
        by_position: false,
    };
    let evaluation = evaluate(lm, &items, report, mode, device, &label);
    evaluation.print();
    let estimate = random_batch_estimate(lm, data, config, device)?;
    let seconds = done.seconds;
    let tokens = (done.steps_timed * t.grad_accumulation * t.batch_size) as f64
        * data.tokens_per_item(config);
    let context = config.sequence_length()?;
    let states = lm.state_sizes(context);
    let summary = serde_json::json!({
        "mixer": config.model.mixer_label(),
        "layers": config.model.mixers().iter().map(MixerKind::name).collect::<Vec<_>>(),
        "parameters": lm.num_params(),
        "context": context,
        "state_floats_per_layer": states.iter().max(),
        "state_floats_per_sequence": states.iter().sum::<usize>(),
        "steps": t.steps,
        "wall_seconds": seconds,
        "tokens_per_second": tokens / seconds,
        "validation": evaluation,
        "random_batch_estimate": estimate,
    });
    write_metrics_csv(run, &done.history)?;
    write_atomic(
        &run.metrics(),
        serde_json::to_string_pretty(&summary)?.as_bytes(),
    )?;
    println!(
        "{:.0} tokens/s; model and metrics in {}",
        tokens / seconds,
        run.path().display()
    );
    Ok(())
}

/// nanoGPT's validation estimate, the mean loss over `eval_batches` batches of random
/// windows (the windows of the validations during training), for text tasks.
fn random_batch_estimate(
    lm: &Lm,
    data: &Data,
    config: &RunConfig,
    device: &Device,
) -> Result<Option<serde_json::Value>> {
    let Some(items) = data.random_windows(config, config.train.seed.wrapping_add(1))? else {
        return Ok(None);
    };
    let label = "Random-batch estimate";
    let estimate = evaluate(lm, &items, Report::default(), Mode::Chunked, device, label);
    println!(
        "Random-batch estimate: loss {:.4}  ({} batches of random windows)",
        estimate.loss, config.train.eval_batches
    );
    Ok(Some(serde_json::json!({
        "loss": estimate.loss,
        "batches": config.train.eval_batches,
        "batch_size": config.train.batch_size,
    })))
}

/// `metrics.csv` (step, split, metric, value) from burn-train's per-epoch logs, whose last
/// line holds the epoch's aggregate: one row per metric and validation interval, at the
/// step the run's `history` gives the epoch.
fn write_metrics_csv(run: &RunDir, history: &History) -> Result<()> {
    let mut rows = vec!["step,split,metric,value".to_string()];
    for split in ["train", "valid"] {
        let Ok(epochs) = std::fs::read_dir(run.path().join(split)) else {
            continue;
        };
        let mut epochs: Vec<(usize, PathBuf)> = epochs
            .filter_map(|e| {
                let path = e.ok()?.path();
                let n = path
                    .file_name()?
                    .to_str()?
                    .strip_prefix("epoch-")?
                    .parse()
                    .ok()?;
                Some((n, path))
            })
            .collect();
        epochs.sort();
        for (epoch, dir) in epochs {
            let mut logs: Vec<PathBuf> = std::fs::read_dir(&dir)?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .collect();
            logs.sort();
            for log in logs {
                let metric = log
                    .file_stem()
                    .and_then(|s| s.to_str())
                    .unwrap_or_default()
                    .to_lowercase();
                let text = std::fs::read_to_string(&log)?;
                if let Some(value) = text.lines().rev().find_map(|l| l.strip_suffix(",final")) {
                    rows.push(format!(
                        "{},{split},{metric},{value}",
                        history.step_at(epoch)
                    ));
                }
            }
        }
    }
    let path = run.path().join("metrics.csv");
    write_atomic(&path, (rows.join("\n") + "\n").as_bytes())
}
