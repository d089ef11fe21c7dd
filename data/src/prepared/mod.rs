//! A corpus tokenized once ([`prepare`]) into a folder of the preparation cache ([`folder`]):
//! a flat token file (u16 when the vocabulary fits, else u32, little-endian) with its
//! metadata and tokenizer, read back through a memory map so that corpora larger than
//! memory work. The training tokens come first, the validation tokens after them
//! ([`Split`]).

use std::ops::Range;
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use serde::{Deserialize, Serialize};

use crate::DataError;
use crate::tokenizer::{Tokenizer, TokenizerKind};

mod build;
mod key;
mod publish;
mod split;
mod stream;
mod write;

pub use build::{prepare, prepare_with};
pub use key::{Settings, folder};
pub use split::{HeldOut, Split, held_out};

const TOKENS_FILE: &str = "tokens.bin";
const META_FILE: &str = "meta.json";
const TOKENIZER_FILE: &str = "tokenizer.json";

/// What `meta.json` records about a prepared corpus.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct Meta {
    pub tokenizer: TokenizerKind,
    pub vocab_size: usize,
    /// The id between documents, when the corpus can hold several.
    pub end_of_text: Option<u32>,
    /// The corpus as the config names it: a file, a folder or a glob, or several.
    pub source: String,
    pub files: usize,
    /// The files read, each once, in order.
    #[serde(default)]
    pub read: Vec<ReadFile>,
    /// Paths of the corpus passed over (links to a file or folder read already), and why.
    #[serde(default)]
    pub skipped: Vec<SkippedPath>,
    pub documents: usize,
    /// The JSONL field or Parquet column read.
    pub text_field: String,
    /// Of the files' paths, sizes and modification times (see `Sources::fingerprint`).
    pub fingerprint: String,
    /// Of the documents' bytes in order (for one text file: the file's sha256).
    pub source_sha256: String,
    /// Bytes per token: 2 (u16) or 4 (u32).
    pub token_bytes: usize,
    pub tokens: usize,
    pub train_fraction: f64,
    pub split: Split,
    /// Of the documents split's draw.
    pub split_seed: u64,
    /// The documents a documents split holds out, in the corpus's order; `tokens.bin`
    /// holds them last.
    pub valid_documents: Vec<HeldOut>,
    pub train_tokens: usize,
    pub valid_tokens: usize,
    /// Bytes of text (end-of-text not counted) of each split.
    pub train_bytes: u64,
    pub valid_bytes: u64,
}

/// A file a preparation read: the path it was found at, its real path and its size.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct ReadFile {
    pub path: String,
    pub real: String,
    pub bytes: u64,
}

/// A path a preparation passed over, and why.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct SkippedPath {
    pub path: String,
    pub reason: String,
}

/// A prepared corpus: its metadata, tokenizer and memory-mapped tokens.
pub struct Prepared {
    pub dir: PathBuf,
    pub meta: Meta,
    pub tokenizer: Tokenizer,
    pub tokens: TokenFile,
}

impl Prepared {
    /// Token positions of the training split: the first `train_fraction` of the tokens, as
    /// nanoGPT, or of a documents split, the training documents.
    pub fn train_range(&self) -> Range<usize> {
        0..self.meta.train_tokens
    }

    /// Token positions of the validation split (the rest: the tail, or the held-out
    /// documents).
    pub fn valid_range(&self) -> Range<usize> {
        self.meta.train_tokens..self.meta.tokens
    }
}

/// Opens a prepared corpus.
pub fn open(dir: &Path) -> Result<Prepared, DataError> {
    let meta_path = dir.join(META_FILE);
    let text = std::fs::read_to_string(&meta_path).map_err(DataError::io(&meta_path))?;
    let meta: Meta = serde_json::from_str(&text).map_err(|e| DataError::Corrupt {
        path: meta_path.clone(),
        reason: e.to_string(),
    })?;
    let tokenizer = Tokenizer::load(&dir.join(TOKENIZER_FILE))?;
    let tokens = TokenFile::open(&dir.join(TOKENS_FILE), meta.token_bytes)?;
    if tokens.len() != meta.tokens {
        return Err(DataError::Corrupt {
            path: dir.join(TOKENS_FILE),
            reason: format!("{} tokens, the metadata says {}", tokens.len(), meta.tokens),
        });
    }
    Ok(Prepared {
        dir: dir.into(),
        meta,
        tokenizer,
        tokens,
    })
}

/// Tokens in a memory-mapped file.
pub struct TokenFile {
    map: Mmap,
    token_bytes: usize,
}

impl TokenFile {
    pub fn open(path: &Path, token_bytes: usize) -> Result<Self, DataError> {
        let file = std::fs::File::open(path).map_err(DataError::io(path))?;
        // SAFETY: the file is only read, and this project never writes a token file in
        // place: preparations are written into a temporary folder published by rename.
        let map = unsafe { Mmap::map(&file) }.map_err(DataError::io(path))?;
        if !matches!(token_bytes, 2 | 4) || map.len() % token_bytes != 0 {
            return Err(DataError::Corrupt {
                path: path.into(),
                reason: format!(
                    "{} bytes is not a whole number of {token_bytes}-byte tokens",
                    map.len()
                ),
            });
        }
        Ok(Self { map, token_bytes })
    }

    pub fn len(&self) -> usize {
        self.map.len() / self.token_bytes
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Tokens at `range`.
    pub fn read(&self, range: Range<usize>) -> Vec<u32> {
        let bytes = &self.map[range.start * self.token_bytes..range.end * self.token_bytes];
        match self.token_bytes {
            2 => bytes
                .chunks_exact(2)
                .map(|b| u32::from(u16::from_le_bytes([b[0], b[1]])))
                .collect(),
            _ => bytes
                .chunks_exact(4)
                .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
        }
    }
}
