//! The experiment file of `hla compare`: a list of runs, each a config file plus `--set`
//! overrides, written out one by one or as grids.
//!
//! ```toml
//! title = "MQAR ladder"                  # heading of results.md (default: the folder name)
//! config = "../../configs/mqar-hla2.toml" # default config of every run and sweep
//! set = ["data.mqar.vocab_size=512"]      # overrides applied first to every run
//!
//! [results]
//! metric = "accuracy"   # "loss" or "accuracy" (default: accuracy when every run is MQAR)
//! best_of = ["lr"]      # axes optimised over in results.md: one row per combination of
//!                       # the other axes, the best run in it (results.csv keeps every run)
//! mean_over = ["seed"]  # axes averaged over: one row per combination of the other axes,
//!                       # mean ± sample standard deviation of its runs (charts: the means)
//!
//! [[run]]               # one run
//! name = "hla2-plain"
//! config = "../../configs/mqar-hla2.toml"  # relative to this file
//! set = ["model.short_conv=0"]
//!
//! [[sweep]]             # a grid: one run per combination of its axes' values
//! name = "mqar"         # prefix of its run names (optional)
//! set = ["train.steps=4000"]               # after the experiment's, before the axes'
//!
//! [[sweep.axis]]        # a config key and its values
//! key = "model.mixer"
//! values = ["softmax", "linear", "hla2", "ahla"]
//!
//! [[sweep.axis]]
//! name = "lr"           # default: the key's last part
//! key = "train.lr"
//! values = [3e-4, 1e-3, 3e-3]
//!
//! [[sweep.axis]]        # values that set several keys: a label and its overrides
//! name = "tn"
//! cases = [
//!   { label = "T64-N4", set = ["data.mqar.settings=[{ seq_len = 64, num_kv_pairs = 4, train_examples = 20000, test_examples = 1000 }]"] },
//!   { label = "T128-N8", set = ["data.mqar.settings=[{ seq_len = 128, num_kv_pairs = 8, train_examples = 20000, test_examples = 1000 }]"] },
//! ]
//! ```
//!
//! A sweep's run is named by its prefix and one label per axis, joined by `-`: a string
//! value is its own label, a number or boolean is prefixed by the axis name
//! (`mqar-softmax-lr0.001-T64-N4`). Names must be unique and use only letters, digits and
//! `._+-`: each is the folder `runs/<name>/` next to the experiment file.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use serde::Deserialize;

use crate::run::usage::UsageError;
use sweep::Sweep;

mod sweep;

#[derive(Deserialize, Debug, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct File {
    title: Option<String>,
    config: Option<PathBuf>,
    #[serde(default)]
    set: Vec<String>,
    #[serde(default)]
    results: Results,
    #[serde(default)]
    run: Vec<RunEntry>,
    #[serde(default)]
    sweep: Vec<Sweep>,
}

/// `[results]`: how results.md summarises the runs.
#[derive(Deserialize, Debug, Default, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Results {
    pub metric: Option<Metric>,
    #[serde(default)]
    pub best_of: Vec<String>,
    #[serde(default)]
    pub mean_over: Vec<String>,
}

/// The metric that ranks runs: the final full-pass validation loss (lower is better) or
/// MQAR accuracy (higher is better).
#[derive(Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Metric {
    Loss,
    Accuracy,
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
struct RunEntry {
    name: String,
    config: Option<PathBuf>,
    #[serde(default)]
    set: Vec<String>,
}

/// An experiment file, its runs written out.
#[derive(Debug)]
pub struct Experiment {
    /// The folder of the experiment file: results and `runs/` go there.
    pub dir: PathBuf,
    pub title: String,
    pub results: Results,
    pub runs: Vec<PlannedRun>,
}

