//! The results of an experiment: one row per finished run, read from its run directory
//! (`config.toml`, `metrics.json`, `metrics.csv`), written as results.md and results.csv.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::{Context, Result};
use hla_data::config::Task;
use serde::Deserialize;

use crate::experiment::{Experiment, Metric, PlannedRun};
use crate::run_dir::{RunDir, write_atomic};

/// One finished run.
#[derive(Debug, Clone)]
pub struct Row {
    pub name: String,
    pub group: String,
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

/// A column of the tables: its header and how a row fills it (`None`: blank).
struct Column {
    header: &'static str,
    cell: fn(&Row) -> Option<String>,
}

fn columns(rows: &[Row]) -> Vec<Column> {
    let any = |f: fn(&Row) -> bool| rows.iter().any(f);
    let mut columns = vec![
        Column {
            header: "mixer",
            cell: |r| Some(r.mixer.clone()),
        },
        Column {
            header: "d_model",
            cell: |r| Some(r.d_model.to_string()),
        },
        Column {
            header: "T",
            cell: |r| Some(r.seq_len.to_string()),
        },
    ];
    if any(Row::is_mqar) {
        columns.push(Column {
            header: "N",
            cell: |r| r.kv_pairs.map(|n| n.to_string()),
        });
    }
    columns.extend([
        Column {
            header: "lr",
            cell: |r| Some(format!("{:e}", r.lr)),
        },
        Column {
            header: "params",
            cell: |r| Some(r.params.to_string()),
        },
        Column {
            header: "state floats",
            cell: |r| Some(r.state_floats.to_string()),
        },
        Column {
            header: "steps",
            cell: |r| Some(r.steps.to_string()),
        },
        Column {
            header: "wall (s)",
            cell: |r| Some(format!("{:.1}", r.wall_seconds)),
        },
        Column {
            header: "tokens/s",
            cell: |r| Some(format!("{:.0}", r.tokens_per_second)),
        },
        Column {
            header: "final loss",
            cell: |r| Some(format!("{:.4}", r.final_loss)),
        },
        Column {
            header: "best loss",
            cell: |r| r.best_loss.map(|v| format!("{v:.4}")),
        },
    ]);
    if any(|r| r.estimate_loss.is_some()) {
        columns.push(Column {
            header: "estimate loss",
            cell: |r| r.estimate_loss.map(|v| format!("{v:.4}")),
        });
    }
    if any(Row::is_mqar) {
        columns.extend([
            Column {
                header: "final acc",
                cell: |r| r.final_accuracy.map(|v| format!("{v:.4}")),
            },
            Column {
                header: "best acc",
                cell: |r| r.best_accuracy.map(|v| format!("{v:.4}")),
            },
        ]);
    }
    columns
}

fn markdown_table(out: &mut String, first: &[&str], rows: &[(Vec<String>, &Row)], all: &[Row]) {
    let columns = columns(all);
    let headers: Vec<&str> = first
        .iter()
        .copied()
        .chain(columns.iter().map(|c| c.header))
        .collect();
    let _ = writeln!(out, "| {} |", headers.join(" | "));
    let _ = writeln!(out, "|{}", "---|".repeat(headers.len()));
    for (lead, row) in rows {
        let cells: Vec<String> = lead
            .iter()
            .cloned()
            .chain(columns.iter().map(|c| (c.cell)(row).unwrap_or_default()))
            .collect();
        let _ = writeln!(out, "| {} |", cells.join(" | "));
    }
}

/// results.md: the best run of each group (with `best_of`), then every run.
pub fn markdown(experiment: &Experiment, rows: &[Row], metric: Metric) -> String {
    let mut out = format!("# {}\n\n", experiment.title);
    let _ = writeln!(
        out,
        "{} of {} runs finished. Loss: mean cross-entropy per scored token (nats); \
         final: the full pass over the validation split at the end of training; best: the \
         best validation during training{}; state floats: the recurrent state (softmax: KV \
         cache) of all layers for one sequence of T tokens. Every run: results.csv.\n",
        rows.len(),
        experiment.runs.len(),
        if rows.iter().any(|r| r.estimate_loss.is_some()) {
            " (nanoGPT's random-batch estimate); estimate: that estimate at the end"
        } else {
            ""
        },
    );
    let best_of = &experiment.results.best_of;
    if !best_of.is_empty() {
        let _ = writeln!(
            out,
            "## Best over {} (by {})\n",
            best_of.join(", "),
            metric.name()
        );
        let groups = best_of_groups(rows, metric);
        let best: Vec<(Vec<String>, &Row)> = groups
            .iter()
            .map(|(row, count)| {
                let lead = vec![row.group.clone(), format!("{} (of {count})", row.name)];
                (lead, row)
            })
            .collect();
        markdown_table(&mut out, &["group", "best run"], &best, rows);
        out.push('\n');
        out.push_str("## All runs\n\n");
    }
    let all: Vec<(Vec<String>, &Row)> = rows.iter().map(|r| (vec![r.name.clone()], r)).collect();
    markdown_table(&mut out, &["run"], &all, rows);
    out
}

/// results.csv: every finished run, every column.
pub fn csv(rows: &[Row]) -> String {
    let opt = |v: Option<f64>| v.map(|v| v.to_string()).unwrap_or_default();
    let mut out = String::from(
        "name,group,mixer,d_model,n_layers,short_conv,lr,seq_len,kv_pairs,params,state_floats,\
         steps,wall_seconds,tokens_per_second,final_loss,final_accuracy,best_loss,\
         best_accuracy,estimate_loss\n",
    );
    for r in rows {
        let _ = writeln!(
            out,
            "{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{}",
            r.name,
            r.group,
            r.mixer,
            r.d_model,
            r.n_layers,
            r.short_conv,
            r.lr,
            r.seq_len,
            r.kv_pairs.map(|n| n.to_string()).unwrap_or_default(),
            r.params,
            r.state_floats,
            r.steps,
            r.wall_seconds,
            r.tokens_per_second,
            r.final_loss,
            opt(r.final_accuracy),
            opt(r.best_loss),
            opt(r.best_accuracy),
            opt(r.estimate_loss),
        );
    }
    out
}

/// Writes results.md and results.csv into the experiment's folder.
pub fn write(experiment: &Experiment, rows: &[Row], metric: Metric) -> Result<()> {
    write_atomic(
        &experiment.dir.join("results.md"),
        markdown(experiment, rows, metric).as_bytes(),
    )?;
    write_atomic(&experiment.dir.join("results.csv"), csv(rows).as_bytes())
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
