//! The run configuration: one TOML file with `[model]`, `[data]` and `[train]` sections,
//! unknown keys rejected, `--set section.key=value` overrides, every value checked with a
//! message that names its key.

use std::path::Path;
use std::str::FromStr;

use anyhow::{Context, Result, bail};
use hla_data::config::{DataConfig, Task};
use hla_model::lm::{DecayKind, FeatureMap, LmConfig, MixerKind, MlpKind, NormKind, Positions};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RunConfig {
    #[serde(default)]
    pub model: ModelSection,
    pub data: DataConfig,
    #[serde(default)]
    pub train: TrainSection,
}

/// `[model]`: the language model (see `hla_model::lm::LmConfig`); the vocabulary size
/// comes from the data.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ModelSection {
    #[serde(with = "by_name")]
    pub mixer: MixerKind,
    pub d_model: usize,
    pub n_layers: usize,
    pub n_heads: usize,
    #[serde(with = "by_name_opt", skip_serializing_if = "Option::is_none")]
    pub feature_map: Option<FeatureMap>,
    #[serde(with = "by_name")]
    pub decay: DecayKind,
    pub decay_base: f64,
    pub short_conv: usize,
    pub output_norm: bool,
    pub output_gate: bool,
    pub shared_keys: bool,
    pub normalize: bool,
    pub chunk_size: usize,
    pub segment_size: usize,
    pub mlp: bool,
    #[serde(with = "by_name")]
    pub mlp_kind: MlpKind,
    pub d_ff: usize,
    #[serde(with = "by_name")]
    pub norm: NormKind,
    #[serde(with = "by_name")]
    pub positions: Positions,
    pub dropout: f64,
    pub tie_embeddings: bool,
    pub max_seq_len: usize,
    pub init_std: f64,
}

impl Default for ModelSection {
    fn default() -> Self {
        let c = LmConfig::new(0);
        Self {
            mixer: c.mixer,
            d_model: c.d_model,
            n_layers: c.n_layers,
            n_heads: c.n_heads,
            feature_map: c.feature_map,
            decay: c.decay,
            decay_base: c.decay_base,
            short_conv: c.short_conv,
            output_norm: c.output_norm,
            output_gate: c.output_gate,
            shared_keys: c.shared_keys,
            normalize: c.normalize,
            chunk_size: c.chunk_size,
            segment_size: c.segment_size,
            mlp: c.mlp,
            mlp_kind: c.mlp_kind,
            d_ff: c.d_ff,
            norm: c.norm,
            positions: c.positions,
            dropout: c.dropout,
            tie_embeddings: c.tie_embeddings,
            max_seq_len: c.max_seq_len,
            init_std: c.init_std,
        }
    }
}

impl ModelSection {
    pub fn lm_config(&self, vocab_size: usize) -> LmConfig {
        LmConfig {
            vocab_size,
            mixer: self.mixer,
            d_model: self.d_model,
            n_layers: self.n_layers,
            n_heads: self.n_heads,
            feature_map: self.feature_map,
            decay: self.decay,
            decay_base: self.decay_base,
            short_conv: self.short_conv,
            output_norm: self.output_norm,
            output_gate: self.output_gate,
            shared_keys: self.shared_keys,
            normalize: self.normalize,
            chunk_size: self.chunk_size,
            segment_size: self.segment_size,
            mlp: self.mlp,
            mlp_kind: self.mlp_kind,
            d_ff: self.d_ff,
            norm: self.norm,
            positions: self.positions,
            dropout: self.dropout,
            tie_embeddings: self.tie_embeddings,
            max_seq_len: self.max_seq_len,
            init_std: self.init_std,
        }
    }
}

/// `[train]`: optimisation, evaluation and checkpoints (defaults: nanoGPT's CPU run).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct TrainSection {
    /// Tokens per training window (text); MQAR uses its own lengths.
    pub context: usize,
    pub batch_size: usize,
    /// Optimiser steps.
    pub steps: usize,
    pub lr: f64,
    pub min_lr: f64,
    pub warmup_steps: usize,
    /// AdamW weight decay, applied to matrices only.
    pub weight_decay: f64,
    pub beta1: f64,
    pub beta2: f64,
    /// Gradient-norm clip; 0 turns it off.
    pub grad_clip: f64,
    pub grad_accumulation: usize,
    /// Steps between validations, each followed by a checkpoint.
    pub eval_interval: usize,
    /// Batches of nanoGPT's random-window validation estimate.
    pub eval_batches: usize,
    /// Checkpoints kept besides the best.
    pub keep_checkpoints: usize,
    /// Stop after this many validations without improvement; 0 never stops early.
    pub early_stopping: usize,
    pub seed: u64,
}

