//! How a prepared corpus is split into training and validation tokens ([`Split`]), and which
//! documents a documents split holds out ([`held_out`]).

use rand::SeedableRng;
use rand::seq::SliceRandom;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use crate::DataError;

/// `data.split`.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum Split {
    /// The first `train_fraction` of the tokens train, the rest validate (nanoGPT's split).
    #[default]
    Tail,
    /// Whole documents: `train_fraction` of them train, the others, drawn with
    /// `data.split_seed`, validate; `tokens.bin` holds the training documents first.
    Documents,
}

impl std::fmt::Display for Split {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Tail => "tail",
            Self::Documents => "documents",
        })
    }
}

/// A document held out for validation: its index among the corpus's documents (in order,
/// from 0) and where it is (a file, or a file's line or row).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct HeldOut {
    pub index: usize,
    pub source: String,
}

/// Which of `documents` documents validate: `documents − round(train_fraction ·
/// documents)` of them (at least one, and at least one left to train), the first of a
/// permutation drawn from `seed`, so the same corpus and seed hold out the same documents.
pub fn held_out(documents: usize, train_fraction: f64, seed: u64) -> Result<Vec<bool>, DataError> {
    if documents < 2 {
        return Err(DataError::Invalid {
            key: "data.split",
            requirement: "\"tail\" for a corpus of one document (\"documents\" holds whole \
                          documents out, and needs two or more)"
                .into(),
            value: format!("\"documents\" ({documents} document)"),
        });
    }
    let train = ((documents as f64 * train_fraction).round() as usize).clamp(1, documents - 1);
    let mut order: Vec<usize> = (0..documents).collect();
    order.shuffle(&mut ChaCha8Rng::seed_from_u64(seed));
    let mut valid = vec![false; documents];
    for &i in &order[..documents - train] {
        valid[i] = true;
    }
    Ok(valid)
}
