//! Tokenizers, corpora, prepared token files and the windows read from them.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use burn::data::dataset::Dataset;
use hla_data::DataError;
use hla_data::corpus::sources::Sources;
use hla_data::corpus::{self, NamedCorpus, Origin};
use hla_data::prepared::{Prepared, Settings, TokenFile, prepare};
use hla_data::tokenizer::{Tokenizer, TokenizerKind};
use hla_data::windows::{FullPass, RandomWindows};

const TEXT: &str =
    "First Citizen:\nBefore we proceed any further, hear me speak.\nÀ bientôt, ünïcode — ok?\n";

#[test]
fn tokenizers_round_trip() {
    for kind in [
        TokenizerKind::Char,
        TokenizerKind::Byte,
        TokenizerKind::Gpt2,
        TokenizerKind::Bpe(280),
    ] {
        let tokenizer = Tokenizer::build(&kind, TEXT).unwrap();
        let tokens = tokenizer.encode(TEXT).unwrap();
        assert_eq!(tokenizer.decode(&tokens).unwrap(), TEXT, "{kind}");
        assert!(
            tokens
                .iter()
                .all(|&t| (t as usize) < tokenizer.vocab_size())
        );
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokenizer.json");
        tokenizer.save(&path).unwrap();
        let loaded = Tokenizer::load(&path).unwrap();
        assert_eq!(
            loaded.encode(TEXT).unwrap(),
            tokens,
            "{kind} after save and load"
        );
    }
    let chars = Tokenizer::build(&TokenizerKind::Char, "banana").unwrap();
    assert_eq!(chars.vocab_size(), 3);
    assert_eq!(
        chars.encode("nab").unwrap(),
        vec![2, 0, 1],
        "sorted characters"
    );
    assert!(matches!(
        chars.encode("band"),
        Err(DataError::UnknownChar('d'))
    ));
    assert_eq!(
        Tokenizer::build(&TokenizerKind::Gpt2, "")
            .unwrap()
            .vocab_size(),
        50257
    );
}

/// Prepares `source` with `tokenizer` (the JSONL field `text`).
fn prep(
    source: &Path,
    tokenizer: TokenizerKind,
    train_fraction: f64,
    dir: &Path,
) -> Result<(Prepared, bool), DataError> {
    let settings = Settings {
        tokenizer,
        text_field: "text".into(),
        train_fraction,
        ..Settings::default()
    };
    prepare(&Sources::find(source)?, &settings, dir)
}

fn write(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let path = dir.join(name);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(&path, bytes).unwrap();
    path
}

#[test]
fn directories_are_read_recursively_in_path_order() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "b.txt", b"second");
    write(dir.path(), "a/deep.txt", b"first");
    write(dir.path(), "c/skip.md", b"not text");
    let sources = Sources::find(dir.path()).unwrap();
    let names: Vec<_> = sources.files.iter().map(|f| f.path.clone()).collect();
    assert_eq!(
        names,
        [dir.path().join("a/deep.txt"), dir.path().join("b.txt")]
    );
    let (p, _) = prep(dir.path(), TokenizerKind::Char, 0.5, &dir.path().join("p")).unwrap();
    assert_eq!(
        p.tokenizer
            .decode(&p.tokens.read(0..p.tokens.len()))
            .unwrap(),
        "first<|endoftext|>second",
        "one document per file, end-of-text between them"
    );
    assert_eq!((p.meta.documents, p.meta.files), (2, 2));
}

#[test]
fn bad_corpora_are_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let empty = write(dir.path(), "empty.txt", b"");
    assert!(matches!(
        prep(&empty, TokenizerKind::Char, 0.9, &dir.path().join("e")),
        Err(DataError::EmptyCorpus(_))
    ));
    let binary = write(dir.path(), "bin.txt", &[b'o', b'k', 0xff, 0xfe]);
    let err = prep(&binary, TokenizerKind::Char, 0.9, &dir.path().join("p"))
        .err()
        .unwrap();
    assert!(
        matches!(err, DataError::InvalidUtf8 { offset: 2, .. }),
        "{err}"
    );
    assert!(prep(&binary, TokenizerKind::Byte, 0.9, &dir.path().join("p")).is_ok());
    let missing = dir.path().join("nope.txt");
    assert!(matches!(
        corpus::resolve(missing.to_str().unwrap(), dir.path()),
        Err(DataError::MissingPath(_))
    ));

    let short = write(dir.path(), "short.txt", b"abcdefghij");
    let (p, _) = prep(&short, TokenizerKind::Char, 0.5, &dir.path().join("s")).unwrap();
    let tokens = Arc::new(p.tokens);
    let err = RandomWindows::new(tokens.clone(), p.meta.train_tokens..p.meta.tokens, 5, 10, 0)
        .err()
        .unwrap();
    assert_eq!(
        err.to_string(),
        "the validation split has 5 tokens, fewer than the 6 one window needs (context + 1)"
    );
    assert!(FullPass::new(tokens, 0..5, 4).is_ok());
}

