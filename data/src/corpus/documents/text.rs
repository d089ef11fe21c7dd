//! The documents of a text or JSONL file, plain, gzip or zstd: a text file is one document
//! cut into pieces, a JSONL line one document.

use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use super::{PIECE_BYTES, Piece};
use crate::DataError;
use crate::corpus::sources::{Compression, Format, SourceFile};

/// Reads the documents of the text or JSONL `file` (see [`super::read`]).
pub fn read(
    file: &SourceFile,
    text_field: &str,
    read: &AtomicU64,
    each: &mut dyn FnMut(Piece) -> Result<(), DataError>,
) -> Result<(), DataError> {
    let disk = std::fs::File::open(&file.path).map_err(DataError::io(&file.path))?;
    let counted = BufReader::new(Counted { inner: disk, read });
    let reader: Box<dyn BufRead + '_> = match file.compression {
        Compression::None => Box::new(counted),
        Compression::Gzip => Box::new(BufReader::new(flate2::bufread::MultiGzDecoder::new(
            counted,
        ))),
        Compression::Zstd => Box::new(BufReader::new(ZstdFrames::new(counted))),
    };
    match file.format {
        Format::Text => text(reader, &file.path, each),
        Format::Jsonl => jsonl(reader, &file.path, text_field, each),
        Format::Parquet => unreachable!("a Parquet file is read by `parquet::read`"),
    }
}

fn text(
    mut reader: Box<dyn BufRead + '_>,
    path: &Path,
    each: &mut dyn FnMut(Piece) -> Result<(), DataError>,
) -> Result<(), DataError> {
    let (mut piece, mut offset) = (Vec::with_capacity(2 * PIECE_BYTES), 0);
    loop {
        // Up to twice a piece at a time, so that a cut can be chosen among the last half.
        let wanted = 2 * PIECE_BYTES - piece.len();
        let got = (&mut reader)
            .take(wanted as u64)
            .read_to_end(&mut piece)
            .map_err(DataError::io(path))?;
        if got < wanted {
            if !piece.is_empty() || offset > 0 {
                each(Piece {
                    bytes: piece,
                    offset,
                    last: true,
                })?;
            } // else: an empty file holds no document
            return Ok(());
        }
        let rest = piece.split_off(cut(&piece));
        let bytes = std::mem::replace(&mut piece, rest);
        let len = bytes.len();
        each(Piece {
            bytes,
            offset,
            last: false,
        })?;
        offset += len;
    }
}

/// Where to end a piece of at least [`PIECE_BYTES`] within `bytes` (of twice that), so that
/// tokenizing the pieces apart gives the tokens of the whole: after a line break that a
/// non-space follows, where a BPE pre-tokenizer splits anyway; in a line that long, before
/// a space between two words (GPT-2's splits too); else between two UTF-8 characters (exact
/// for the `char` and `byte` tokenizers). Memory then stays bounded by the piece even in a
/// file of one line.
fn cut(bytes: &[u8]) -> usize {
    let space = |b: &u8| b.is_ascii_whitespace();
    let from = PIECE_BYTES;
    let after_line_break =
        (from..bytes.len()).find(|&i| bytes[i - 1] == b'\n' && !space(&bytes[i]));
    let before_word = || {
        (from..bytes.len() - 1)
            .rev()
            .find(|&i| bytes[i] == b' ' && !space(&bytes[i - 1]) && !space(&bytes[i + 1]))
    };
    // A UTF-8 continuation byte (0b10xxxxxx) never starts a character.
    let char_boundary = || {
        (from..bytes.len())
            .rev()
            .find(|&i| bytes[i] & 0xC0 != 0x80)
            .unwrap_or(bytes.len())
    };
    after_line_break
        .or_else(before_word)
        .unwrap_or_else(char_boundary)
}

fn jsonl(
    reader: Box<dyn BufRead + '_>,
    path: &Path,
    field: &str,
    each: &mut dyn FnMut(Piece) -> Result<(), DataError>,
) -> Result<(), DataError> {
    for (i, line) in reader.split(b'\n').enumerate() {
        let line = line.map_err(DataError::io(path))?;
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let bad = |reason: String| DataError::Record {
            path: path.into(),
            line: i + 1,
            reason,
        };
        let value: serde_json::Value =
            serde_json::from_slice(&line).map_err(|e| bad(format!("not JSON ({e})")))?;
        let text = match value.get(field) {
            Some(serde_json::Value::String(text)) => text,
            Some(other) => {
                return Err(bad(format!("the field {field:?} is not a string: {other}")));
            }
            None => return Err(bad(format!("no field {field:?} (set data.text_field)"))),
        };
        if !text.is_empty() {
            each(Piece {
                bytes: text.as_bytes().to_vec(),
                offset: i + 1,
                last: true,
            })?;
        }
    }
    Ok(())
}

/// Counts the bytes read from the file (the progress of a preparation).
struct Counted<'a, R> {
    inner: R,
    read: &'a AtomicU64,
}

impl<R: Read> Read for Counted<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.read.fetch_add(n as u64, Ordering::Relaxed);
        Ok(n)
    }
}

/// A zstd stream of one or more frames (as `zstd` and `pzstd` write them).
struct ZstdFrames<R: BufRead> {
    frame: Option<ruzstd::decoding::StreamingDecoder<R, ruzstd::decoding::FrameDecoder>>,
    rest: Option<R>,
}

impl<R: BufRead> ZstdFrames<R> {
    fn new(reader: R) -> Self {
        Self {
            frame: None,
            rest: Some(reader),
        }
    }
}

impl<R: BufRead> Read for ZstdFrames<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        loop {
            if let Some(frame) = &mut self.frame {
                let n = frame.read(buf)?;
                if n > 0 || buf.is_empty() {
                    return Ok(n);
                }
                self.rest = self.frame.take().map(|f| f.into_inner());
            }
            let Some(mut reader) = self.rest.take() else {
                return Ok(0);
            };
            if reader.fill_buf()?.is_empty() {
                return Ok(0);
            }
            let frame = ruzstd::decoding::StreamingDecoder::new(reader)
                .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
            self.frame = Some(frame);
        }
    }
}
