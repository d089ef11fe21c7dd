//! Corpora in every format (text, JSONL, Parquet; plain, gzip, zstd; a file, a folder, a
//! glob), documents separated by end-of-text, Hugging Face tokenizers, and one clear error
//! for each kind of bad input.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use hla_data::DataError;
use hla_data::corpus::documents::{self, PIECE_BYTES, Piece};
use hla_data::corpus::sources::Sources;
use hla_data::prepared::{Prepared, Settings, prepare};
use hla_data::tokenizer::{Tokenizer, TokenizerKind};
use parquet::data_type::{ByteArray, ByteArrayType};
use parquet::file::writer::SerializedFileWriter;
use parquet::schema::parser::parse_message_type;

const DOCS: [&str; 3] = ["the cat sat.", "a dog ran far", "ünïcode — ok"];

fn write(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let path = dir.join(name);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(&path, bytes).unwrap();
    path
}

fn jsonl(docs: &[&str], field: &str) -> Vec<u8> {
    docs.iter()
        .map(|d| format!("{}\n", serde_json::json!({ field: d, "id": 7 })))
        .collect::<String>()
        .into_bytes()
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    encoder.write_all(bytes).unwrap();
    encoder.finish().unwrap()
}

/// Two zstd frames, as `pzstd` writes a file.
fn zstd(bytes: &[u8]) -> Vec<u8> {
    let level = ruzstd::encoding::CompressionLevel::Fastest;
    let (a, b) = bytes.split_at(bytes.len() / 2);
    let mut out = ruzstd::encoding::compress_to_vec(a, level);
    out.extend(ruzstd::encoding::compress_to_vec(b, level));
    out
}

fn parquet(path: &Path, column: &str, docs: &[&str]) {
    let schema = format!("message corpus {{ REQUIRED BYTE_ARRAY {column} (UTF8); }}");
    let schema = Arc::new(parse_message_type(&schema).unwrap());
    let file = std::fs::File::create(path).unwrap();
    let mut writer = SerializedFileWriter::new(file, schema, Default::default()).unwrap();
    let mut group = writer.next_row_group().unwrap();
    let mut column = group.next_column().unwrap().unwrap();
    let values: Vec<ByteArray> = docs.iter().map(|d| ByteArray::from(*d)).collect();
    column
        .typed::<ByteArrayType>()
        .write_batch(&values, None, None)
        .unwrap();
    column.close().unwrap();
    group.close().unwrap();
    writer.close().unwrap();
}

fn prep(source: &Path, tokenizer: TokenizerKind, field: &str) -> Result<Prepared, DataError> {
    let settings = Settings {
        tokenizer,
        text_field: field.into(),
        train_fraction: 0.5,
        ..Settings::default()
    };
    let out = source.with_extension("prepared");
    Ok(prepare(&Sources::find(source)?, &settings, &out)?.0)
}

/// The corpus decoded whole.
fn text(p: &Prepared) -> String {
    p.tokenizer
        .decode(&p.tokens.read(0..p.tokens.len()))
        .unwrap()
}

#[test]
fn every_format_gives_the_same_documents() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let lines = jsonl(&DOCS, "text");
    let joined = DOCS.join("<|endoftext|>");
    let mut sources = vec![
        write(d, "a/c.jsonl", &lines),
        write(d, "b/c.jsonl.gz", &gzip(&lines)),
        write(d, "c/c.jsonl.zst", &zstd(&lines)),
    ];
    let folder = d.join("shards");
    for (i, doc) in DOCS.iter().enumerate() {
        write(&folder, &format!("{i}.txt.gz"), &gzip(doc.as_bytes()));
    }
    sources.push(folder);
    let table = d.join("t/c.parquet");
    std::fs::create_dir_all(table.parent().unwrap()).unwrap();
    parquet(&table, "text", &DOCS);
    sources.push(table);
    for source in &sources {
        for kind in [
            TokenizerKind::Char,
            TokenizerKind::Byte,
            TokenizerKind::Gpt2,
        ] {
            let p = prep(source, kind.clone(), "text").unwrap();
            assert_eq!(text(&p), joined, "{} with {kind}", source.display());
            assert_eq!(p.meta.documents, 3);
            let eot = p.meta.end_of_text.expect("several documents");
            let tokens = p.tokens.read(0..p.tokens.len());
            assert_eq!(tokens.iter().filter(|&&t| t == eot).count(), 2);
        }
    }
    let glob = d.join("shards/*.txt.gz");
    let p = prep(&glob, TokenizerKind::Char, "text").unwrap();
    assert_eq!((text(&p), p.meta.files), (joined, 3));
}

