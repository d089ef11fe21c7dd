//! The run configuration: one TOML file with `[model]`, `[data]` and `[train]` sections,
//! unknown keys rejected, `--set section.key=value` overrides, every value checked with a
//! message that names its key.

use std::path::Path;

use anyhow::{Context, Result, bail};
use hla_data::config::{DataConfig, Task};
use hla_model::lm::{FeatureMap, LmConfig, MixerKind};
use serde::{Deserialize, Serialize};

use super::usage::UsageError;

mod train;

pub use train::{Form, Strategy, TrainSection};

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RunConfig {
    /// `[model]`: the language model in its config-file form (`LmConfig::deserialize`);
    /// `vocab_size` stays 0 here, it comes from the data ([`RunConfig::lm_config`]).
    #[serde(with = "LmConfig", default)]
    pub model: LmConfig,
    pub data: DataConfig,
    #[serde(default)]
    pub train: TrainSection,
}

impl RunConfig {
    /// Reads `path`, applies the `section.key=value` overrides, and checks every value.
    pub fn load(path: &Path, overrides: &[String]) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read the config file {}", path.display()))
            .map_err(UsageError::from)?;
        Self::parse(&text, overrides)
            .with_context(|| format!("in {}", path.display()))
            .map_err(|e| UsageError::from(e).into())
    }

    pub fn parse(text: &str, overrides: &[String]) -> Result<Self> {
        // Without overrides the file is read directly, so errors carry its line and column.
        let mut config: Self = if overrides.is_empty() {
            toml::from_str(text)
                .map_err(|e| anyhow::anyhow!("{}", plain(e.to_string().trim_end())))?
        } else {
            let mut table: toml::Table = toml::from_str(text)
                .map_err(|e| anyhow::anyhow!("{}", plain(e.to_string().trim_end())))?;
            for assignment in overrides {
                set(&mut table, assignment)?;
            }
            // A table has no lines to point at: the error names the key instead.
            serde_path_to_error::deserialize(toml::Value::Table(table)).map_err(|e| {
                let message = plain(e.inner().message());
                match e.path().iter().next() {
                    Some(_) => anyhow::anyhow!("{}: {message}", e.path()),
                    None => anyhow::anyhow!("with the --set overrides: {message}"),
                }
            })?
        };
        // Validation runs every eval_interval steps and at the end: a run shorter than
        // one interval validates at its end only.
        config.train.eval_interval = config.train.eval_interval.min(config.train.steps);
        resolve_defaults(&mut config.model);
        config.validate()?;
        Ok(config)
    }

    /// Every check that does not need the data on disk.
    pub fn validate(&self) -> Result<()> {
        self.data.task()?;
        self.lm_config(1)
            .validate()
            .map_err(|e| anyhow::anyhow!("model.{e}"))?;
        self.train.validate()?;
        let longest = self.sequence_length()?;
        if let Some(limit) = self.model.position_limit()
            && longest > limit
        {
            bail!(
                "the context ({longest} tokens) is longer than model.max_seq_len ({limit}) of this \
                 model (softmax attention's RoPE table or learned positions)",
            );
        }
        Ok(())
    }

    /// The length of the longest sequence the model sees: the context (text) or the
    /// longest MQAR setting.
    pub fn sequence_length(&self) -> Result<usize> {
        Ok(match self.data.task()? {
            Task::Text { .. } => self.train.context,
            Task::Mqar(m) => m.settings.iter().map(|s| s.seq_len).max().unwrap_or(0),
        })
    }

    /// The model of this config with a vocabulary of `vocab_size` tokens.
    pub fn lm_config(&self, vocab_size: usize) -> LmConfig {
        LmConfig {
            vocab_size,
            ..self.model.clone()
        }
    }

    pub fn to_toml(&self) -> String {
        toml::to_string_pretty(self).expect("the config serialises")
    }

    /// This config with `train.devices` set from the command line (`--device` or
    /// `--devices`), checked again (the batch must split evenly between the devices).
    pub fn with_devices(mut self, device: Option<&str>, devices: &[String]) -> Result<Self> {
        let names = match device {
            Some(device) => vec![device.to_string()],
            None => devices.to_vec(),
        };
        if !names.is_empty() {
            self.train.devices = names;
            self.validate().map_err(UsageError::from)?;
        }
        Ok(self)
    }
}

/// Writes out the mixer's defaults of the keys whose default depends on the mixer
/// (`feature_map`, `normalize`, `output_norm`), so that a recorded run says what it
/// trained whatever later defaults become; softmax attention uses none of them and keeps
/// its feature map unset. In a hybrid stack, the defaults of its HLA and linear-attention
/// layers: the feature map only where they agree on it (linear attention's and HLA's
/// differ without the denominator), else each layer keeps its own.
fn resolve_defaults(model: &mut LmConfig) {
    let recurrent: Vec<LmConfig> = model
        .mixers()
        .into_iter()
        .filter(|kind| *kind != MixerKind::Softmax)
        .map(|kind| model.for_mixer(kind))
        .collect();
    let layer = recurrent.first().unwrap_or(&*model);
    let (normalize, output_norm) = (layer.resolved_normalize(), layer.resolved_output_norm());
    let maps: Vec<FeatureMap> = recurrent
        .iter()
        .map(LmConfig::resolved_feature_map)
        .collect();
    let feature_map = maps.first().filter(|map| maps.iter().all(|m| m == *map));
    if let Some(map) = feature_map {
        model.feature_map = Some(*map);
    }
    model.normalize = Some(normalize);
    model.output_norm = Some(output_norm);
}

/// serde's message for a value that is not a size, in words.
fn plain(message: &str) -> String {
    message
        .replace("expected usize", "expected a whole number ≥ 0")
        .replace("expected u64", "expected a whole number ≥ 0")
}

/// Applies `section.key=value`; the value is read as TOML (`3`, `1e-3`, `true`, `"x"`), or
/// as a string when it is not valid TOML.
fn set(table: &mut toml::Table, assignment: &str) -> Result<()> {
    let Some((path, raw)) = assignment.split_once('=') else {
        bail!("--set {assignment:?}: expected section.key=value");
    };
    let keys: Vec<&str> = path.trim().split('.').collect();
    let value = match toml::from_str::<toml::Table>(&format!("v = {raw}")) {
        Ok(mut t) => t.remove("v").expect("parsed"),
        Err(_) => toml::Value::String(raw.trim().to_string()),
    };
    let (last, sections) = keys.split_last().expect("split yields one item");
    let mut at = table;
    for section in sections {
        at = at
            .entry(section.to_string())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()))
            .as_table_mut()
            .with_context(|| format!("--set {path}: {section} is not a section"))?;
    }
    at.insert(last.to_string(), value);
    Ok(())
}

#[cfg(test)]
mod tests;
