//! Tokenizers: `char` (the corpus's sorted characters, nanoGPT's shakespeare_char), `byte`
//! (256 values), `gpt2` (tiktoken's r50k_base, whose ranks ship inside the crate) and
//! `hf:PATH` (any Hugging Face `tokenizer.json`, through the `tokenizers` crate) and `bpe:N`
//! (a byte-level BPE of N entries trained on the corpus with that crate's trainer, [`bpe`]).
//!
//! Documents are separated by an end-of-text token: GPT-2's `<|endoftext|>`, the Hugging
//! Face tokenizer's own (the first of [`END_OF_TEXT_NAMES`] it has), and for `char` and
//! `byte` one extra id after the others, present when the corpus can hold several documents;
//! a trained BPE has `<|endoftext|>` as id 0.

mod bpe;

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use tiktoken_rs::CoreBPE;

use crate::DataError;

/// How end-of-text is written when decoded, and the names looked for in a Hugging Face
/// vocabulary, in order.
pub const END_OF_TEXT_NAMES: [&str; 5] = [
    "<|endoftext|>",
    "<|end_of_text|>",
    "</s>",
    "<eos>",
    "<|eos|>",
];

/// GPT-2's `<|endoftext|>`.
const GPT2_END_OF_TEXT: u32 = 50256;

/// The smallest vocabulary of `bpe:N`: the 256 bytes and end-of-text.
pub const BPE_MIN_VOCAB: usize = 257;

/// The tokenizer a config asks for: `char`, `byte`, `gpt2`, `hf:PATH` or `bpe:N`.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub enum TokenizerKind {
    #[default]
    Char,
    Byte,
    Gpt2,
    /// A Hugging Face `tokenizer.json`.
    Hf(PathBuf),
    /// A byte-level BPE of this many entries, trained on the corpus's training split.
    Bpe(usize),
}

impl std::fmt::Display for TokenizerKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Char => f.write_str("char"),
            Self::Byte => f.write_str("byte"),
            Self::Gpt2 => f.write_str("gpt2"),
            Self::Hf(path) => write!(f, "hf:{}", path.display()),
            Self::Bpe(n) => write!(f, "bpe:{n}"),
        }
    }
}

impl std::str::FromStr for TokenizerKind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "char" => Ok(Self::Char),
            "byte" => Ok(Self::Byte),
            "gpt2" => Ok(Self::Gpt2),
            _ => {
                if let Some(n) = s.strip_prefix("bpe:") {
                    return match n.parse() {
                        Ok(n) if n >= BPE_MIN_VOCAB => Ok(Self::Bpe(n)),
                        _ => Err(format!(
                            "{s:?} is not a BPE to train: bpe:N with N a whole number ≥ \
                             {BPE_MIN_VOCAB} (the 256 bytes and end-of-text)"
                        )),
                    };
                }
                match s.strip_prefix("hf:") {
                    Some(path) if !path.is_empty() => Ok(Self::Hf(path.into())),
                    _ => Err(format!(
                        "{s:?} is not a tokenizer: char, byte, gpt2, hf:PATH/tokenizer.json \
                         or bpe:N"
                    )),
                }
            }
        }
    }
}

impl Serialize for TokenizerKind {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

impl<'de> Deserialize<'de> for TokenizerKind {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?
            .parse()
            .map_err(serde::de::Error::custom)
    }
}

pub enum Tokenizer {
    Char {
        chars: Vec<char>,
        index: HashMap<char, u32>,
        end_of_text: bool,
    },
    Byte {
        end_of_text: bool,
    },
    Gpt2(Box<CoreBPE>),
    Hf {
        inner: Box<tokenizers::Tokenizer>,
        /// The `tokenizer.json` it was read from, saved with runs.
        json: serde_json::Value,
        end_of_text: Option<u32>,
    },
}

/// The saved form: the kind, the characters of a `char` vocabulary, whether `char` and
/// `byte` have an end-of-text id, a Hugging Face tokenizer whole.
#[derive(Serialize, Deserialize)]
struct Saved {
    kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    chars: Option<String>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    end_of_text: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    hf: Option<serde_json::Value>,
}

impl Tokenizer {
    /// A tokenizer of `kind` for a single document: a `char` vocabulary is built from
    /// `text`, a BPE trained on it.
    pub fn build(kind: &TokenizerKind, text: &str) -> Result<Self, DataError> {
        match kind {
            TokenizerKind::Bpe(n) => Self::train_bpe(*n, std::iter::once(text.to_string())),
            _ => Self::new(kind, text.chars().collect(), false),
        }
    }

