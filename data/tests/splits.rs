//! Lists of corpora, the documents split (whole documents held out, drawn with a seed) and
//! BPE tokenizers trained on the training split, on small corpora the tests write.

use std::path::{Path, PathBuf};

use hla_data::DataError;
use hla_data::config::{Corpus, DataConfig, Task};
use hla_data::corpus::sources::Sources;
use hla_data::prepared::{Prepared, Settings, Split, held_out, prepare};
use hla_data::tokenizer::TokenizerKind;

fn write(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let path = dir.join(name);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(&path, bytes).unwrap();
    path
}

fn jsonl(docs: &[String]) -> Vec<u8> {
    docs.iter()
        .map(|d| serde_json::json!({ "text": d }).to_string() + "\n")
        .collect::<String>()
        .into_bytes()
}

/// Words of letters drawn from a small generator: text with pairs worth merging.
fn prose(seed: u64, words: usize) -> String {
    let mut state = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    let mut next = |n: u64| {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (state >> 33) % n
    };
    (0..words)
        .map(|_| {
            let len = 1 + next(6) as usize;
            (0..len)
                .map(|_| b"etaoinshrdlu"[next(12) as usize] as char)
                .collect::<String>()
        })
        .collect::<Vec<_>>()
        .join(" ")
}

fn settings(tokenizer: TokenizerKind, split: Split, seed: u64) -> Settings {
    Settings {
        tokenizer,
        train_fraction: 0.8,
        split,
        split_seed: seed,
        ..Settings::default()
    }
}

fn prep(source: &Path, settings: &Settings, out: &Path) -> Result<Prepared, DataError> {
    Ok(prepare(&Sources::find(source)?, settings, out)?.0)
}

/// The documents of `range`, decoded and cut at end-of-text.
fn documents(p: &Prepared, range: std::ops::Range<usize>) -> Vec<String> {
    let text = p.tokenizer.decode(&p.tokens.read(range)).unwrap();
    text.split("<|endoftext|>")
        .filter(|d| !d.is_empty())
        .map(String::from)
        .collect()
}

#[test]
fn corpus_lists_give_the_documents_of_each_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    write(d, "a/1.txt", b"first");
    write(d, "a/2.txt", b"second");
    let b = write(d, "b.jsonl", &jsonl(&["third".into(), "fourth".into()]));
    let config: DataConfig = serde_json::from_value(serde_json::json!({
        "corpus": [d.join("a"), b],
        "tokenizer": "byte",
        "train_fraction": 0.5,
    }))
    .unwrap();
    let Ok(Task::Text { corpus }) = config.task() else {
        panic!("a text task");
    };
    let (p, reused) = config
        .prepare_text(corpus, d, &d.join("cache"), false)
        .unwrap();
    assert!(!reused);
    assert_eq!(
        documents(&p, 0..p.tokens.len()),
        ["first", "second", "third", "fourth"]
    );
    assert_eq!((p.meta.files, p.meta.documents), (3, 4));
    // One corpus stays a string in a run's config; a list stays a list.
    let one = Corpus(vec!["sotu".into()]);
    assert_eq!(serde_json::to_value(&one).unwrap(), "sotu");
    let list = serde_json::to_value(&config.corpus).unwrap();
    assert_eq!(list.as_array().map(Vec::len), Some(2));

    let empty: DataConfig = serde_json::from_value(serde_json::json!({ "corpus": [] })).unwrap();
    let err = empty.task().err().unwrap().to_string();
    assert!(err.starts_with("data.corpus must be"), "{err}");
}

