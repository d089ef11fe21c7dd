//! The results of an experiment: one row per finished run, read from its run directory
//! (`config.toml`, `metrics.json`, `metrics.csv`), written as results.md and results.csv.

mod mean;
mod table;

pub use mean::{Mean, Stat, means};

use std::path::Path;

use anyhow::{Context, Result};
use hla_data::config::Task;
use serde::Deserialize;

use crate::run::experiment::{Experiment, Metric, PlannedRun};
use crate::run::run_dir::{RunDir, write_atomic};

/// One finished run.
#[derive(Debug, Clone)]
pub struct Row {
    pub name: String,
    pub group: String,
    pub mean_group: String,
    pub mixer: String,
    pub d_model: usize,
    pub n_layers: usize,
    pub short_conv: usize,
    pub lr: f64,
    /// The context (text) or MQAR's sequence length T.
    pub seq_len: usize,
    /// MQAR's key-value pairs N (of the longest setting); `None` for text.
    pub kv_pairs: Option<usize>,
    pub params: usize,
    /// Recurrent state (KV cache for softmax) of all layers for one sequence of `seq_len`.
    pub state_floats: usize,
    pub steps: usize,
    pub wall_seconds: f64,
    pub tokens_per_second: f64,
    /// The full-pass validation at the end of training.
    pub final_loss: f64,
    pub final_accuracy: Option<f64>,
    /// The best of the validations during training (nanoGPT's estimate for text).
    pub best_loss: Option<f64>,
    pub best_accuracy: Option<f64>,
    /// nanoGPT's random-batch estimate at the end of training (text).
    pub estimate_loss: Option<f64>,
    /// The final validation's split into recall tokens and the rest (runs of an `hla`
    /// that records it).
    pub recall: Option<Recall>,
    /// Validation loss against step, from metrics.csv.
    pub curve: Vec<(usize, f64)>,
}

/// What `hla train` writes into metrics.json (the fields read here).
#[derive(Deserialize)]
struct Summary {
    mixer: String,
    parameters: usize,
    state_floats_per_layer: usize,
    state_floats_per_sequence: Option<usize>,
    steps: usize,
    wall_seconds: f64,
    tokens_per_second: f64,
    validation: Validation,
    random_batch_estimate: Option<Estimate>,
}

#[derive(Deserialize)]
struct Validation {
    loss: f64,
    accuracy: Option<f64>,
    recall: Option<Recall>,
}

/// The loss on tokens that complete a bigram seen earlier in their window, and on the
/// rest (`hla eval`'s recall split).
#[derive(Deserialize, Debug, Clone, Copy)]
pub struct Recall {
    pub hits: Part,
    pub other: Part,
}

#[derive(Deserialize, Debug, Clone, Copy)]
pub struct Part {
    pub loss: f64,
    pub tokens: usize,
}

#[derive(Deserialize)]
struct Estimate {
    loss: f64,
}

