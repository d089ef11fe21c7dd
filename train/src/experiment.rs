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

use crate::config::UsageError;

#[derive(Deserialize, Debug, Default)]
#[serde(deny_unknown_fields)]
struct File {
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

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
struct Sweep {
    #[serde(default)]
    name: String,
    config: Option<PathBuf>,
    #[serde(default)]
    set: Vec<String>,
    #[serde(default)]
    axis: Vec<Axis>,
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
struct Axis {
    name: Option<String>,
    key: Option<String>,
    values: Option<Vec<toml::Value>>,
    cases: Option<Vec<Case>>,
}

#[derive(Deserialize, Debug, Clone)]
#[serde(deny_unknown_fields)]
struct Case {
    label: String,
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
            });
        }
        for sweep in &file.sweep {
            runs.extend(sweep.expand(&file, dir)?);
        }
        if runs.is_empty() {
            bail!("the experiment lists no runs: add [[run]] or [[sweep]] tables");
        }
        check_names(&runs)?;
        check_best_of(&file)?;
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

fn config_path(
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

impl Sweep {
    fn label(&self) -> &str {
        if self.name.is_empty() {
            "a [[sweep]]"
        } else {
            &self.name
        }
    }

    fn expand(&self, file: &File, dir: &Path) -> Result<Vec<PlannedRun>> {
        let config = config_path(&self.config, &file.config, dir, self.label())?;
        if self.axis.is_empty() {
            bail!("sweep {:?} has no [[sweep.axis]]", self.label());
        }
        let axes: Vec<(String, Vec<Case>)> = self
            .axis
            .iter()
            .map(|axis| axis.cases(self.label()))
            .collect::<Result<_>>()?;
        let mut runs = vec![Vec::<(&str, &Case)>::new()];
        for (name, cases) in &axes {
            runs = runs
                .into_iter()
                .flat_map(|picked| {
                    cases.iter().map(move |case| {
                        let mut picked = picked.clone();
                        picked.push((name.as_str(), case));
                        picked
                    })
                })
                .collect();
        }
        Ok(runs
            .into_iter()
            .map(|picked| {
                let name_of = |keep: &dyn Fn(&str) -> bool| {
                    let labels = picked
                        .iter()
                        .filter(|(axis, _)| keep(axis))
                        .map(|(_, case)| case.label.as_str());
                    join_name(&self.name, labels)
                };
                let mut set = [file.set.clone(), self.set.clone()].concat();
                set.extend(picked.iter().flat_map(|(_, case)| case.set.clone()));
                PlannedRun {
                    name: name_of(&|_| true),
                    config: config.clone(),
                    set,
                    group: name_of(&|axis| !file.results.best_of.iter().any(|b| b == axis)),
                }
            })
            .collect())
    }
}

fn join_name<'a>(prefix: &'a str, labels: impl Iterator<Item = &'a str>) -> String {
    let parts: Vec<&str> = std::iter::once(prefix)
        .chain(labels)
        .filter(|p| !p.is_empty())
        .collect();
    if parts.is_empty() {
        "all".into()
    } else {
        parts.join("-")
    }
}

impl Axis {
    /// The axis' name and its values as labelled override lists.
    fn cases(&self, sweep: &str) -> Result<(String, Vec<Case>)> {
        match (&self.key, &self.values, &self.cases) {
            (Some(key), Some(values), None) => {
                let name = self
                    .name
                    .clone()
                    .unwrap_or_else(|| key.rsplit('.').next().unwrap_or(key).to_string());
                let cases = values
                    .iter()
                    .map(|value| Case {
                        label: value_label(&name, value),
                        set: vec![format!("{key}={value}")],
                    })
                    .collect();
                non_empty(sweep, name, cases)
            }
            (None, None, Some(cases)) => {
                let Some(name) = self.name.clone() else {
                    bail!("sweep {sweep:?}: an axis with `cases` needs a `name`");
                };
                non_empty(sweep, name, cases.clone())
            }
            _ => bail!(
                "sweep {sweep:?}: each axis has either `key` and `values`, or `name` and `cases`"
            ),
        }
    }
}

fn non_empty(sweep: &str, name: String, cases: Vec<Case>) -> Result<(String, Vec<Case>)> {
    if cases.is_empty() {
        bail!("sweep {sweep:?}: the axis {name:?} has no values");
    }
    Ok((name, cases))
}