#[test]
fn a_single_text_file_has_no_end_of_text_token() {
    let dir = tempfile::tempdir().unwrap();
    let source = write(dir.path(), "one.txt", b"banana\n");
    let p = prep(&source, TokenizerKind::Char, "text").unwrap();
    assert_eq!((p.meta.vocab_size, p.meta.end_of_text), (4, None));
    let several = write(dir.path(), "one.jsonl", &jsonl(&["banana"], "text"));
    let p = prep(&several, TokenizerKind::Char, "text").unwrap();
    assert_eq!((p.meta.vocab_size, p.meta.end_of_text), (4, Some(3)));
}

/// A long text file is read in pieces and the pieces join up again.
#[test]
fn long_text_files_stream_in_pieces() {
    let dir = tempfile::tempdir().unwrap();
    let line = "First Citizen: we are accounted poor citizens, the patricians good.\n";
    let body = line.repeat(3 * (PIECE_BYTES / line.len()));
    let source = write(dir.path(), "long.txt.zst", &zstd(body.as_bytes()));
    let p = prep(&source, TokenizerKind::Gpt2, "text").unwrap();
    let whole = Tokenizer::build(&TokenizerKind::Gpt2, "").unwrap();
    assert_eq!(
        p.tokens.read(0..p.tokens.len()),
        whole.encode(&body).unwrap()
    );
    assert_eq!((p.meta.documents, p.meta.end_of_text), (1, None));
}

/// The pieces of the one file of `source`, as preparation reads them.
fn pieces(source: &Path) -> Vec<Piece> {
    let file = Sources::find(source).unwrap().files.remove(0);
    let mut pieces = Vec::new();
    documents::read(&file, "text", &AtomicU64::new(0), &mut |piece| {
        pieces.push(piece);
        Ok(())
    })
    .unwrap();
    pieces
}

/// A file of one long line (or of lines that all start with a space, where no line break
/// is a cut) is read in pieces of one to two `PIECE_BYTES`, so memory stays bounded by them
/// rather than by the line; they are cut before a space between words, else between
/// characters, and give the tokens of the whole.
#[test]
fn long_lines_are_read_in_bounded_pieces() {
    let dir = tempfile::tempdir().unwrap();
    let (d, n) = (dir.path(), 3 * PIECE_BYTES);
    let words = "the cät sät — ünïcode ok ".repeat(n / 28);
    let no_spaces = "日本語のテキスト".repeat(n / 24);
    let indented = "\n    an indented line".repeat(n / 22);
    for (name, body) in [
        ("words.txt", &words),
        ("no-spaces.txt", &no_spaces),
        ("indented.txt", &indented),
    ] {
        let source = write(d, name, body.as_bytes());
        let pieces = pieces(&source);
        let (last, rest) = pieces.split_last().unwrap();
        assert!(last.last && rest.iter().all(|p| !p.last), "{name}");
        for p in rest {
            assert!(
                (PIECE_BYTES - 3..=2 * PIECE_BYTES).contains(&p.bytes.len()),
                "{name}"
            );
        }
        assert!(last.bytes.len() <= 2 * PIECE_BYTES, "{name}");
        let mut offset = 0;
        for p in &pieces {
            assert_eq!(p.offset, offset, "{name}");
            offset += p.bytes.len();
            assert!(
                std::str::from_utf8(&p.bytes).is_ok(),
                "{name}: cut inside a character"
            );
        }
        let joined: Vec<u8> = pieces.iter().flat_map(|p| p.bytes.clone()).collect();
        assert_eq!(joined, body.as_bytes(), "{name}");
        assert_eq!(
            text(&prep(&source, TokenizerKind::Char, "text").unwrap()),
            *body
        );
    }
    let source = d.join("words.txt");
    for pair in pieces(&source).windows(2) {
        let (end, start) = (pair[0].bytes.last().unwrap(), &pair[1].bytes[..2]);
        assert!(
            !end.is_ascii_whitespace() && start[0] == b' ' && !start[1].is_ascii_whitespace(),
            "cut before a space between words"
        );
    }
    let gpt2 = prep(&source, TokenizerKind::Gpt2, "text").unwrap();
    let whole = Tokenizer::build(&TokenizerKind::Gpt2, "").unwrap();
    assert_eq!(
        gpt2.tokens.read(0..gpt2.tokens.len()),
        whole.encode(&words).unwrap()
    );
}