impl Row {
    /// The row of a finished run; `None` while `metrics.json` (written last) is missing.
    pub fn read(planned: &PlannedRun, dir: &Path) -> Result<Option<Self>> {
        let run = RunDir::new(dir);
        let Ok(text) = std::fs::read_to_string(run.metrics()) else {
            return Ok(None);
        };
        let summary: Summary = serde_json::from_str(&text)
            .with_context(|| format!("cannot read {}", run.metrics().display()))?;
        let config = run.load_config(&[])?;
        let csv = std::fs::read_to_string(dir.join("metrics.csv")).unwrap_or_default();
        let valid = |metric: &str| -> Vec<(usize, f64)> {
            csv.lines()
                .filter_map(|line| {
                    let [step, split, name, value] = line.split(',').collect::<Vec<_>>()[..] else {
                        return None;
                    };
                    (split == "valid" && name == metric)
                        .then(|| Some((step.parse().ok()?, value.parse().ok()?)))?
                })
                .collect()
        };
        let curve = valid("loss");
        let best = |values: &[(usize, f64)], better: fn(f64, f64) -> f64| {
            values.iter().map(|&(_, v)| v).reduce(better)
        };
        let mqar_setting = match config.data.task()? {
            Task::Text { .. } => None,
            Task::Mqar(m) => m.settings.iter().map(|s| (s.seq_len, s.num_kv_pairs)).max(),
        };
        Ok(Some(Self {
            name: planned.name.clone(),
            group: planned.group.clone(),
            mean_group: planned.mean_group.clone(),
            mixer: summary.mixer,
            d_model: config.model.d_model,
            n_layers: config.model.n_layers,
            short_conv: config.model.short_conv,
            lr: config.train.lr,
            seq_len: config.sequence_length()?,
            kv_pairs: mqar_setting.map(|(_, n)| n),
            params: summary.parameters,
            state_floats: summary
                .state_floats_per_sequence
                .unwrap_or(summary.state_floats_per_layer * config.model.n_layers),
            steps: summary.steps,
            wall_seconds: summary.wall_seconds,
            tokens_per_second: summary.tokens_per_second,
            final_loss: summary.validation.loss,
            final_accuracy: summary.validation.accuracy,
            best_loss: best(&curve, f64::min),
            // burn-train logs accuracy in percent.
            best_accuracy: best(&valid("accuracy"), f64::max).map(|a| a / 100.0),
            estimate_loss: summary.random_batch_estimate.map(|e| e.loss),
            recall: summary.validation.recall,
            curve,
        }))
    }

    pub fn metric(&self, metric: Metric) -> Option<f64> {
        match metric {
            Metric::Loss => Some(self.final_loss),
            Metric::Accuracy => self.final_accuracy,
        }
    }

    pub fn is_mqar(&self) -> bool {
        self.kv_pairs.is_some()
    }
}

impl Metric {
    /// Accuracy when every run is MQAR, else the loss.
    pub fn default_for(rows: &[Row]) -> Self {
        if !rows.is_empty() && rows.iter().all(Row::is_mqar) {
            Self::Accuracy
        } else {
            Self::Loss
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Loss => "final validation loss",
            Self::Accuracy => "final MQAR accuracy",
        }
    }

    /// Whether `a` beats `b`; a run without the metric loses.
    fn beats(self, a: Option<f64>, b: Option<f64>) -> bool {
        match (a, b, self) {
            (Some(a), Some(b), Self::Loss) => a < b,
            (Some(a), Some(b), Self::Accuracy) => a > b,
            (a, b, _) => a.is_some() && b.is_none(),
        }
    }
}

/// The best row of each group, in the order the groups first appear.
pub fn best_of_groups(rows: &[Row], metric: Metric) -> Vec<(Row, usize)> {
    let mut best: Vec<(Row, usize)> = Vec::new();
    for row in rows {
        match best.iter_mut().find(|(b, _)| b.group == row.group) {
            Some((b, count)) => {
                *count += 1;
                if metric.beats(row.metric(metric), b.metric(metric)) {
                    *b = row.clone();
                }
            }
            None => best.push((row.clone(), 1)),
        }
    }
    best
}

/// Writes results.md and results.csv into the experiment's folder.
pub fn write(experiment: &Experiment, rows: &[Row], metric: Metric) -> Result<()> {
    write_atomic(
        &experiment.dir.join("results.md"),
        table::markdown(experiment, rows, metric).as_bytes(),
    )?;
    write_atomic(
        &experiment.dir.join("results.csv"),
        table::csv(rows).as_bytes(),
    )
}

/// The rows of the experiment's finished runs, in its order.
pub fn rows(experiment: &Experiment) -> Result<Vec<Row>> {
    let mut rows = Vec::new();
    for planned in &experiment.runs {
        if let Some(row) = Row::read(planned, &experiment.run_dir(&planned.name))? {
            rows.push(row);
        }
    }
    Ok(rows)
}