/// A string is its own label; a number or boolean is prefixed by the axis name (`lr0.001`).
fn value_label(axis: &str, value: &toml::Value) -> String {
    match value {
        toml::Value::String(s) => s.clone(),
        other => format!("{axis}{other}"),
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

fn check_best_of(file: &File) -> Result<()> {
    for wanted in &file.results.best_of {
        let known = file.sweep.iter().flat_map(|s| &s.axis).any(|axis| {
            axis.name
                .as_deref()
                .or_else(|| axis.key.as_deref()?.rsplit('.').next())
                == Some(wanted.as_str())
        });
        if !known {
            bail!("results.best_of: no sweep has an axis named {wanted:?}");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Experiment> {
        Experiment::parse(text, Path::new("experiments/x"))
    }

    fn error(text: &str) -> String {
        format!("{:#}", parse(text).unwrap_err())
    }

    #[test]
    fn runs_and_sweeps_expand_in_order() {
        let experiment = parse(
            r#"
            config = "base.toml"
            set = ["train.steps=10"]
            [results]
            best_of = ["lr"]
            [[run]]
            name = "one"
            config = "other.toml"
            set = ["model.mixer=linear"]
            [[sweep]]
            name = "g"
            set = ["model.d_model=64"]
            [[sweep.axis]]
            key = "model.mixer"
            values = ["hla2", "ahla"]
            [[sweep.axis]]
            name = "lr"
            key = "train.lr"
            values = [1e-3, 0.01]
            [[sweep.axis]]
            name = "tn"
            cases = [{ label = "T64", set = ["a.b=1", "c.d=2"] }]
            "#,
        )
        .unwrap();
        assert_eq!(experiment.title, "x");
        let names: Vec<&str> = experiment.runs.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "one",
                "g-hla2-lr0.001-T64",
                "g-hla2-lr0.01-T64",
                "g-ahla-lr0.001-T64",
                "g-ahla-lr0.01-T64"
            ]
        );
        let first = &experiment.runs[0];
        assert_eq!(first.config, Path::new("experiments/x/other.toml"));
        assert_eq!(first.set, ["train.steps=10", "model.mixer=linear"]);
        assert_eq!(first.group, "one");
        let swept = &experiment.runs[2];
        assert_eq!(swept.config, Path::new("experiments/x/base.toml"));
        assert_eq!(
            swept.set,
            [
                "train.steps=10",
                "model.d_model=64",
                "model.mixer=\"hla2\"",
                "train.lr=0.01",
                "a.b=1",
                "c.d=2"
            ]
        );
        assert_eq!(
            swept.group, "g-hla2-T64",
            "the best_of axis leaves the group"
        );
        assert_eq!(experiment.runs[1].group, swept.group);
    }

    #[test]
    fn a_sweep_without_a_name_is_named_by_its_labels() {
        let experiment = parse(
            "config = \"c.toml\"\n[[sweep]]\n[[sweep.axis]]\nkey = \"model.short_conv\"\nvalues = [0, 4]\n",
        )
        .unwrap();
        let names: Vec<&str> = experiment.runs.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, ["short_conv0", "short_conv4"]);
    }

    #[test]
    fn mistakes_are_named() {
        for (text, message) in [
            (
                "[[run]]\nname = \"a\"\nconfg = \"c.toml\"\n",
                "unknown field `confg`",
            ),
            ("title = 3\n", "invalid type"),
            ("", "lists no runs"),
            ("[[run]]\nname = \"a\"\n", "\"a\" has no config"),
            (
                "config = \"c\"\n[[run]]\nname = \"a\"\n[[run]]\nname = \"a\"\n",
                "two runs are named \"a\"",
            ),
            (
                "config = \"c\"\n[[run]]\nname = \"a/b\"\n",
                "may use only letters",
            ),
            (
                "config = \"c\"\n[[sweep]]\nname = \"s\"\n",
                "has no [[sweep.axis]]",
            ),
            (
                "config = \"c\"\n[[sweep]]\nname = \"s\"\n[[sweep.axis]]\nkey = \"train.lr\"\n",
                "either `key` and `values`",
            ),
            (
                "config = \"c\"\n[[sweep]]\nname = \"s\"\n[[sweep.axis]]\ncases = []\n",
                "needs a `name`",
            ),
            (
                "config = \"c\"\n[[sweep]]\nname = \"s\"\n[[sweep.axis]]\nkey = \"a.b\"\nvalues = []\n",
                "has no values",
            ),
            (
                "config = \"c\"\n[results]\nbest_of = [\"lr\"]\n[[run]]\nname = \"a\"\n",
                "no sweep has an axis named \"lr\"",
            ),
            (
                "config = \"c\"\n[results]\nmetric = \"bleu\"\n[[run]]\nname = \"a\"\n",
                "unknown variant `bleu`",
            ),
        ] {
            let err = error(text);
            assert!(err.contains(message), "{text:?}: {err}");
        }
    }

    #[test]
    fn shipped_experiments_are_valid() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../experiments");
        let mut count = 0;
        for entry in std::fs::read_dir(dir).unwrap() {
            // Experiment folders hold an experiment.toml (bench/ and README.md do not).
            let path = entry.unwrap().path().join("experiment.toml");
            if !path.is_file() {
                continue;
            }
            let experiment =
                Experiment::load(&path).unwrap_or_else(|e| panic!("{}: {e:#}", path.display()));
            for run in &experiment.runs {
                crate::config::RunConfig::load(&run.config, &run.set)
                    .unwrap_or_else(|e| panic!("{}: {}: {e:#}", path.display(), run.name));
            }
            count += 1;
        }
        assert!(count >= 3, "shakespeare-char, mqar and mqar-long");
    }

    #[test]
    fn a_missing_file_is_a_usage_error() {
        let err = Experiment::load(Path::new("/no/such/experiment.toml")).unwrap_err();
        assert!(err.is::<UsageError>());
        assert!(err.to_string().contains("cannot read the experiment file"));
    }
}
