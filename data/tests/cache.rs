//! The preparation cache: one folder per corpus and settings, failed and killed
//! preparations leave earlier ones alone. (Two processes at once: `train/tests/reliability/`.)

use std::path::{Path, PathBuf};

use hla_data::DataError;
use hla_data::corpus::sources::Sources;
use hla_data::prepared::{self, Prepared, Settings, Split, prepare};
use hla_data::tokenizer::TokenizerKind;

fn write(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let path = dir.join(name);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(&path, bytes).unwrap();
    path
}

fn jsonl(docs: &[&str]) -> Vec<u8> {
    docs.iter()
        .map(|d| serde_json::json!({ "text": d }).to_string() + "\n")
        .collect::<String>()
        .into_bytes()
}

fn settings(tokenizer: TokenizerKind) -> Settings {
    Settings {
        tokenizer,
        text_field: "text".into(),
        train_fraction: 0.9,
        ..Settings::default()
    }
}

/// Prepares `source` into its cache folder under `cache_dir`, as `hla prepare` does.
fn prep(source: &Path, cache_dir: &Path) -> Result<(Prepared, bool), DataError> {
    let settings = settings(TokenizerKind::Char);
    let dir = prepared::folder(cache_dir, &[source.into()], &settings);
    prepare(&Sources::find(source)?, &settings, &dir)
}

/// The documents of a prepared corpus, decoded.
fn text(p: &Prepared) -> String {
    p.tokenizer
        .decode(&p.tokens.read(0..p.tokens.len()))
        .unwrap()
}

/// Every file of a folder, by name, with its bytes.
fn files(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut files: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let path = e.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            (name, std::fs::read(&path).unwrap())
        })
        .collect();
    files.sort();
    files
}

#[test]
fn corpora_of_one_name_never_share_a_folder() {
    let dir = tempfile::tempdir().unwrap();
    let (d, cache_dir) = (dir.path(), dir.path().join("cache"));
    let x = write(d, "x/big.jsonl", &jsonl(&["apple pie"]));
    let y = write(d, "y/big.jsonl", &jsonl(&["zebra crossing"]));
    let (px, _) = prep(&x, &cache_dir).unwrap();
    let (py, reused) = prep(&y, &cache_dir).unwrap();
    assert!(!reused, "another corpus");
    assert_ne!(px.dir, py.dir);
    assert_eq!(text(&py), "zebra crossing");
    let (again, reused) = prep(&x, &cache_dir).unwrap();
    assert!(reused);
    assert_eq!(
        (again.dir.clone(), text(&again)),
        (px.dir.clone(), "apple pie".into())
    );

    // Every setting is part of the key; the name stays readable.
    let base = settings(TokenizerKind::Char);
    let folder = |s: &Settings| prepared::folder(&cache_dir, std::slice::from_ref(&x), s);
    let others = [
        settings(TokenizerKind::Byte),
        settings(TokenizerKind::Bpe(300)),
        settings(TokenizerKind::Bpe(301)),
        Settings {
            text_field: "body".into(),
            ..base.clone()
        },
        Settings {
            train_fraction: 0.8,
            ..base.clone()
        },
        Settings {
            split: Split::Documents,
            ..base.clone()
        },
        Settings {
            split_seed: 1,
            ..base.clone()
        },
    ];
    for (i, other) in others.iter().enumerate() {
        assert_ne!(folder(other), folder(&base), "{other:?}");
        for earlier in &others[..i] {
            assert_ne!(folder(other), folder(earlier), "{other:?}");
        }
    }
    // A list of corpora by every member, in order.
    let list = |l: &[&PathBuf]| {
        let l: Vec<PathBuf> = l.iter().map(|p| p.to_path_buf()).collect();
        prepared::folder(&cache_dir, &l, &base)
    };
    assert_ne!(list(&[&x, &y]), list(&[&x]));
    assert_ne!(list(&[&x, &y]), list(&[&y, &x]));
    let name = list(&[&x, &y])
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    assert!(name.starts_with("big+1-char-"), "{name}");
    // A Hugging Face tokenizer by its contents too: an edited file is another tokenizer.
    let tokenizer = write(d, "tokenizer.json", br#"{"version": 1}"#);
    let hf = settings(TokenizerKind::Hf(tokenizer.clone()));
    let before = folder(&hf);
    assert_eq!(folder(&hf), before, "the same file, the same folder");
    write(d, "tokenizer.json", br#"{"version": 2}"#);
    assert_ne!(folder(&hf), before, "an edited tokenizer file");
    let name = px.dir.file_name().unwrap().to_string_lossy().into_owned();
    assert!(name.starts_with("big-char-"), "{name}");
}

#[test]
fn a_failed_preparation_leaves_the_earlier_one_alone() {
    let dir = tempfile::tempdir().unwrap();
    let (d, cache_dir) = (dir.path(), dir.path().join("cache"));
    let a = write(d, "a/data.jsonl", &jsonl(&["the cat sat"]));
    let (good, _) = prep(&a, &cache_dir).unwrap();
    let before = files(&good.dir);
    drop(good);

    // Another corpus of the same name, empty.
    let c = write(d, "c/data.jsonl", b"");
    let err = prep(&c, &cache_dir).err().unwrap();
    assert!(err.to_string().contains("is empty"), "{err}");
    // The same corpus, emptied: its earlier preparation no longer matches, and stays.
    write(d, "a/data.jsonl", b"\n");
    let err = prep(&a, &cache_dir).err().unwrap();
    assert!(err.to_string().contains("is empty"), "{err}");

    let dir = prepared::folder(
        &cache_dir,
        std::slice::from_ref(&a),
        &settings(TokenizerKind::Char),
    );
    assert_eq!(files(&dir), before, "the good preparation is untouched");
    let mut left: Vec<String> = std::fs::read_dir(cache_dir.join("prepared"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| !name.ends_with(".lock"))
        .collect();
    left.sort();
    let name = dir.file_name().unwrap().to_string_lossy().into_owned();
    assert_eq!(left, [name], "no half-written folder stays behind");
}

#[test]
fn what_a_killed_preparation_left_is_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let (d, cache_dir) = (dir.path(), dir.path().join("cache"));
    let a = write(d, "a.txt", b"the cat sat");
    let folder = prepared::folder(
        &cache_dir,
        std::slice::from_ref(&a),
        &settings(TokenizerKind::Char),
    );
    let sibling = |suffix: &str| PathBuf::from(format!("{}{suffix}", folder.display()));
    // Killed while writing its temporary folder, and while swapping folders.
    write(&sibling(".part"), "tokens.bin", b"half");
    write(&sibling(".old"), "meta.json", b"{}");
    write(&folder, "tokens.bin", b"stale, no metadata");
    let (p, reused) = prep(&a, &cache_dir).unwrap();
    assert!(!reused);
    assert_eq!(
        (p.dir.clone(), text(&p)),
        (folder.clone(), "the cat sat".into())
    );
    assert!(!sibling(".part").exists() && !sibling(".old").exists());
}