#[test]
fn prepared_tokens_are_the_encoded_corpus_and_are_reused() {
    let dir = tempfile::tempdir().unwrap();
    let source = write(dir.path(), "corpus.txt", TEXT.repeat(5).as_bytes());
    let out = dir.path().join("prepared");
    let (p, reused) = prep(&source, TokenizerKind::Char, 0.9, &out).unwrap();
    assert!(!reused);
    let expected = p.tokenizer.encode(&TEXT.repeat(5)).unwrap();
    assert_eq!(p.tokens.read(0..p.tokens.len()), expected);
    assert_eq!(p.meta.token_bytes, 2);
    assert_eq!(p.meta.train_tokens, (expected.len() as f64 * 0.9) as usize);
    assert_eq!(
        p.train_range().len() + p.valid_range().len(),
        expected.len()
    );
    assert_eq!(
        p.meta.source_sha256,
        corpus::sha256(TEXT.repeat(5).as_bytes())
    );

    let (again, reused) = prep(&source, TokenizerKind::Char, 0.9, &out).unwrap();
    assert!(reused, "same source, same settings");
    assert_eq!(again.meta, p.meta);
    std::fs::write(&source, TEXT.repeat(6)).unwrap();
    let (changed, reused) = prep(&source, TokenizerKind::Char, 0.9, &out).unwrap();
    assert!(!reused, "the source changed");
    assert_eq!(changed.tokens.len(), TEXT.chars().count() * 6);
}

#[test]
fn token_files_of_u32_tokens_read_back() {
    let dir = tempfile::tempdir().unwrap();
    let tokens: Vec<u32> = vec![0, 70_000, 5, u32::MAX];
    let bytes: Vec<u8> = tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
    let path = write(dir.path(), "t.bin", &bytes);
    let file = TokenFile::open(&path, 4).unwrap();
    assert_eq!(file.read(1..4), tokens[1..].to_vec());
    let odd = write(dir.path(), "odd.bin", &bytes[..7]);
    assert!(matches!(
        TokenFile::open(&odd, 4),
        Err(DataError::Corrupt { .. })
    ));
}

#[test]
fn windows_are_the_raw_tokens() {
    let dir = tempfile::tempdir().unwrap();
    let source = write(dir.path(), "c.txt", TEXT.repeat(20).as_bytes());
    let (p, _) = prep(&source, TokenizerKind::Byte, 0.9, &dir.path().join("p")).unwrap();
    let raw = TEXT.repeat(20).into_bytes();
    let (train, valid) = (p.train_range(), p.valid_range());
    let tokens = Arc::new(p.tokens);

    let windows = RandomWindows::new(tokens.clone(), train.clone(), 16, 50, 7).unwrap();
    assert_eq!(windows.len(), 50);
    for i in 0..50 {
        let item = windows.get(i).unwrap();
        assert_eq!(
            item,
            windows.get(i).unwrap(),
            "the same index gives the same window"
        );
        let start = (train.start..train.end - 16)
            .find(|&s| {
                raw[s..s + 16]
                    .iter()
                    .map(|&b| u32::from(b))
                    .eq(item.inputs.iter().copied())
            })
            .expect("a window of the corpus");
        let targets: Vec<u32> = raw[start + 1..start + 17]
            .iter()
            .map(|&b| b.into())
            .collect();
        assert_eq!(item.targets, targets);
        assert!(start + 17 <= train.end, "inside the training split");
    }
    let other = RandomWindows::new(tokens.clone(), train, 16, 50, 8).unwrap();
    assert!(
        (0..50).any(|i| other.get(i).unwrap() != windows.get(i).unwrap()),
        "seeds differ"
    );

    let pass = FullPass::new(tokens, valid.clone(), 16).unwrap();
    let inputs: Vec<u32> = (0..pass.len())
        .flat_map(|i| pass.get(i).unwrap().inputs)
        .collect();
    let expected: Vec<u32> = raw[valid.start..valid.end - 1]
        .iter()
        .map(|&b| b.into())
        .collect();
    assert_eq!(
        inputs, expected,
        "a full pass scores every validation token once"
    );
}

/// nanoGPT's shakespeare_char numbers, from the shared copy of the corpus.
#[test]
fn tinyshakespeare_split_matches_nanogpt() {
    let shared = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/data");
    if !shared.join("tinyshakespeare.txt").exists() {
        eprintln!("skipped: {} has no tinyshakespeare.txt", shared.display());
        return;
    }
    let source = corpus::resolve("tinyshakespeare", &shared).unwrap();
    let out = tempfile::tempdir().unwrap();
    let (p, _) = prep(&source, TokenizerKind::Char, 0.9, out.path()).unwrap();
    assert_eq!(p.meta.vocab_size, 65);
    assert_eq!(p.meta.source_sha256, corpus::TINYSHAKESPEARE.sha256);
    assert_eq!(
        (p.meta.train_tokens, p.meta.valid_tokens),
        (1_003_854, 111_540)
    );
}