    /// A byte-level BPE of at most `vocab_size` entries (fewer when `texts` have no more
    /// pairs to merge) trained on `texts`, `<|endoftext|>` its id 0: the same texts give
    /// the same tokenizer, byte for byte.
    pub fn train_bpe(
        vocab_size: usize,
        texts: impl Iterator<Item = String> + Send,
    ) -> Result<Self, DataError> {
        Self::from_hf(bpe::train(vocab_size, texts)?)
    }

    /// A tokenizer of `kind`; `chars`: the characters of a `char` vocabulary;
    /// `end_of_text`: whether `char` and `byte` get an end-of-text id. A BPE is trained
    /// ([`Tokenizer::train_bpe`]), not made here.
    pub fn new(
        kind: &TokenizerKind,
        chars: BTreeSet<char>,
        end_of_text: bool,
    ) -> Result<Self, DataError> {
        Ok(match kind {
            TokenizerKind::Char => Self::from_chars(chars.into_iter().collect(), end_of_text),
            TokenizerKind::Byte => Self::Byte { end_of_text },
            TokenizerKind::Gpt2 => Self::gpt2(),
            TokenizerKind::Hf(path) => {
                let text = std::fs::read_to_string(path).map_err(DataError::io(path))?;
                Self::hf(&text, path)?
            }
            TokenizerKind::Bpe(_) => {
                return Err(DataError::Invalid {
                    key: "data.tokenizer",
                    requirement: "trained on a corpus's text when it is prepared".into(),
                    value: kind.to_string(),
                });
            }
        })
    }

    fn from_chars(chars: Vec<char>, end_of_text: bool) -> Self {
        let index = chars
            .iter()
            .enumerate()
            .map(|(i, &c)| (c, i as u32))
            .collect();
        Self::Char {
            chars,
            index,
            end_of_text,
        }
    }

    fn gpt2() -> Self {
        Self::Gpt2(Box::new(
            tiktoken_rs::r50k_base().expect("the r50k_base ranks ship with tiktoken-rs"),
        ))
    }

    /// A Hugging Face tokenizer from the text of its `tokenizer.json` (read from `path`).
    fn hf(text: &str, path: &Path) -> Result<Self, DataError> {
        let bad = |reason: String| DataError::Corrupt {
            path: path.into(),
            reason: format!("not a Hugging Face tokenizer.json ({reason})"),
        };
        let json: serde_json::Value = serde_json::from_str(text).map_err(|e| bad(e.to_string()))?;
        let inner = tokenizers::Tokenizer::from_str(text).map_err(|e| bad(e.to_string()))?;
        Ok(Self::hf_with(inner, json))
    }

    /// A Hugging Face tokenizer built here (a trained BPE).
    fn from_hf(inner: tokenizers::Tokenizer) -> Result<Self, DataError> {
        let text = inner
            .to_string(false)
            .map_err(|e| DataError::Tokenize(e.to_string()))?;
        let json = serde_json::from_str(&text).map_err(|e| DataError::Tokenize(e.to_string()))?;
        Ok(Self::hf_with(inner, json))
    }

    fn hf_with(inner: tokenizers::Tokenizer, json: serde_json::Value) -> Self {
        let end_of_text = END_OF_TEXT_NAMES.iter().find_map(|n| inner.token_to_id(n));
        Self::Hf {
            inner: Box::new(inner),
            json,
            end_of_text,
        }
    }

