//! Preparing a corpus: its documents streamed in batches, tokenized on every core, written
//! in order into the token file with the end-of-text token between documents. Memory stays
//! bounded by a batch whatever the corpus's size; a `char` vocabulary takes one pass more.

use std::collections::BTreeSet;
use std::io::{BufWriter, IsTerminal, Write};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use rayon::prelude::*;
use sha2::{Digest, Sha256};

use super::key::Settings;
use super::publish::{self, Part};
use super::{META_FILE, Meta, Prepared, ReadFile, SkippedPath, TOKENIZER_FILE, TOKENS_FILE, open};
use crate::DataError;
use crate::corpus::documents::{self, Piece};
use crate::corpus::sources::Sources;
use crate::corpus::{self};
use crate::tokenizer::{Tokenizer, TokenizerKind};

/// Bytes of text tokenized at once.
const BATCH_BYTES: usize = 32 << 20;

/// Tokenizes `sources` into the cache folder `dir` ([`super::folder`]), or re-uses what is
/// there when it was prepared from files of the same paths, sizes and modification times
/// with the same settings (their contents are not read again). Returns the prepared corpus
/// and whether it was re-used. Safe to run from several processes at once: see
/// [`super::publish`].
pub fn prepare(
    sources: &Sources,
    settings: &Settings,
    dir: &Path,
) -> Result<(Prepared, bool), DataError> {
    prepare_with(sources, settings, dir, false)
}

/// [`prepare`], tokenizing again when `force` even where the folder could be re-used (a
/// source edited without a change of size or modification time, a suspect cache).
pub fn prepare_with(
    sources: &Sources,
    settings: &Settings,
    dir: &Path,
    force: bool,
) -> Result<(Prepared, bool), DataError> {
    let fingerprint = sources.fingerprint()?;
    let _lock = publish::lock(dir)?;
    publish::remove_leftovers(dir)?;
    if !force
        && let Ok(existing) = open(dir)
        && existing.meta.fingerprint == fingerprint
        && existing.meta.tokenizer == settings.tokenizer
        && existing.meta.text_field == settings.text_field
        && existing.meta.train_fraction == settings.train_fraction
    {
        return Ok((existing, true));
    }
    let part = Part::create(dir)?;
    write_preparation(sources, settings, fingerprint, part.path())?;
    part.publish()?;
    Ok((open(dir)?, false))
}

/// Tokenizes `sources` into the files of a prepared corpus in the empty folder `dir`.
fn write_preparation(
    sources: &Sources,
    settings: &Settings,
    fingerprint: String,
    dir: &Path,
) -> Result<(), DataError> {
    let several = sources.several_documents();
    let chars = match settings.tokenizer {
        TokenizerKind::Char => characters(sources, settings)?,
        _ => BTreeSet::new(),
    };
    let tokenizer = Tokenizer::new(&settings.tokenizer, chars, several)?;
    if several && tokenizer.end_of_text().is_none() {
        return Err(DataError::Invalid {
            key: "data.tokenizer",
            requirement: format!(
                "a tokenizer with an end-of-text token ({}) for a corpus of several documents",
                crate::tokenizer::END_OF_TEXT_NAMES.join(", ")
            ),
            value: settings.tokenizer.to_string(),
        });
    }
    let written = write_tokens(sources, settings, &tokenizer, &dir.join(TOKENS_FILE))?;
    if written.tokens == 0 {
        return Err(DataError::EmptyCorpus(sources.spec.display().to_string()));
    }
    let train_tokens = (written.tokens as f64 * settings.train_fraction) as usize;
    let meta = Meta {
        tokenizer: settings.tokenizer.clone(),
        vocab_size: tokenizer.vocab_size(),
        end_of_text: tokenizer.end_of_text().filter(|_| several),
        source: sources.spec.display().to_string(),
        files: sources.files.len(),
        read: sources
            .files
            .iter()
            .map(|f| ReadFile {
                path: f.path.display().to_string(),
                real: f.real.display().to_string(),
                bytes: f.size,
            })
            .collect(),
        skipped: sources
            .skipped
            .iter()
            .map(|s| SkippedPath {
                path: s.path.display().to_string(),
                reason: s.reason.clone(),
            })
            .collect(),
        documents: written.documents,
        text_field: settings.text_field.clone(),
        fingerprint,
        source_sha256: written.sha256,
        token_bytes: token_bytes(&tokenizer),
        tokens: written.tokens,
        train_fraction: settings.train_fraction,
        train_tokens,
        valid_tokens: written.tokens - train_tokens,
    };
    tokenizer.save(&dir.join(TOKENIZER_FILE))?;
    let json = serde_json::to_string_pretty(&meta).expect("serialisable");
    let meta_path = dir.join(META_FILE);
    std::fs::write(&meta_path, json).map_err(DataError::io(&meta_path))
}