#[test]
fn the_documents_split_holds_out_whole_documents_drawn_with_a_seed() {
    let dir = tempfile::tempdir().unwrap();
    let docs: Vec<String> = (0..20)
        .map(|i| format!("document {i}: {}", prose(i, 5)))
        .collect();
    let source = write(dir.path(), "docs.jsonl", &jsonl(&docs));
    let at = |name: &str| dir.path().join(name);
    let settings = settings(TokenizerKind::Byte, Split::Documents, 7);
    let p = prep(&source, &settings, &at("p")).unwrap();
    let held: Vec<usize> = p.meta.valid_documents.iter().map(|h| h.index).collect();
    assert_eq!(held.len(), 4, "a fifth of 20 documents");
    assert!(held.is_sorted());
    assert_eq!(
        p.meta.valid_documents[0].source,
        format!("{}:{}", source.display(), held[0] + 1),
        "a JSONL document by its line"
    );
    // Training documents first, in order; then the held-out ones: no document in both.
    let train = documents(&p, p.train_range());
    let valid = documents(&p, p.valid_range());
    let (want_train, want_valid): (Vec<_>, Vec<_>) = (0..20).partition(|i| !held.contains(i));
    assert_eq!(
        train,
        want_train
            .iter()
            .map(|&i| docs[i].clone())
            .collect::<Vec<_>>()
    );
    assert_eq!(
        valid,
        want_valid
            .iter()
            .map(|&i| docs[i].clone())
            .collect::<Vec<_>>()
    );
    // The validation split starts at its first document's separator.
    assert_eq!(
        p.tokens.read(p.valid_range())[0],
        p.meta.end_of_text.unwrap()
    );
    // Bytes of text per split: the byte tokens less the separators.
    let bytes = |ds: &[String]| ds.iter().map(String::len).sum::<usize>() as u64;
    assert_eq!(
        (p.meta.train_bytes, p.meta.valid_bytes),
        (bytes(&train), bytes(&valid))
    );
    assert_eq!(p.meta.train_tokens as u64, p.meta.train_bytes + 15);

    // The same seed draws the same documents, byte for byte; another seed others.
    let again = prep(&source, &settings, &at("again")).unwrap();
    assert_eq!(
        std::fs::read(at("again/tokens.bin")).unwrap(),
        std::fs::read(at("p/tokens.bin")).unwrap()
    );
    assert_eq!(again.meta.valid_documents, p.meta.valid_documents);
    let other = prep(
        &source,
        &Settings {
            split_seed: 8,
            ..settings
        },
        &at("other"),
    )
    .unwrap();
    assert_ne!(other.meta.valid_documents, p.meta.valid_documents);

    // At least one document in each split, whatever the fraction.
    let count = |v: Vec<bool>| {
        (
            v.iter().filter(|&&h| !h).count(),
            v.iter().filter(|&&h| h).count(),
        )
    };
    assert_eq!(count(held_out(2, 0.9, 0).unwrap()), (1, 1));
    assert_eq!(count(held_out(10, 0.99, 0).unwrap()), (9, 1));
    assert_eq!(count(held_out(3, 0.01, 0).unwrap()), (1, 2));
}

#[test]
fn a_single_document_cannot_be_split_by_documents() {
    let dir = tempfile::tempdir().unwrap();
    let source = write(dir.path(), "one.txt", b"one document only");
    let settings = settings(TokenizerKind::Char, Split::Documents, 0);
    let err = prep(&source, &settings, &dir.path().join("p"))
        .err()
        .unwrap()
        .to_string();
    assert!(err.starts_with("data.split must be \"tail\""), "{err}");
    // The tail split of the same file: nanoGPT's, nothing held out by name.
    let tail = settings_tail(&source, dir.path());
    assert_eq!(tail.meta.split, Split::Tail);
    assert!(tail.meta.valid_documents.is_empty());
}

fn settings_tail(source: &Path, dir: &Path) -> Prepared {
    prep(
        source,
        &settings(TokenizerKind::Char, Split::Tail, 0),
        &dir.join("tail"),
    )
    .unwrap()
}

/// Held-out text (a word that appears nowhere else) never reaches the BPE: its letters stay
/// apart however often they repeat there.
#[test]
fn bpe_trains_on_the_training_split_only_and_deterministically() {
    let dir = tempfile::tempdir().unwrap();
    let unseen = "zqxj ".repeat(2000);
    for split in [Split::Tail, Split::Documents] {
        // A seed with which the documents split holds out document 4; the tail is its end.
        let mut docs: Vec<String> = (0..5).map(|i| prose(i, 2000)).collect();
        let seed = (0..).find(|&s| held_out(5, 0.75, s).unwrap()[4]).unwrap();
        docs[4] = unseen.clone();
        let source = write(dir.path(), &format!("{split}.jsonl"), &jsonl(&docs));
        let settings = Settings {
            train_fraction: 0.75,
            ..settings(TokenizerKind::Bpe(300), split, seed)
        };
        let at = |name: &str| dir.path().join(format!("{split}-{name}"));
        let p = prep(&source, &settings, &at("a")).unwrap();
        assert_eq!(p.meta.vocab_size, 300, "{split}");
        assert_eq!(p.meta.end_of_text, Some(0), "<|endoftext|> is id 0");
        assert_eq!(p.tokenizer.encode("zqxj").unwrap().len(), 4, "{split}");
        let tokens = p.tokenizer.encode(&docs[0]).unwrap().len();
        assert!(
            tokens * 10 < docs[0].len() * 8,
            "{split}: merges used: {tokens} tokens"
        );
        assert_eq!(documents(&p, 0..p.tokens.len()).concat(), docs.concat());
        let again = prep(&source, &settings, &at("b")).unwrap();
        for file in ["tokenizer.json", "tokens.bin"] {
            assert_eq!(
                std::fs::read(at("a").join(file)).unwrap(),
                std::fs::read(at("b").join(file)).unwrap(),
                "{split}: {file} byte for byte"
            );
        }
        assert_eq!(again.meta.valid_tokens, p.meta.valid_tokens);
    }
}
