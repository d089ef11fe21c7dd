//! Preparing a corpus: its documents streamed in batches ([`super::stream`]), tokenized on
//! every core and written into the token file ([`super::write`]). Memory stays bounded by a
//! batch whatever the corpus's size; a `char` vocabulary takes one pass more (to collect
//! the characters), a documents split or a BPE one (to count the documents and their
//! bytes), a BPE one more (to train).

use std::collections::BTreeSet;
use std::path::Path;

use super::key::Settings;
use super::publish::{self, Part};
use super::split::{Split, held_out};
use super::stream::{self, Item};
use super::write::write_tokens;
use super::{
    META_FILE, Meta, Prepared, ReadFile, SkippedPath, TOKENIZER_FILE, TOKENS_FILE, TokenFile, open,
};
use crate::DataError;
use crate::corpus::sources::{Skipped, SourceFile, Sources};
use crate::tokenizer::{Tokenizer, TokenizerKind};

/// Tokens decoded at once to count the bytes of a split.
const DECODE_TOKENS: usize = 1 << 20;

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
        && existing.meta.split == settings.split
        && existing.meta.split_seed == settings.split_seed
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
    let needs_survey =
        settings.split == Split::Documents || matches!(settings.tokenizer, TokenizerKind::Bpe(_));
    let (documents, bytes) = match needs_survey {
        true => stream::survey(sources, settings)?,
        false => (0, 0),
    };
    let valid = match settings.split {
        Split::Documents => Some(held_out(
            documents,
            settings.train_fraction,
            settings.split_seed,
        )?),
        Split::Tail => None,
    };
    let tokenizer = tokenizer(sources, settings, several, valid.as_deref(), bytes)?;
    if several && tokenizer.end_of_text().is_none() {
        return Err(no_end_of_text(settings));
    }
    let (tokens_path, width) = (dir.join(TOKENS_FILE), token_bytes(&tokenizer));
    let written = write_tokens(
        sources,
        settings,
        &tokenizer,
        valid.as_deref(),
        &tokens_path,
        width,
    )?;
    if written.tokens == 0 {
        return Err(DataError::EmptyCorpus(sources.spec.clone()));
    }
    let train_tokens = match settings.split {
        Split::Tail => (written.tokens as f64 * settings.train_fraction) as usize,
        Split::Documents => written.train_tokens,
    };
    let tokens = TokenFile::open(&tokens_path, width)?;
    let valid_bytes = text_bytes(&tokens, train_tokens..written.tokens, &tokenizer)?;
    let all_bytes = valid_bytes + text_bytes(&tokens, 0..train_tokens, &tokenizer)?;
    let meta = Meta {
        tokenizer: settings.tokenizer.clone(),
        vocab_size: tokenizer.vocab_size(),
        end_of_text: tokenizer.end_of_text().filter(|_| several),
        source: sources.spec.clone(),
        files: sources.files.len(),
        read: read_files(sources),
        skipped: skipped_paths(sources),
        documents: written.documents,
        text_field: settings.text_field.clone(),
        fingerprint,
        source_sha256: written.sha256,
        token_bytes: width,
        tokens: written.tokens,
        train_fraction: settings.train_fraction,
        split: settings.split,
        split_seed: settings.split_seed,
        valid_documents: written.held_out,
        train_tokens,
        valid_tokens: written.tokens - train_tokens,
        train_bytes: all_bytes - valid_bytes,
        valid_bytes,
    };
    tokenizer.save(&dir.join(TOKENIZER_FILE))?;
    let json = serde_json::to_string_pretty(&meta).expect("serialisable");
    let meta_path = dir.join(META_FILE);
    std::fs::write(&meta_path, json).map_err(DataError::io(&meta_path))
}

/// A corpus of several documents needs a tokenizer that can mark where each ends.
fn no_end_of_text(settings: &Settings) -> DataError {
    DataError::Invalid {
        key: "data.tokenizer",
        requirement: format!(
            "a tokenizer with an end-of-text token ({}) for a corpus of several documents",
            crate::tokenizer::END_OF_TEXT_NAMES.join(", ")
        ),
        value: settings.tokenizer.to_string(),
    }
}

/// The files read, as `meta.json` lists them.
fn read_files(sources: &Sources) -> Vec<ReadFile> {
    let file = |f: &SourceFile| ReadFile {
        path: f.path.display().to_string(),
        real: f.real.display().to_string(),
        bytes: f.size,
    };
    sources.files.iter().map(file).collect()
}

/// The paths passed over, with why, as `meta.json` lists them.
fn skipped_paths(sources: &Sources) -> Vec<SkippedPath> {
    let skipped = |s: &Skipped| SkippedPath {
        path: s.path.display().to_string(),
        reason: s.reason.clone(),
    };
    sources.skipped.iter().map(skipped).collect()
}

/// The tokenizer of `settings`: built, or learnt from the corpus (a `char` vocabulary from
/// every character, a BPE from the training split: the documents not in `valid`, or the
/// first `train_fraction` of the corpus's `bytes` of text).
fn tokenizer(
    sources: &Sources,
    settings: &Settings,
    several: bool,
    valid: Option<&[bool]>,
    bytes: u64,
) -> Result<Tokenizer, DataError> {
    match settings.tokenizer {
        TokenizerKind::Char => Tokenizer::new(
            &settings.tokenizer,
            stream::characters(sources, settings)?,
            several,
        ),
        TokenizerKind::Bpe(n) => {
            let mut left = (bytes as f64 * settings.train_fraction) as usize;
            let mut keep = |item: &Item| match valid {
                Some(valid) if valid.get(item.document) == Some(&true) => 0,
                Some(_) => item.piece.bytes.len(),
                None => {
                    let kept = left.min(item.piece.bytes.len());
                    left -= kept;
                    kept
                }
            };
            stream::texts(sources, settings, &mut keep, |texts| {
                Tokenizer::train_bpe(n, texts)
            })
        }
        _ => Tokenizer::new(&settings.tokenizer, BTreeSet::new(), several),
    }
}

/// 2 (u16) when every id fits, else 4.
fn token_bytes(tokenizer: &Tokenizer) -> usize {
    if tokenizer.vocab_size() <= 1 << 16 {
        2
    } else {
        4
    }
}

/// The bytes of text of the tokens at `range` ([`Tokenizer::text_bytes`]), decoded in
/// pieces.
fn text_bytes(
    tokens: &TokenFile,
    range: std::ops::Range<usize>,
    tokenizer: &Tokenizer,
) -> Result<u64, DataError> {
    let mut bytes = 0;
    for start in range.clone().step_by(DECODE_TOKENS) {
        let end = (start + DECODE_TOKENS).min(range.end);
        bytes += tokenizer.text_bytes(&tokens.read(start..end))? as u64;
    }
    Ok(bytes)
}
