//! The `[data]` section of a run's config file.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::DataError;
use crate::corpus::{self, sources::Sources};
use crate::mqar::MqarConfig;
use crate::prepared::{self, Prepared, Settings, Split, prepare_with};
use crate::tokenizer::TokenizerKind;

/// Either a text corpus (`corpus`, `tokenizer`, `train_fraction`, `split`) or the MQAR
/// task (`[data.mqar]`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct DataConfig {
    /// A named corpus (`tinyshakespeare`, `sotu`, `gutenberg`), a file, a folder or a glob
    /// of shards: `.txt`, `.jsonl` or `.parquet`, each optionally `.gz` or `.zst`; or a
    /// list of them, whose documents follow one another.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub corpus: Option<Corpus>,
    /// `char`, `byte`, `gpt2`, `hf:PATH/tokenizer.json` or `bpe:N`.
    #[serde(default)]
    pub tokenizer: TokenizerKind,
    /// The field of a JSONL line, or the column of a Parquet file, that holds the text.
    #[serde(default = "default_text_field")]
    pub text_field: String,
    /// Fraction of the tokens (of the documents, for a documents split) used for training
    /// (nanoGPT: 0.9).
    #[serde(default = "default_train_fraction")]
    pub train_fraction: f64,
    /// `tail` (the last tokens validate) or `documents` (whole documents do).
    #[serde(default)]
    pub split: Split,
    /// Draws the documents that a documents split holds out.
    #[serde(default)]
    pub split_seed: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mqar: Option<MqarConfig>,
}

/// `data.corpus`: one corpus, or a list of them (written as a string when one).
#[derive(Clone, Debug, PartialEq)]
pub struct Corpus(pub Vec<String>);

impl std::fmt::Display for Corpus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0.as_slice() {
            [one] => f.write_str(one),
            many => write!(f, "[{}]", many.join(", ")),
        }
    }
}

impl Serialize for Corpus {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.0.as_slice() {
            [one] => s.serialize_str(one),
            many => many.serialize(s),
        }
    }
}

impl<'de> Deserialize<'de> for Corpus {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged, expecting = "a corpus name or path, or a list of them")]
        enum Form {
            One(String),
            Many(Vec<String>),
        }
        Ok(Self(match Form::deserialize(d)? {
            Form::One(one) => vec![one],
            Form::Many(many) => many,
        }))
    }
}

fn default_train_fraction() -> f64 {
    0.9
}

fn default_text_field() -> String {
    "text".into()
}

/// What the `[data]` section describes, checked.
pub enum Task<'a> {
    Text { corpus: &'a Corpus },
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
            (Some(corpus), None) if corpus.0.is_empty() => Err(DataError::Invalid {
                key: "data.corpus",
                requirement: "a corpus, or a list of one or more".into(),
                value: "[]".into(),
            }),
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
        corpus: &Corpus,
        data_dir: &Path,
        cache_dir: &Path,
        force: bool,
    ) -> Result<(Prepared, bool), DataError> {
        let paths: Vec<PathBuf> = corpus
            .0
            .iter()
            .map(|c| corpus::resolve(c, data_dir))
            .collect::<Result<_, _>>()?;
        let sources = Sources::find_all(&paths)?;
        let settings = Settings {
            tokenizer: self.tokenizer.clone(),
            text_field: self.text_field.clone(),
            train_fraction: self.train_fraction,
            split: self.split,
            split_seed: self.split_seed,
        };
        let dir = prepared::folder(cache_dir, &paths, &settings);
        prepare_with(&sources, &settings, &dir, force)
    }
}