    /// The name a config file gives this tokenizer's kind (`hf` for any Hugging Face one).
    pub fn kind_name(&self) -> &'static str {
        match self {
            Self::Char { .. } => "char",
            Self::Byte { .. } => "byte",
            Self::Gpt2(_) => "gpt2",
            Self::Hf { .. } => "hf",
        }
    }

    pub fn vocab_size(&self) -> usize {
        match self {
            Self::Char {
                chars, end_of_text, ..
            } => chars.len() + usize::from(*end_of_text),
            Self::Byte { end_of_text } => 256 + usize::from(*end_of_text),
            Self::Gpt2(_) => 50257,
            Self::Hf { inner, .. } => inner.get_vocab_size(true),
        }
    }

    /// The id that separates documents, if the vocabulary has one.
    pub fn end_of_text(&self) -> Option<u32> {
        match self {
            Self::Char {
                chars, end_of_text, ..
            } => end_of_text.then_some(chars.len() as u32),
            Self::Byte { end_of_text } => end_of_text.then_some(256),
            Self::Gpt2(_) => Some(GPT2_END_OF_TEXT),
            Self::Hf { end_of_text, .. } => *end_of_text,
        }
    }

    pub fn encode(&self, text: &str) -> Result<Vec<u32>, DataError> {
        match self {
            Self::Char { index, .. } => text
                .chars()
                .map(|c| index.get(&c).copied().ok_or(DataError::UnknownChar(c)))
                .collect(),
            Self::Byte { .. } => Ok(text.bytes().map(u32::from).collect()),
            Self::Gpt2(bpe) => Ok(bpe.encode_ordinary(text)),
            Self::Hf { inner, .. } => inner
                .encode_fast(text, false)
                .map(|e| e.get_ids().to_vec())
                .map_err(|e| DataError::Tokenize(e.to_string())),
        }
    }

    /// The tokens of raw `bytes`: any bytes for `byte`, UTF-8 text for the others (else
    /// `Err(offset)` of the first invalid byte).
    pub fn encode_bytes(&self, bytes: &[u8]) -> Result<Result<Vec<u32>, DataError>, usize> {
        match self {
            Self::Byte { .. } => Ok(Ok(bytes.iter().map(|&b| u32::from(b)).collect())),
            _ => match std::str::from_utf8(bytes) {
                Ok(text) => Ok(self.encode(text)),
                Err(e) => Err(e.valid_up_to()),
            },
        }
    }

    /// The bytes of the text of `tokens`, end-of-text not counted: exact for `char`,
    /// `byte` and `gpt2`, of the lossy decoded text for a Hugging Face tokenizer (a
    /// character cut between two calls counts as U+FFFD's 3 bytes).
    pub fn text_bytes(&self, tokens: &[u32]) -> Result<usize, DataError> {
        let eot = self.end_of_text();
        let text: Vec<u32> = tokens.iter().copied().filter(|&t| Some(t) != eot).collect();
        Ok(match self {
            Self::Char { chars, .. } => text
                .iter()
                .map(|&t| chars.get(t as usize).map_or(0, |c| c.len_utf8()))
                .sum(),
            Self::Byte { .. } => text.len(),
            Self::Gpt2(bpe) => bpe
                .decode_bytes(&text)
                .map_err(|_| DataError::UnknownToken(text[0]))?
                .len(),
            Self::Hf { .. } => self.decode(&text)?.len(),
        })
    }

    /// The text of `tokens`; byte sequences that are not UTF-8 decode lossily, and
    /// end-of-text as `<|endoftext|>`.
    pub fn decode(&self, tokens: &[u32]) -> Result<String, DataError> {
        let vocab = self.vocab_size();
        if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= vocab) {
            return Err(DataError::UnknownToken(bad));
        }
        let eot = self.end_of_text();
        Ok(match self {
            Self::Char { chars, .. } => tokens
                .iter()
                .map(|&t| match chars.get(t as usize) {
                    Some(c) => c.to_string(),
                    None => END_OF_TEXT_NAMES[0].to_string(),
                })
                .collect(),
            Self::Byte { .. } => {
                let mut text = String::new();
                for part in tokens.split_inclusive(|&t| Some(t) == eot) {
                    let (body, end) = match part.split_last() {
                        Some((&last, body)) if Some(last) == eot => (body, true),
                        _ => (part, false),
                    };
                    let bytes: Vec<u8> = body.iter().map(|&t| t as u8).collect();
                    text.push_str(&String::from_utf8_lossy(&bytes));
                    if end {
                        text.push_str(END_OF_TEXT_NAMES[0]);
                    }
                }
                text
            }
            Self::Gpt2(bpe) => {
                let bytes = bpe
                    .decode_bytes(tokens)
                    .map_err(|_| DataError::UnknownToken(tokens[0]))?;
                String::from_utf8_lossy(&bytes).into_owned()
            }
            Self::Hf { inner, .. } => inner
                .decode(tokens, false)
                .map_err(|e| DataError::Tokenize(e.to_string()))?,
        })
    }

    pub fn save(&self, path: &Path) -> Result<(), DataError> {
        let saved = Saved {
            kind: self.kind_name().into(),
            chars: match self {
                Self::Char { chars, .. } => Some(chars.iter().collect()),
                _ => None,
            },
            end_of_text: matches!(
                self,
                Self::Char {
                    end_of_text: true,
                    ..
                } | Self::Byte { end_of_text: true }
            ),
            hf: match self {
                Self::Hf { json, .. } => Some(json.clone()),
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
        Ok(match (saved.kind.as_str(), saved.chars, saved.hf) {
            ("char", Some(chars), _) => {
                Self::from_chars(chars.chars().collect(), saved.end_of_text)
            }
            ("char", None, _) => {
                return Err(corrupt("a char tokenizer without its characters".into()));
            }
            ("byte", _, _) => Self::Byte {
                end_of_text: saved.end_of_text,
            },
            ("gpt2", _, _) => Self::gpt2(),
            ("hf", _, Some(json)) => Self::hf(&json.to_string(), path)?,
            (kind, _, _) => return Err(corrupt(format!("unknown tokenizer kind {kind:?}"))),
        })
    }
}
