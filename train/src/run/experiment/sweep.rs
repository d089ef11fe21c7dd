//! `[[sweep]]`: a grid of runs, one per combination of its axes' values, and how each run
//! is named.

use std::path::{Path, PathBuf};

use anyhow::{Result, bail};
use serde::Deserialize;

use super::{File, PlannedRun, config_path};

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
pub(super) struct Sweep {
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

impl Sweep {
    /// The names of its axes, as `best_of` and `mean_over` refer to them.
    pub(super) fn axis_names(&self) -> impl Iterator<Item = &str> {
        self.axis.iter().filter_map(Axis::name)
    }

    fn label(&self) -> &str {
        if self.name.is_empty() {
            "a [[sweep]]"
        } else {
            &self.name
        }
    }

    pub(super) fn expand(&self, file: &File, dir: &Path) -> Result<Vec<PlannedRun>> {
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
                let without = |axes: &[String]| name_of(&|axis| !axes.iter().any(|a| a == axis));
                PlannedRun {
                    name: name_of(&|_| true),
                    config: config.clone(),
                    set,
                    group: without(&file.results.best_of),
                    mean_group: without(&file.results.mean_over),
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
    /// Its `name`, else the last part of its key.
    fn name(&self) -> Option<&str> {
        self.name
            .as_deref()
            .or_else(|| self.key.as_deref()?.rsplit('.').next())
    }

    /// The axis' name and its values as labelled override lists.
    fn cases(&self, sweep: &str) -> Result<(String, Vec<Case>)> {
        match (&self.key, &self.values, &self.cases) {
            (Some(key), Some(values), None) => {
                let name = self.name().unwrap_or(key).to_string();
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
