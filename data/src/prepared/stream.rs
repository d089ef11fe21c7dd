//! The passes over a corpus's documents that a preparation makes: each streams the pieces
//! of every document in batches of about [`BATCH_BYTES`], so memory stays bounded whatever
//! the corpus's size.

use std::collections::BTreeSet;
use std::io::IsTerminal;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{IntoIter, sync_channel};
use std::time::Instant;

use rayon::prelude::*;

use super::key::Settings;
use crate::DataError;
use crate::corpus::documents::{self, Piece};
use crate::corpus::sources::{Format, Sources};

/// Bytes of text tokenized at once.
const BATCH_BYTES: usize = 32 << 20;

/// A piece of a document, with the file and the document (counted from 0 over the whole
/// corpus) it belongs to.
pub struct Item {
    pub file: usize,
    pub document: usize,
    /// Whether the piece starts its document.
    pub first: bool,
    pub piece: Piece,
}

impl Item {
    pub fn text<'a>(&'a self, sources: &Sources) -> Result<&'a str, DataError> {
        std::str::from_utf8(&self.piece.bytes)
            .map_err(|e| self.utf8_error(sources, e.valid_up_to()))
    }

    pub fn utf8_error(&self, sources: &Sources, at: usize) -> DataError {
        DataError::InvalidUtf8 {
            path: sources.files[self.file].path.clone(),
            offset: self.piece.offset + at,
        }
    }

    /// Where the document is: its file, or for one document of several, its line or row.
    pub fn source(&self, sources: &Sources) -> String {
        let file = &sources.files[self.file];
        match file.format {
            Format::Text => file.path.display().to_string(),
            _ => format!("{}:{}", file.path.display(), self.piece.offset),
        }
    }
}

/// Streams every piece of every document to `each` in batches, with progress on stderr
/// when it is a terminal (`pass` says what the pass does).
pub fn batches(
    sources: &Sources,
    settings: &Settings,
    pass: &str,
    each: &mut dyn FnMut(Vec<Item>) -> Result<(), DataError>,
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
            sources.spec,
            done as f64 / 1e6,
            total as f64 / 1e6,
            started.elapsed().as_secs_f64()
        );
    };
    let (mut batch, mut bytes) = (Vec::new(), 0);
    let (mut documents, mut first) = (0, true);
    for (file, source) in sources.files.iter().enumerate() {
        documents::read(source, &settings.text_field, &read, &mut |piece| {
            bytes += piece.bytes.len();
            let last = piece.last;
            batch.push(Item {
                file,
                document: documents,
                first,
                piece,
            });
            (first, documents) = (last, documents + usize::from(last));
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

/// Every character of the corpus (the `char` vocabulary), counted on every core.
pub fn characters(sources: &Sources, settings: &Settings) -> Result<BTreeSet<char>, DataError> {
    let mut chars = BTreeSet::new();
    batches(
        sources,
        settings,
        "reading the characters of",
        &mut |batch| {
            let sets: Vec<BTreeSet<char>> = batch
                .par_iter()
                .map(|item| Ok(item.text(sources)?.chars().collect()))
                .collect::<Result<_, DataError>>()?;
            sets.into_iter().for_each(|s| chars.extend(s));
            Ok(())
        },
    )?;
    Ok(chars)
}

/// The number of documents and of their bytes.
pub fn survey(sources: &Sources, settings: &Settings) -> Result<(usize, u64), DataError> {
    let (mut documents, mut bytes) = (0, 0u64);
    batches(
        sources,
        settings,
        "counting the documents of",
        &mut |batch| {
            for item in &batch {
                documents = documents.max(item.document + 1);
                bytes += item.piece.bytes.len() as u64;
            }
            Ok(())
        },
    )?;
    Ok((documents, bytes))
}

/// Streams the text that `keep` selects of each piece (its bytes, from its document's
/// start, up to the piece's end) to `consume`, which runs while the corpus is read on
/// another thread; returns what `consume` returns.
pub fn texts<T>(
    sources: &Sources,
    settings: &Settings,
    keep: &mut (dyn FnMut(&Item) -> usize + Send),
    consume: impl FnOnce(IntoIter<String>) -> Result<T, DataError>,
) -> Result<T, DataError> {
    // A few batches in flight at most.
    let (send, receive) = sync_channel::<String>(64);
    std::thread::scope(|scope| {
        let reader = scope.spawn(move || {
            batches(
                sources,
                settings,
                "training the tokenizer on",
                &mut |batch| {
                    for item in &batch {
                        let text = item.text(sources)?;
                        let mut end = keep(item).min(text.len());
                        while !text.is_char_boundary(end) {
                            end -= 1;
                        }
                        // A closed channel: the trainer stopped, and says why.
                        if end > 0 && send.send(text[..end].to_string()).is_err() {
                            return Ok(());
                        }
                    }
                    Ok(())
                },
            )
        });
        let result = consume(receive.into_iter());
        let read = reader
            .join()
            .unwrap_or_else(|e| std::panic::resume_unwind(e));
        read.and(result)
    })
}