/// 2 (u16) when every id fits, else 4.
fn token_bytes(tokenizer: &Tokenizer) -> usize {
    if tokenizer.vocab_size() <= 1 << 16 {
        2
    } else {
        4
    }
}

/// A batch of pieces and the file each came from.
type Batch = Vec<(usize, Piece)>;

/// Streams every piece of every file to `each` in batches of about [`BATCH_BYTES`], with
/// progress on stderr when it is a terminal.
fn batches(
    sources: &Sources,
    settings: &Settings,
    pass: &str,
    each: &mut dyn FnMut(Batch) -> Result<(), DataError>,
) -> Result<(), DataError> {
    let (read, total, started) = (AtomicU64::new(0), sources.total_bytes(), Instant::now());
    // Progress for people watching; logs and error output stay clean.
    let terminal = std::io::stderr().is_terminal();
    let show = |read: &AtomicU64| {
        if !terminal {
            return;
        }
        let done = read.load(Ordering::Relaxed);
        eprint!(
            "\r{pass} {}: {:.1} of {:.1} MB ({:.0} s)",
            sources.spec.display(),
            done as f64 / 1e6,
            total as f64 / 1e6,
            started.elapsed().as_secs_f64()
        );
    };
    let (mut batch, mut bytes): (Batch, usize) = (Vec::new(), 0);
    for (i, file) in sources.files.iter().enumerate() {
        documents::read(file, &settings.text_field, &read, &mut |piece| {
            bytes += piece.bytes.len();
            batch.push((i, piece));
            if bytes >= BATCH_BYTES {
                bytes = 0;
                each(std::mem::take(&mut batch))?;
                show(&read);
            }
            Ok(())
        })?;
    }
    each(batch)?;
    show(&read);
    if terminal {
        eprintln!();
    }
    Ok(())
}

fn utf8_error(sources: &Sources, file: usize, piece: &Piece, at: usize) -> DataError {
    DataError::InvalidUtf8 {
        path: sources.files[file].path.clone(),
        offset: piece.offset + at,
    }
}

/// Every character of the corpus (the `char` vocabulary), counted on every core.
fn characters(sources: &Sources, settings: &Settings) -> Result<BTreeSet<char>, DataError> {
    let mut chars = BTreeSet::new();
    batches(
        sources,
        settings,
        "reading the characters of",
        &mut |batch| {
            let sets: Vec<BTreeSet<char>> = batch
                .par_iter()
                .map(|(file, piece)| match std::str::from_utf8(&piece.bytes) {
                    Ok(text) => Ok(text.chars().collect()),
                    Err(e) => Err(utf8_error(sources, *file, piece, e.valid_up_to())),
                })
                .collect::<Result<_, _>>()?;
            sets.into_iter().for_each(|s| chars.extend(s));
            Ok(())
        },
    )?;
    Ok(chars)
}

struct Written {
    tokens: usize,
    documents: usize,
    /// Of the documents' bytes, in order.
    sha256: String,
}

/// Tokenizes the corpus into `path`.
fn write_tokens(
    sources: &Sources,
    settings: &Settings,
    tokenizer: &Tokenizer,
    path: &Path,
) -> Result<Written, DataError> {
    let file = std::fs::File::create(path).map_err(DataError::io(path))?;
    let mut out = BufWriter::with_capacity(1 << 20, file);
    let width = token_bytes(tokenizer);
    let eot = tokenizer.end_of_text();
    let (mut tokens, mut documents, mut starts_document) = (0usize, 0usize, true);
    let mut hasher = Sha256::new();
    batches(sources, settings, "tokenizing", &mut |batch| {
        let encoded: Vec<Vec<u32>> = batch
            .par_iter()
            .map(|(file, piece)| match tokenizer.encode_bytes(&piece.bytes) {
                Ok(tokens) => tokens,
                Err(at) => Err(utf8_error(sources, *file, piece, at)),
            })
            .collect::<Result<_, _>>()?;
        for ((_, piece), ids) in batch.iter().zip(encoded) {
            hasher.update(&piece.bytes);
            let separator = (starts_document && documents > 0).then_some(eot).flatten();
            for id in separator.into_iter().chain(ids) {
                let bytes = id.to_le_bytes();
                out.write_all(&bytes[..width])
                    .map_err(DataError::io(path))?;
                tokens += 1;
            }
            if starts_document {
                documents += 1;
            }
            starts_document = piece.last;
        }
        Ok(())
    })?;
    out.flush().map_err(DataError::io(path))?;
    Ok(Written {
        tokens,
        documents,
        sha256: corpus::hex(&hasher.finalize()),
    })
}
