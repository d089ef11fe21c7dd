//! Writing the token file: the documents tokenized on every core and appended in order,
//! end-of-text between them; with a documents split, the training documents first.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use rayon::prelude::*;
use sha2::{Digest, Sha256};

use super::key::Settings;
use super::split::HeldOut;
use super::stream::{Item, batches};
use crate::DataError;
use crate::corpus::{self, sources::Sources};
use crate::tokenizer::Tokenizer;

/// What [`write_tokens`] wrote.
pub struct Written {
    pub tokens: usize,
    /// Of a documents split: the tokens of the training documents, at the file's start.
    pub train_tokens: usize,
    pub documents: usize,
    /// Of the documents' bytes, in the corpus's order.
    pub sha256: String,
    pub held_out: Vec<HeldOut>,
}

/// Tokens appended to a file, `width` bytes each.
struct Sink {
    path: PathBuf,
    out: BufWriter<File>,
    width: usize,
    tokens: usize,
    documents: usize,
}

impl Sink {
    fn create(path: PathBuf, width: usize) -> Result<Self, DataError> {
        let file = File::create(&path).map_err(DataError::io(&path))?;
        Ok(Self {
            out: BufWriter::with_capacity(1 << 20, file),
            path,
            width,
            tokens: 0,
            documents: 0,
        })
    }

    fn write(&mut self, ids: impl Iterator<Item = u32>) -> Result<(), DataError> {
        for id in ids {
            self.out
                .write_all(&id.to_le_bytes()[..self.width])
                .map_err(DataError::io(&self.path))?;
            self.tokens += 1;
        }
        Ok(())
    }

    fn finish(mut self) -> Result<Self, DataError> {
        self.out.flush().map_err(DataError::io(&self.path))?;
        Ok(self)
    }
}

/// Tokenizes the corpus into `path`, `width` bytes a token: its documents in order, or,
/// given `valid` (which documents a documents split holds out), the training documents in
/// order and then the validation ones (written beside it first, then appended).
/// End-of-text goes between consecutive documents of the file.
pub fn write_tokens(
    sources: &Sources,
    settings: &Settings,
    tokenizer: &Tokenizer,
    valid: Option<&[bool]>,
    path: &Path,
    width: usize,
) -> Result<Written, DataError> {
    let eot = tokenizer.end_of_text();
    let mut train = Sink::create(path.into(), width)?;
    let mut held = match valid {
        Some(_) => Some(Sink::create(path.with_extension("valid"), width)?),
        None => None,
    };
    let (mut documents, mut held_out, mut hasher) = (0, Vec::new(), Sha256::new());
    batches(sources, settings, "tokenizing", &mut |batch: Vec<Item>| {
        let encoded: Vec<Vec<u32>> = batch
            .par_iter()
            .map(|item| match tokenizer.encode_bytes(&item.piece.bytes) {
                Ok(tokens) => tokens,
                Err(at) => Err(item.utf8_error(sources, at)),
            })
            .collect::<Result<_, _>>()?;
        for (item, ids) in batch.iter().zip(encoded) {
            hasher.update(&item.piece.bytes);
            documents = item.document + 1;
            // A document the count did not see (a file that grew since) trains.
            let held_out_here = valid.is_some_and(|v| v.get(item.document) == Some(&true));
            let sink = match &mut held {
                Some(sink) if held_out_here => sink,
                _ => &mut train,
            };
            if item.first {
                if held_out_here {
                    held_out.push(HeldOut {
                        index: item.document,
                        source: item.source(sources),
                    });
                }
                // The validation documents follow the training ones: each gets a separator.
                let separate = sink.documents > 0 || held_out_here;
                sink.write(eot.filter(|_| separate).into_iter())?;
                sink.documents += 1;
            }
            sink.write(ids.into_iter())?;
        }
        Ok(())
    })?;
    let mut train = train.finish()?;
    let train_tokens = train.tokens;
    if let Some(held) = held {
        let held = held.finish()?;
        let mut file = File::open(&held.path).map_err(DataError::io(&held.path))?;
        std::io::copy(&mut file, train.out.get_mut()).map_err(DataError::io(path))?;
        std::fs::remove_file(&held.path).map_err(DataError::io(&held.path))?;
        train.tokens += held.tokens;
    }
    Ok(Written {
        tokens: train.tokens,
        train_tokens,
        documents,
        sha256: corpus::hex(&hasher.finalize()),
        held_out,
    })
}