/// Serves `body` once over HTTP on a loopback port; returns the URL.
fn serve_once(body: Vec<u8>) -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        let (mut stream, _) = listener.accept().unwrap();
        let mut request = [0u8; 4096];
        let _ = stream.read(&mut request);
        let head = format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        );
        stream.write_all(head.as_bytes()).unwrap();
        stream.write_all(&body).unwrap();
    });
    format!("http://127.0.0.1:{port}/corpus.txt")
}

#[test]
fn named_corpora_download_once_with_a_checksum() {
    let body = TEXT.repeat(100).into_bytes();
    let sha: &'static str = Box::leak(corpus::sha256(&body).into_boxed_str());
    let url = |url: String| Origin::Url(Box::leak(url.into_boxed_str()));
    let named = NamedCorpus {
        name: "tiny",
        file: "tiny.txt",
        origin: url(serve_once(body.clone())),
        sha256: sha,
        licence: "",
    };
    let dir = tempfile::tempdir().unwrap();
    let npm = Path::new(corpus::NPM);
    let path = corpus::fetch(&named, dir.path(), npm).unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), body);
    // Present now: no second download (a request would find no server).
    let gone = NamedCorpus {
        origin: url("http://127.0.0.1:9/none".into()),
        ..named
    };
    assert_eq!(corpus::fetch(&gone, dir.path(), npm).unwrap(), path);

    let wrong = NamedCorpus {
        sha256: "00",
        file: "wrong.txt",
        origin: url(serve_once(body)),
        ..named
    };
    let err = corpus::fetch(&wrong, dir.path(), npm)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("sha256") && err.contains("HLA_DATA_DIR"),
        "{err}"
    );
    assert!(!dir.path().join("wrong.txt").exists() && !dir.path().join("wrong.part").exists());
}

/// A maker of the training windows (8 bytes) of a small byte-level corpus in `dir`.
fn byte_windows(dir: &Path) -> impl Fn() -> hla_data::windows::AllWindows {
    let source = write(dir, "c.txt", TEXT.repeat(10).as_bytes());
    let (p, _) = prep(&source, TokenizerKind::Byte, 0.9, &dir.join("p")).unwrap();
    let range = p.train_range();
    let tokens = Arc::new(p.tokens);
    move || hla_data::windows::AllWindows::new(tokens.clone(), range.clone(), 8).unwrap()
}

/// Draws resumed after k reads continue the sequence of an uninterrupted run.
#[test]
fn draws_resume_where_they_stopped() {
    use hla_data::windows::Draws;
    let dir = tempfile::tempdir().unwrap();
    let windows = byte_windows(dir.path());
    let whole = Draws::new(windows(), 6, 3, 0);
    let run: Vec<_> = (0..12).map(|i| whole.get(i % 6).unwrap()).collect();
    let resumed = Draws::new(windows(), 6, 3, 6);
    let tail: Vec<_> = (0..6).map(|i| resumed.get(i).unwrap()).collect();
    assert_eq!(tail, run[6..]);
    assert_ne!(run[..6], run[6..], "each epoch draws new windows");
}

/// Split over devices, step `s` of the parts, in part order, reads the draws of step `s`
/// of one loader with the whole batch, whatever the order of reads, in every epoch.
#[test]
fn split_draws_give_each_step_the_one_device_batch() {
    use hla_data::windows::Draws;
    let dir = tempfile::tempdir().unwrap();
    let windows = byte_windows(dir.path());
    // 2 epochs of 4 steps with batch 6: one loader, then 3 parts with batch 2, each part
    // read backwards so that the read order differs.
    let one = Draws::new(windows(), 24, 5, 0);
    let one: Vec<_> = (0..48).map(|i| one.get(i % 24).unwrap()).collect();
    let split = Draws::new(windows(), 24, 5, 0).split(3, 2).unwrap();
    for epoch in 0..2 {
        let mut reads = vec![None; 24];
        for j in (0..24).rev() {
            reads[j] = Some(split.get(j).unwrap());
        }
        for step in 0..4 {
            let together: Vec<_> = (0..3)
                .flat_map(|part| (0..2).map(move |p| part * 8 + step * 2 + p))
                .map(|j| reads[j].clone().unwrap())
                .collect();
            let expected = &one[epoch * 24 + step * 6..][..6];
            assert_eq!(together, expected, "epoch {epoch}, step {step}");
        }
    }
    assert!(Draws::new(windows(), 24, 5, 0).split(5, 2).is_err());
}