/// One run of an experiment: its config file and overrides, in the order applied.
#[derive(Debug, Clone, PartialEq)]
pub struct PlannedRun {
    pub name: String,
    pub config: PathBuf,
    pub set: Vec<String>,
    /// The row of results.md this run competes for: its name without the labels of the
    /// `best_of` axes.
    pub group: String,
    /// The row of the means this run counts in: its name without the labels of the
    /// `mean_over` axes.
    pub mean_group: String,
}

impl Experiment {
    /// Reads and expands an experiment file; every mistake is a usage error naming it.
    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read the experiment file {}", path.display()))
            .map_err(UsageError::from)?;
        let dir = path.parent().unwrap_or(Path::new("")).to_path_buf();
        Self::parse(&text, &dir)
            .with_context(|| format!("in {}", path.display()))
            .map_err(|e| UsageError::from(e).into())
    }

    /// Parses `text`; config paths are relative to `dir`.
    pub fn parse(text: &str, dir: &Path) -> Result<Self> {
        let file: File =
            toml::from_str(text).map_err(|e| anyhow::anyhow!("{}", e.to_string().trim_end()))?;
        let mut runs = Vec::new();
        for entry in &file.run {
            let config = config_path(&entry.config, &file.config, dir, &entry.name)?;
            runs.push(PlannedRun {
                name: entry.name.clone(),
                config,
                set: [file.set.clone(), entry.set.clone()].concat(),
                group: entry.name.clone(),
                mean_group: entry.name.clone(),
            });
        }
        for sweep in &file.sweep {
            runs.extend(sweep.expand(&file, dir)?);
        }
        if runs.is_empty() {
            bail!("the experiment lists no runs: add [[run]] or [[sweep]] tables");
        }
        check_names(&runs)?;
        check_summary_axes(&file)?;
        let title = file.title.clone().unwrap_or_else(|| {
            dir.file_name()
                .map_or("experiment".into(), |n| n.to_string_lossy().into_owned())
        });
        Ok(Self {
            dir: dir.to_path_buf(),
            title,
            results: file.results,
            runs,
        })
    }

    /// The folder of a run.
    pub fn run_dir(&self, name: &str) -> PathBuf {
        self.dir.join("runs").join(name)
    }
}

pub(super) fn config_path(
    own: &Option<PathBuf>,
    default: &Option<PathBuf>,
    dir: &Path,
    name: &str,
) -> Result<PathBuf> {
    match own.as_ref().or(default.as_ref()) {
        Some(path) => Ok(dir.join(path)),
        None => bail!("{name:?} has no config, and the experiment sets no default `config`"),
    }
}

fn check_names(runs: &[PlannedRun]) -> Result<()> {
    let mut seen = BTreeSet::new();
    for run in runs {
        let allowed = |c: char| c.is_ascii_alphanumeric() || "._+-".contains(c);
        if run.name.starts_with('.') || !run.name.chars().all(allowed) {
            bail!(
                "the run name {:?} may use only letters, digits and ._+- (it names a folder)",
                run.name
            );
        }
        if !seen.insert(run.name.as_str()) {
            bail!(
                "two runs are named {:?}: give them different names or labels",
                run.name
            );
        }
    }
    Ok(())
}

/// `best_of` and `mean_over` name sweep axes, and no axis is in both.
fn check_summary_axes(file: &File) -> Result<()> {
    let results = &file.results;
    for (list, axes) in [
        ("best_of", &results.best_of),
        ("mean_over", &results.mean_over),
    ] {
        for wanted in axes {
            let known = file
                .sweep
                .iter()
                .flat_map(Sweep::axis_names)
                .any(|name| name == wanted);
            if !known {
                bail!("results.{list}: no sweep has an axis named {wanted:?}");
            }
        }
    }
    if let Some(both) = results
        .best_of
        .iter()
        .find(|a| results.mean_over.contains(a))
    {
        bail!("results: the axis {both:?} is in both best_of and mean_over");
    }
    Ok(())
}

#[cfg(test)]
mod tests;