impl Default for TrainSection {
    fn default() -> Self {
        Self {
            context: 64,
            batch_size: 12,
            steps: 2000,
            lr: 1e-3,
            min_lr: 1e-4,
            warmup_steps: 100,
            weight_decay: 0.1,
            beta1: 0.9,
            beta2: 0.99,
            grad_clip: 1.0,
            grad_accumulation: 1,
            eval_interval: 250,
            eval_batches: 20,
            keep_checkpoints: 2,
            early_stopping: 0,
            seed: 1337,
        }
    }
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
            toml::from_str(text).map_err(|e| anyhow::anyhow!("{}", e.to_string().trim_end()))?
        } else {
            let mut table: toml::Table = toml::from_str(text)
                .map_err(|e| anyhow::anyhow!("{}", e.to_string().trim_end()))?;
            for assignment in overrides {
                set(&mut table, assignment)?;
            }
            toml::Value::Table(table)
                .try_into()
                .map_err(|e: toml::de::Error| {
                    anyhow::anyhow!("with the --set overrides: {}", e.message())
                })?
        };
        // Validation runs every eval_interval steps and at the end: a run shorter than
        // one interval validates at its end only.
        config.train.eval_interval = config.train.eval_interval.min(config.train.steps);
        config.validate()?;
        Ok(config)
    }

    /// Every check that does not need the data on disk.
    pub fn validate(&self) -> Result<()> {
        self.data.task()?;
        self.model
            .lm_config(1)
            .validate()
            .map_err(|e| anyhow::anyhow!("model.{e}"))?;
        let t = &self.train;
        let positive = |key: &str, value: f64| -> Result<()> {
            if !(value.is_finite() && value > 0.0) {
                bail!("train.{key} must be positive and finite, got {value}");
            }
            Ok(())
        };
        positive("lr", t.lr)?;
        if !(t.min_lr.is_finite() && (0.0..=t.lr).contains(&t.min_lr)) {
            bail!(
                "train.min_lr must be between 0 and train.lr, got {}",
                t.min_lr
            );
        }
        for (key, value) in [("beta1", t.beta1), ("beta2", t.beta2)] {
            if !(0.0..1.0).contains(&value) {
                bail!("train.{key} must be in [0, 1), got {value}");
            }
        }
        if !(t.weight_decay.is_finite() && t.weight_decay >= 0.0) {
            bail!("train.weight_decay must be ≥ 0, got {}", t.weight_decay);
        }
        if !(t.grad_clip.is_finite() && t.grad_clip >= 0.0) {
            bail!("train.grad_clip must be ≥ 0 (0: off), got {}", t.grad_clip);
        }
        for (key, value) in [
            ("context", t.context),
            ("batch_size", t.batch_size),
            ("steps", t.steps),
            ("grad_accumulation", t.grad_accumulation),
            ("eval_interval", t.eval_interval),
            ("eval_batches", t.eval_batches),
        ] {
            if value == 0 {
                bail!("train.{key} must be at least 1, got 0");
            }
        }
        if !t.steps.is_multiple_of(t.eval_interval) {
            bail!(
                "train.steps ({}) must be a multiple of train.eval_interval ({}): training runs \
                 in whole validation intervals",
                t.steps,
                t.eval_interval
            );
        }
        let longest = self.sequence_length()?;
        if let Some(limit) = self.model.lm_config(1).position_limit()
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

    pub fn to_toml(&self) -> String {
        toml::to_string_pretty(self).expect("the config serialises")
    }
}

/// A mistake in how the command was called or configured (exit status 2), as opposed to
/// a failure while running (exit status 1).
#[derive(Debug)]
pub struct UsageError(anyhow::Error);

impl From<anyhow::Error> for UsageError {
    fn from(error: anyhow::Error) -> Self {
        Self(error)
    }
}

impl std::fmt::Display for UsageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:#}", self.0)
    }
}

impl std::error::Error for UsageError {}

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

/// Config enums by their lowercase names.
trait Named: FromStr<Err = String> + Sized {
    fn config_name(&self) -> &'static str;
}

macro_rules! named {
    ($($ty:ty),+) => {
        $(impl Named for $ty {
            fn config_name(&self) -> &'static str {
                self.name()
            }
        })+
    };
}

named!(
    MixerKind, FeatureMap, DecayKind, MlpKind, NormKind, Positions
);

mod by_name {
    use super::*;

    pub fn serialize<S: Serializer, T: Named>(value: &T, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(value.config_name())
    }

