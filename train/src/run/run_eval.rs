//! The evaluation of a finished run as `hla eval` and `hla compare --by-position` do it:
//! its model over its whole validation split, in windows of the training context or another,
//! and the loss-by-position chart.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use anyhow::{Context as _, Result};
use burn::prelude::*;
use hla_model::lm::Positions;

use super::config::RunConfig;
use super::data::Data;
use super::evaluate::{Evaluation, Mode, Report, evaluate};
use super::plots::{self, Series, YScale};
use super::run_dir::{RunDir, write_atomic};
use super::usage::usage;

/// How a run is evaluated.
#[derive(Clone, Copy, Debug)]
pub struct Options {
    pub mode: Mode,
    /// Tokens per window; `None`: the training context.
    pub context: Option<usize>,
    pub by_position: bool,
}

/// `run`'s evaluation with `options` on `device`, and the window length it used.
pub fn evaluate_run(
    run: &RunDir,
    options: Options,
    device: &Device,
) -> Result<(Evaluation, usize)> {
    let mut config = run.load_config(&[])?;
    let data = Data::load(&config)?;
    let context = window(&mut config, &data, options.context)?;
    let lm = run.load_model(&config, data.vocab_size(), device)?;
    let label = format!("{:?} validation", options.mode);
    let report = Report {
        mqar: data.is_mqar(),
        by_position: options.by_position,
    };
    let items = data.full_pass_at(context)?;
    Ok((
        evaluate(&lm, &items, report, options.mode, device, &label),
        context,
    ))
}

/// `run`'s evaluation by position as `hla compare --by-position` keeps it, with the window
/// length: stored in the run's folder as `by-position-<context>-<mode>.json`, which is
/// committed with the run's results where its weights are not, so that a study trained on
/// several machines charts every run. The stored one is read back unless the weights here
/// are newer; otherwise the run is evaluated and the result stored. `None`: this machine
/// has neither the run's weights nor its stored evaluation.
pub fn kept_by_position(
    run: &RunDir,
    options: Options,
    device: &Device,
) -> Result<Option<(Evaluation, usize)>> {
    let config = run.load_config(&[])?;
    let context = options.context.unwrap_or(config.train.context);
    let mode = format!("{:?}", options.mode).to_lowercase();
    let kept = run
        .path()
        .join(format!("by-position-{context}-{mode}.json"));
    let modified = |path: &Path| -> Option<SystemTime> { path.metadata().ok()?.modified().ok() };
    let model = run.model();
    let current = match (modified(&kept), modified(&model)) {
        (Some(stored), Some(weights)) => stored >= weights,
        (stored, _) => stored.is_some(),
    };
    if current {
        let text = std::fs::read_to_string(&kept)
            .with_context(|| format!("cannot read {}", kept.display()))?;
        let evaluation = serde_json::from_str(&text)
            .with_context(|| format!("{} is not an evaluation", kept.display()))?;
        return Ok(Some((evaluation, context)));
    }
    if !model.exists() {
        return Ok(None);
    }
    let options = Options {
        context: Some(context),
        by_position: true,
        ..options
    };
    let (evaluation, context) = evaluate_run(run, options, device)?;
    write_atomic(&kept, serde_json::to_string_pretty(&evaluation)?.as_bytes())?;
    Ok(Some((evaluation, context)))
}

/// The window length of the evaluation, `context` when given: past the model's
/// `max_seq_len` RoPE's table is extended (it holds no weights), learned positions refuse.
fn window(config: &mut RunConfig, data: &Data, context: Option<usize>) -> Result<usize> {
    let Some(context) = context else {
        return Ok(config.train.context);
    };
    if data.is_mqar() {
        return Err(usage(
            "--context is for text runs: MQAR's sequences have the lengths of [data.mqar]",
        ));
    }
    if context == 0 {
        return Err(usage("--context must be at least 1"));
    }
    let model = &mut config.model;
    if context > model.max_seq_len {
        if model.positions == Positions::Learned {
            return Err(usage(format!(
                "--context {context} is past the model's {} learned positions \
                 (model.max_seq_len); evaluate at {} tokens or fewer",
                model.max_seq_len, model.max_seq_len
            )));
        }
        model.max_seq_len = context;
    }
    Ok(context)
}

/// `evaluation`'s loss by position as a line named `name`, each bucket at its geometric
/// middle.
pub fn by_position_series(name: &str, evaluation: &Evaluation) -> Series {
    let buckets = evaluation.by_position.as_deref().unwrap_or_default();
    Series {
        name: name.to_string(),
        points: buckets
            .iter()
            .map(|b| (((b.first * b.last) as f64).sqrt(), b.loss))
            .collect(),
    }
}

/// The loss against position of each series, as `<name>.png` and `<name>.svg` in `dir`.
pub fn by_position_chart(
    dir: &Path,
    name: &str,
    context: usize,
    series: &[Series],
) -> Result<Vec<PathBuf>> {
    plots::log_x(
        dir,
        name,
        &format!("Validation loss by position, windows of {context} tokens"),
        ("position in the window (log)", "loss (nats)"),
        series,
        YScale::Linear,
    )
}
