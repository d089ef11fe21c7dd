//! The documents of a corpus file, streamed in pieces so that memory stays bounded
//! whatever the size of the file: text and JSONL ([`text`]) or Parquet ([`parquet`]).

use std::sync::atomic::AtomicU64;

use super::sources::{Format, SourceFile};
use crate::DataError;

mod parquet;
mod text;

/// About how many bytes a piece of a long text document holds.
pub const PIECE_BYTES: usize = 1 << 20;

/// Part of a document, in order.
#[derive(Debug, Clone, PartialEq)]
pub struct Piece {
    pub bytes: Vec<u8>,
    /// Where the piece starts in its file (after decompression; a JSONL document: its
    /// line, counted from 1), for error messages.
    pub offset: usize,
    /// Whether the document ends with this piece.
    pub last: bool,
}

/// Reads the documents of `file` in order and passes their pieces to `each`: a text file is
/// one document, cut into pieces of one to two [`PIECE_BYTES`] where tokenizing them apart
/// changes nothing (see `text::cut`); a JSONL line or a Parquet row is one whole document, its
/// `text_field`. `read` counts the bytes read from disk.
pub fn read(
    file: &SourceFile,
    text_field: &str,
    read: &AtomicU64,
    each: &mut dyn FnMut(Piece) -> Result<(), DataError>,
) -> Result<(), DataError> {
    match file.format {
        Format::Parquet => parquet::read(file, text_field, read, each),
        Format::Text | Format::Jsonl => text::read(file, text_field, read, each),
    }
}
