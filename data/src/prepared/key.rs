//! The key of a prepared folder: how a corpus is prepared ([`Settings`]) and the folder of
//! the preparation cache that one source and its settings get ([`folder`]).

use std::path::{Path, PathBuf};

use serde::Serialize;

use super::split::Split;
use crate::corpus;
use crate::tokenizer::TokenizerKind;

/// How a corpus is prepared.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    pub tokenizer: TokenizerKind,
    /// The JSONL field or Parquet column of the documents.
    pub text_field: String,
    pub train_fraction: f64,
    pub split: Split,
    /// Draws the documents a documents split holds out.
    pub split_seed: u64,
}

impl Default for Settings {
    /// The defaults of `[data]`.
    fn default() -> Self {
        Self {
            tokenizer: TokenizerKind::Char,
            text_field: "text".into(),
            train_fraction: 0.9,
            split: Split::Tail,
            split_seed: 0,
        }
    }
}

/// The folder of `sources` (one corpus, or several in order) prepared with `settings` under
/// `cache_dir`: the first source's name and the tokenizer's, readable, then a hash of the
/// sources' full paths and every setting (a Hugging Face tokenizer by its path and
/// contents), so that two corpora (`/x/big.jsonl`, `/y/big.jsonl`), two settings or an
/// edited tokenizer file never share a folder.
pub fn folder(cache_dir: &Path, sources: &[PathBuf], settings: &Settings) -> PathBuf {
    #[derive(Serialize)]
    struct Key<'a> {
        sources: Vec<PathBuf>,
        tokenizer: String,
        text_field: &'a str,
        train_fraction: f64,
        split: Split,
        split_seed: u64,
    }
    let tokenizer = match &settings.tokenizer {
        // A file that cannot be read keys by its path: loading it fails with its own message.
        TokenizerKind::Hf(path) => format!(
            "hf:{}:{}",
            full_path(path).display(),
            std::fs::read(path).map_or_else(|_| String::new(), |b| corpus::sha256(&b))
        ),
        other => other.to_string(),
    };
    let key = Key {
        sources: sources.iter().map(|s| full_path(s)).collect(),
        tokenizer,
        text_field: &settings.text_field,
        train_fraction: settings.train_fraction,
        split: settings.split,
        split_seed: settings.split_seed,
    };
    let hash = corpus::sha256(&serde_json::to_vec(&key).expect("serialisable"));
    let stem = sources
        .first()
        .and_then(|s| s.file_stem())
        .map_or("corpus".into(), |s| clean(&s.to_string_lossy()));
    let stem = match sources.len() {
        1 => stem,
        n => format!("{stem}+{}", n - 1),
    };
    let kind = match &settings.tokenizer {
        TokenizerKind::Hf(_) => "hf".to_string(),
        TokenizerKind::Bpe(n) => format!("bpe{n}"),
        other => other.to_string(),
    };
    cache_dir
        .join("prepared")
        .join(format!("{stem}-{kind}-{}", &hash[..16]))
}

/// `path` absolute, with symbolic links resolved where it exists (a glob pattern does not).
fn full_path(path: &Path) -> PathBuf {
    std::fs::canonicalize(path)
        .or_else(|_| std::path::absolute(path))
        // Only a missing working directory fails both; the path as given is then all there is.
        .unwrap_or_else(|_| path.to_path_buf())
}

/// `s` in letters, digits and `._-`.
fn clean(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "._-".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect()
}
