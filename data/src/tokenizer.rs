//! Tokenizers: `char` (the corpus's sorted characters, nanoGPT's shakespeare_char), `byte`
//! (256 values) and `gpt2` (tiktoken's r50k_base, whose ranks ship inside the crate).

use std::collections::{BTreeSet, HashMap};
use std::path::Path;

use serde::{Deserialize, Serialize};
use tiktoken_rs::CoreBPE;

use crate::DataError;

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum TokenizerKind {
    #[default]
    Char,
    Byte,
    Gpt2,
}

impl std::fmt::Display for TokenizerKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Char => "char",
            Self::Byte => "byte",
            Self::Gpt2 => "gpt2",
        })
    }
}

pub enum Tokenizer {
    Char {
        chars: Vec<char>,
        index: HashMap<char, u32>,
    },
    Byte,
    Gpt2(Box<CoreBPE>),
}

/// The saved form: the kind, and the characters of a `char` vocabulary.
#[derive(Serialize, Deserialize)]
struct Saved {
    kind: TokenizerKind,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    chars: Option<String>,
}

impl Tokenizer {
    /// A tokenizer of `kind`; a `char` vocabulary is built from `text`.
    pub fn build(kind: TokenizerKind, text: &str) -> Self {
        match kind {
            TokenizerKind::Char => {
                Self::from_chars(text.chars().collect::<BTreeSet<_>>().into_iter().collect())
            }
            TokenizerKind::Byte => Self::Byte,
            TokenizerKind::Gpt2 => Self::gpt2(),
        }
    }

    fn from_chars(chars: Vec<char>) -> Self {
        let index = chars
            .iter()
            .enumerate()
            .map(|(i, &c)| (c, i as u32))
            .collect();
        Self::Char { chars, index }
    }

    fn gpt2() -> Self {
        Self::Gpt2(Box::new(
            tiktoken_rs::r50k_base().expect("the r50k_base ranks ship with tiktoken-rs"),
        ))
    }

    pub fn kind(&self) -> TokenizerKind {
        match self {
            Self::Char { .. } => TokenizerKind::Char,
            Self::Byte => TokenizerKind::Byte,
            Self::Gpt2(_) => TokenizerKind::Gpt2,
        }
    }

    pub fn vocab_size(&self) -> usize {
        match self {
            Self::Char { chars, .. } => chars.len(),
            Self::Byte => 256,
            Self::Gpt2(_) => 50257,
        }
    }

    pub fn encode(&self, text: &str) -> Result<Vec<u32>, DataError> {
        match self {
            Self::Char { index, .. } => text
                .chars()
                .map(|c| index.get(&c).copied().ok_or(DataError::UnknownChar(c)))
                .collect(),
            Self::Byte => Ok(text.bytes().map(u32::from).collect()),
            Self::Gpt2(bpe) => Ok(bpe.encode_ordinary(text)),
        }
    }

    /// The text of `tokens`; byte sequences that are not UTF-8 decode lossily.
    pub fn decode(&self, tokens: &[u32]) -> Result<String, DataError> {
        let vocab = self.vocab_size();
        if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= vocab) {
            return Err(DataError::UnknownToken(bad));
        }
        Ok(match self {
            Self::Char { chars, .. } => tokens.iter().map(|&t| chars[t as usize]).collect(),
            Self::Byte => {
                String::from_utf8_lossy(&tokens.iter().map(|&t| t as u8).collect::<Vec<_>>())
                    .into_owned()
            }
            Self::Gpt2(bpe) => {
                let bytes = bpe
                    .decode_bytes(tokens)
                    .map_err(|_| DataError::UnknownToken(tokens[0]))?;
                String::from_utf8_lossy(&bytes).into_owned()
            }
        })
    }

    pub fn save(&self, path: &Path) -> Result<(), DataError> {
        let saved = Saved {
            kind: self.kind(),
            chars: match self {
                Self::Char { chars, .. } => Some(chars.iter().collect()),
                _ => None,
            },
        };
        let json = serde_json::to_string_pretty(&saved).expect("serialisable");
        std::fs::write(path, json).map_err(DataError::io(path))
    }

    pub fn load(path: &Path) -> Result<Self, DataError> {
        let text = std::fs::read_to_string(path).map_err(DataError::io(path))?;
        let corrupt = |reason: String| DataError::Corrupt {
            path: path.into(),
            reason,
        };
        let saved: Saved = serde_json::from_str(&text).map_err(|e| corrupt(e.to_string()))?;
        Ok(match (saved.kind, saved.chars) {
            (TokenizerKind::Char, Some(chars)) => Self::from_chars(chars.chars().collect()),
            (TokenizerKind::Char, None) => {
                return Err(corrupt("a char tokenizer without its characters".into()));
            }
            (TokenizerKind::Byte, _) => Self::Byte,
            (TokenizerKind::Gpt2, _) => Self::gpt2(),
        })
    }
}