/// A word-level Hugging Face tokenizer with an end-of-text token, as JSON.
fn hf_tokenizer(dir: &Path) -> PathBuf {
    let json = serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null,
        "added_tokens": [{ "id": 9, "content": "<|endoftext|>", "single_word": false,
            "lstrip": false, "rstrip": false, "normalized": false, "special": true }],
        "normalizer": null, "pre_tokenizer": { "type": "Whitespace" },
        "post_processor": null, "decoder": null,
        "model": { "type": "WordLevel", "unk_token": "[UNK]", "vocab": {
            "the": 0, "cat": 1, "sat": 2, ".": 3, "a": 4, "dog": 5, "ran": 6, "far": 7,
            "[UNK]": 8, "<|endoftext|>": 9 } },
    });
    write(dir, "tokenizer.json", json.to_string().as_bytes())
}

#[test]
fn hugging_face_tokenizers_load_encode_and_separate_documents() {
    let dir = tempfile::tempdir().unwrap();
    let kind: TokenizerKind = format!("hf:{}", hf_tokenizer(dir.path()).display())
        .parse()
        .unwrap();
    let source = write(dir.path(), "c.jsonl", &jsonl(&DOCS[..2], "text"));
    let p = prep(&source, kind.clone(), "text").unwrap();
    assert_eq!(p.meta.vocab_size, 10, "its vocabulary sets the model's");
    assert_eq!(
        p.tokens.read(0..p.tokens.len()),
        [0, 1, 2, 3, 9, 4, 5, 6, 7]
    );
    let saved = dir.path().join("saved.json");
    p.tokenizer.save(&saved).unwrap();
    let loaded = Tokenizer::load(&saved).unwrap();
    assert_eq!(loaded.encode("the dog").unwrap(), [0, 5]);
    assert_eq!(loaded.end_of_text(), Some(9));
    assert_eq!(kind.to_string().parse::<TokenizerKind>().unwrap(), kind);
}

#[test]
fn bad_input_gets_one_clear_message() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let error = |source: &Path, kind: TokenizerKind, field: &str| {
        let out = source.with_extension("prepared");
        let err = prep(source, kind, field)
            .err()
            .expect("an error")
            .to_string();
        for file in ["meta.json", "tokens.tmp"] {
            assert!(!out.join(file).exists(), "nothing half-written: {err}");
        }
        err
    };
    let broken = write(d, "broken.jsonl", b"{\"text\": \"ok\"}\n{\"text\": oops}\n");
    let err = error(&broken, TokenizerKind::Char, "text");
    assert!(err.contains("broken.jsonl:2: not JSON"), "{err}");

    let missing = write(d, "missing.jsonl", &jsonl(&DOCS, "body"));
    let err = error(&missing, TokenizerKind::Char, "text");
    assert!(
        err.contains("missing.jsonl:1: no field \"text\" (set data.text_field)"),
        "{err}"
    );

    let table = d.join("table.parquet");
    parquet(&table, "body", &DOCS);
    let err = error(&table, TokenizerKind::Char, "text");
    assert!(
        err.contains("no column \"text\"") && err.contains("one of body"),
        "{err}"
    );

    let not_parquet = write(d, "fake.parquet", b"not a table");
    let err = error(&not_parquet, TokenizerKind::Char, "text");
    assert!(err.contains("not a Parquet file"), "{err}");

    let bad_tokenizer = write(d, "bad-tokenizer.json", b"{\"model\": 3}");
    let corpus = write(d, "ok.txt", b"the cat");
    let kind = TokenizerKind::Hf(bad_tokenizer);
    let err = error(&corpus, kind, "text");
    assert!(err.contains("not a Hugging Face tokenizer.json"), "{err}");

    let empty = write(d, "empty.jsonl", b"\n{\"text\": \"\"}\n");
    let err = error(&empty, TokenizerKind::Char, "text");
    assert!(err.contains("is empty"), "{err}");

    let nothing = d.join("nothing");
    std::fs::create_dir_all(&nothing).unwrap();
    write(&nothing, "notes.md", b"# not a corpus");
    let err = error(&nothing, TokenizerKind::Char, "text");
    assert!(err.contains("no .txt, .jsonl or .parquet files"), "{err}");

    let err = "hf:".parse::<TokenizerKind>().unwrap_err();
    assert!(err.contains("char, byte, gpt2, hf:PATH"), "{err}");
    for bad in ["bpe:256", "bpe:", "bpe:4k", "bpe:-300"] {
        let err = bad.parse::<TokenizerKind>().unwrap_err();
        assert!(err.contains("bpe:N with N a whole number ≥ 257"), "{err}");
    }
}