    pub fn deserialize<'de, D: Deserializer<'de>, T: Named>(d: D) -> Result<T, D::Error> {
        String::deserialize(d)?
            .parse()
            .map_err(serde::de::Error::custom)
    }
}

mod by_name_opt {
    use super::*;

    pub fn serialize<S: Serializer, T: Named>(value: &Option<T>, s: S) -> Result<S::Ok, S::Error> {
        match value {
            Some(v) => s.serialize_str(v.config_name()),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>, T: Named>(d: D) -> Result<Option<T>, D::Error> {
        Some(
            String::deserialize(d)?
                .parse()
                .map_err(serde::de::Error::custom),
        )
        .transpose()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = "[model]\nmixer = \"hla3\"\n\n[data]\ncorpus = \"tinyshakespeare\"\n";

    #[test]
    fn defaults_fill_what_the_file_leaves_out() {
        let config = RunConfig::parse(FILE, &[]).unwrap();
        assert_eq!(config.model.mixer, MixerKind::Hla3);
        assert_eq!(config.model.d_model, 128);
        assert_eq!(config.train, TrainSection::default());
        let again = RunConfig::parse(&config.to_toml(), &[]).unwrap();
        assert_eq!(again, config, "the saved config reads back the same");
    }

    #[test]
    fn a_run_shorter_than_one_eval_interval_validates_at_its_end() {
        let config = RunConfig::parse(FILE, &["train.steps=40".into()]).unwrap();
        assert_eq!(config.train.eval_interval, 40);
        let sets = ["train.steps=600".into(), "train.eval_interval=250".into()];
        let err = RunConfig::parse(FILE, &sets).unwrap_err();
        assert!(format!("{err:#}").contains("multiple of"), "{err:#}");
    }

    #[test]
    fn overrides_are_typed() {
        let sets = [
            "model.mixer=linear",
            "train.lr=3e-4",
            "model.shared_keys=true",
            "data.tokenizer=byte",
        ];
        let config = RunConfig::parse(FILE, &sets.map(String::from)).unwrap();
        assert_eq!(config.model.mixer, MixerKind::Linear);
        assert_eq!(config.train.lr, 3e-4);
        assert!(config.model.shared_keys);
        let err = RunConfig::parse(FILE, &["train.steps=many".into()]).unwrap_err();
        assert!(format!("{err:#}").contains("invalid type"), "{err:#}");
    }

    #[test]
    fn mistakes_name_the_key_and_the_place() {
        let unknown = RunConfig::parse("[data]\ncorpus = \"x\"\nbatch = 3\n", &[])
            .unwrap_err()
            .to_string();
        assert!(
            unknown.contains("line 3") && unknown.contains("unknown field `batch`"),
            "{unknown}"
        );
        let mixer = RunConfig::parse("[model]\nmixer = \"mamba\"\n[data]\ncorpus = \"x\"\n", &[])
            .unwrap_err();
        assert!(
            mixer
                .to_string()
                .contains("\"mamba\" is not one of hla2, hla3, ahla, linear, softmax"),
            "{mixer}"
        );
        let missing = RunConfig::parse("[model]\n", &[]).unwrap_err().to_string();
        assert!(missing.contains("missing field `data`"), "{missing}");
        for (set, message) in [
            (
                "model.d_model=130",
                "model.n_heads must be a divisor of d_model",
            ),
            ("model.chunk_size=0", "model.chunk_size must be at least 1"),
            ("train.lr=-1", "train.lr must be positive and finite"),
            ("train.context=5000", "longer than model.max_seq_len"),
            (
                "model.decay_base=-1",
                "model.decay_base must be positive and finite",
            ),
            ("model.norm=\"batch\"", "\"batch\" is not one of rms, layer"),
        ] {
            let mut sets = vec![set.to_string()];
            if set.starts_with("train.context") {
                sets.push("model.mixer=softmax".into());
            }
            let err = RunConfig::parse(FILE, &sets).unwrap_err().to_string();
            assert!(err.contains(message), "{set}: {err}");
        }
        let learned = ["train.context=5000", "model.positions=\"learned\""].map(String::from);
        let err = RunConfig::parse(FILE, &learned).unwrap_err().to_string();
        assert!(
            err.contains("longer than model.max_seq_len (4096)"),
            "{err}"
        );
    }

    #[test]
    fn shipped_configs_are_valid() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs");
        let mut count = 0;
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            RunConfig::load(&path, &[]).unwrap_or_else(|e| panic!("{}: {e:#}", path.display()));
            count += 1;
        }
        assert!(count >= 9, "smoke, 5 shakespeare-char and 3 mqar configs");
    }
}
