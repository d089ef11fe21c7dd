//! The `[data]` section of a run's config file.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::DataError;
use crate::corpus::{self, sources::Sources};
use crate::mqar::MqarConfig;
use crate::prepared::{self, Prepared, Settings, prepare_with};
use crate::tokenizer::TokenizerKind;

/// Either a text corpus (`corpus`, `tokenizer`, `train_fraction`) or the MQAR task
/// (`[data.mqar]`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct DataConfig {
    /// A named corpus (`tinyshakespeare`), a file, a folder or a glob of shards: `.txt`,
    /// `.jsonl` or `.parquet`, each optionally `.gz` or `.zst`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub corpus: Option<String>,
    /// `char`, `byte`, `gpt2` or `hf:PATH/tokenizer.json`.
    #[serde(default)]
    pub tokenizer: TokenizerKind,
    /// The field of a JSONL line, or the column of a Parquet file, that holds the text.
    #[serde(default = "default_text_field")]
    pub text_field: String,
    /// Fraction of the tokens, from the start, used for training (nanoGPT: 0.9).
    #[serde(default = "default_train_fraction")]
    pub train_fraction: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mqar: Option<MqarConfig>,
}

fn default_train_fraction() -> f64 {
    0.9
}

fn default_text_field() -> String {
    "text".into()
}

/// What the `[data]` section describes, checked.
pub enum Task<'a> {
    Text { corpus: &'a str },
    Mqar(&'a MqarConfig),
}

impl DataConfig {
    /// Checks every value; the error names the key.
    pub fn task(&self) -> Result<Task<'_>, DataError> {
        if !(self.train_fraction > 0.0 && self.train_fraction < 1.0) {
            return Err(DataError::Invalid {
                key: "data.train_fraction",
                requirement: "strictly between 0 and 1".into(),
                value: self.train_fraction.to_string(),
            });
        }
        match (&self.corpus, &self.mqar) {
            (Some(corpus), None) => Ok(Task::Text { corpus }),
            (None, Some(mqar)) => {
                mqar.validate()?;
                mqar.validate_splits()?;
                Ok(Task::Mqar(mqar))
            }
            (corpus, _) => Err(DataError::Invalid {
                key: "data.corpus",
                requirement: "given for a text task, or replaced by a [data.mqar] table".into(),
                value: if corpus.is_some() {
                    "both".into()
                } else {
                    "neither".into()
                },
            }),
        }
    }

    /// Resolves the corpus (named corpora from `data_dir`) and prepares it under
    /// `cache_dir` (re-using an earlier preparation of the same files and settings).
    /// Returns the prepared corpus and whether it was re-used.
    pub fn prepare_text(
        &self,
        corpus: &str,
        data_dir: &Path,
        cache_dir: &Path,
        force: bool,
    ) -> Result<(Prepared, bool), DataError> {
        let source: PathBuf = corpus::resolve(corpus, data_dir)?;
        let sources = Sources::find(&source)?;
        let settings = Settings {
            tokenizer: self.tokenizer.clone(),
            text_field: self.text_field.clone(),
            train_fraction: self.train_fraction,
        };
        let dir = prepared::folder(cache_dir, &source, &settings);
        prepare_with(&sources, &settings, &dir, force)
    }
}
