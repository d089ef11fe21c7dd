//! The data crate's error type, [`DataError`].

use std::path::PathBuf;

/// Everything that can go wrong with data; each says what to do about it.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    /// The cause is part of the message rather than its `source()`, which a printed chain
    /// (anyhow's `{:#}`) would show a second time.
    #[error("{path}: {error}")]
    Io {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("{0}: no such file or directory")]
    MissingPath(PathBuf),
    #[error("the corpus {0} is empty")]
    EmptyCorpus(String),
    #[error("{path} is not valid UTF-8 (byte {offset}); use the byte tokenizer for binary data")]
    InvalidUtf8 { path: PathBuf, offset: usize },
    #[error(
        "the {split} split has {got} tokens, fewer than the {needed} one window needs (context + 1)"
    )]
    TooShort {
        split: &'static str,
        needed: usize,
        got: usize,
    },
    #[error("the character {0:?} is not in the vocabulary of this model")]
    UnknownChar(char),
    #[error("token {0} is outside the vocabulary")]
    UnknownToken(u32),
    #[error(
        "the corpus {name} is not in {dir} and could not be fetched ({reason}); \
         put the file there as {file}, or set HLA_DATA_DIR to the folder that holds it"
    )]
    Unavailable {
        name: String,
        dir: PathBuf,
        file: String,
        reason: String,
    },
    #[error("{what} has sha256 {got}, expected {expected}")]
    Checksum {
        what: String,
        expected: String,
        got: String,
    },
    #[error("{path}: {reason}")]
    Corrupt { path: PathBuf, reason: String },
    /// A bad line of a JSONL file or row of a Parquet file (counted from 1).
    #[error("{path}:{line}: {reason}")]
    Record {
        path: PathBuf,
        line: usize,
        reason: String,
    },
    #[error("the tokenizer failed: {0}")]
    Tokenize(String),
    #[error("{key} must be {requirement}, got {value}")]
    Invalid {
        key: &'static str,
        requirement: String,
        value: String,
    },
}

impl DataError {
    pub(crate) fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> Self {
        let path = path.into();
        move |error| Self::Io { path, error }
    }
}
