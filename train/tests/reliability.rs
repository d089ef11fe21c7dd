//! `hla` under bad input and faults: preparations of the data cache at once (two real
//! processes), failed and stale ones; I/O errors printed once.

mod common;

use std::fs::File;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};

use common::{hla, ok, one_error, prepared_text, tiny_config};

/// `hla` with the environment of [`hla`], started and left running.
fn spawn(data_dir: &Path, args: &[&str]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_hla"))
        .args(args)
        .env("HLA_DATA_DIR", data_dir)
        .env("HLA_CACHE_DIR", data_dir.join("cache"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the hla binary runs")
}

fn stdout(output: &Output) -> String {
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{}: {stderr}", output.status);
    assert!(!stderr.contains("panicked"), "{stderr}");
    String::from_utf8(output.stdout.clone()).unwrap()
}

/// A config that prepares `corpus` with the char tokenizer.
fn prepare_config(dir: &Path, name: &str, corpus: &Path) -> String {
    let path = dir.join(format!("{name}.toml"));
    let toml = format!("[data]\ncorpus = \"{}\"\n", corpus.display());
    std::fs::write(&path, toml).unwrap();
    path.to_str().unwrap().to_string()
}

/// A JSONL corpus of `n` documents `"{word} {i}"`, and its documents as the char tokenizer
/// decodes them.
fn documents(path: &Path, word: &str, n: usize) -> String {
    let docs: Vec<String> = (0..n).map(|i| format!("{word} {i}")).collect();
    let lines: String = docs
        .iter()
        .map(|d| serde_json::json!({ "text": d }).to_string() + "\n")
        .collect();
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, lines).unwrap();
    docs.join("<|endoftext|>")
}

/// Two `hla prepare` processes at once: of two corpora with one file name, each gets its
/// own folder and tokens; of one corpus, one prepares while the other waits and re-uses.
#[test]
fn concurrent_preparations_are_safe() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let x_text = documents(&d.join("x/big.jsonl"), "apple", 60_000);
    let y_text = documents(&d.join("y/big.jsonl"), "zebra", 60_000);
    let x = prepare_config(d, "x", &d.join("x/big.jsonl"));
    let y = prepare_config(d, "y", &d.join("y/big.jsonl"));

    let both = [&x, &y].map(|config| spawn(d, &["prepare", "--config", config]));
    let [px, py] = both.map(|child| stdout(&child.wait_with_output().unwrap()));
    let ((x_dir, x_got), (y_dir, y_got)) = (prepared_text(&px), prepared_text(&py));
    assert_ne!(x_dir, y_dir);
    assert!(x_got == x_text && y_got == y_text, "each its own tokens");
    let again = ok(d, &["prepare", "--config", &x]);
    assert!(again.starts_with("re-using"), "{again}");
    assert_eq!(prepared_text(&again), (x_dir, x_text.clone()));

    let byte = ["prepare", "--config", &x, "--set", "data.tokenizer=byte"];
    let twice = [spawn(d, &byte), spawn(d, &byte)];
    let mut outputs = twice.map(|child| stdout(&child.wait_with_output().unwrap()));
    outputs.sort();
    assert!(
        outputs[0].starts_with("prepared") && outputs[1].starts_with("re-using"),
        "{outputs:?}"
    );
    let [a, b] = outputs.map(|out| prepared_text(&out));
    assert_eq!(a, b);
    assert_eq!(a.1, x_text);
}

/// A preparation that fails (an empty corpus of the same file name) leaves the earlier
/// good one as it was, and re-used.
#[test]
fn a_failed_preparation_keeps_the_good_one() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    documents(&d.join("a/data.jsonl"), "cat", 100);
    let a = prepare_config(d, "a", &d.join("a/data.jsonl"));
    let (good, _) = prepared_text(&ok(d, &["prepare", "--config", &a]));
    let files = |dir: &Path| -> Vec<Vec<u8>> {
        ["meta.json", "tokenizer.json", "tokens.bin"]
            .map(|f| std::fs::read(dir.join(f)).unwrap())
            .to_vec()
    };
    let before = files(&good);
    std::fs::create_dir_all(d.join("c")).unwrap();
    std::fs::write(d.join("c/data.jsonl"), "").unwrap();
    let c = prepare_config(d, "c", &d.join("c/data.jsonl"));
    one_error(&hla(d, &["prepare", "--config", &c]), 1, &["is empty"]);
    assert_eq!(files(&good), before);
    let again = ok(d, &["prepare", "--config", &a]);
    assert!(again.starts_with("re-using"), "{again}");
}

/// A corpus edited in place with its size and modification time kept is re-used by that
/// metadata, and `prepare` says that its hash is the one of the preparation; a real change
/// is prepared again, with the hash of the new bytes.
#[test]
fn reuse_says_what_was_compared() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let corpus = d.join("corpus.txt");
    std::fs::write(&corpus, "the cat sat").unwrap();
    let config = prepare_config(d, "c", &corpus);
    let first = ok(d, &["prepare", "--config", &config]);
    let sha = hla_data::corpus::sha256(b"the cat sat");
    assert!(first.contains(&format!("(sha256 {sha})")), "{first}");

    let modified = std::fs::metadata(&corpus).unwrap().modified().unwrap();
    std::fs::write(&corpus, "the dog sat").unwrap();
    File::options()
        .write(true)
        .open(&corpus)
        .unwrap()
        .set_modified(modified)
        .unwrap();
    let stale = ok(d, &["prepare", "--config", &config]);
    assert!(stale.starts_with("re-using"), "{stale}");
    assert!(
        stale.contains(&format!(
            "(sha256 {sha}, computed when prepared; unchanged since by path, size and \
             modification time)"
        )),
        "{stale}"
    );

    std::fs::write(&corpus, "the dog sat down").unwrap();
    let changed = ok(d, &["prepare", "--config", &config]);
    let sha = hla_data::corpus::sha256(b"the dog sat down");
    assert!(
        changed.starts_with("prepared") && changed.contains(&format!("(sha256 {sha})")),
        "{changed}"
    );
}

/// An I/O error prints its cause once (it used to repeat it: "Not a directory (os error
/// 20): Not a directory (os error 20)").
#[test]
fn io_errors_print_their_cause_once() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let config = tiny_config(d, "hla2");
    // The cache directory is a file.
    std::fs::write(d.join("cache"), "").unwrap();
    let output = hla(d, &["prepare", "--config", config.to_str().unwrap()]);
    let stderr = one_error(
        &output,
        1,
        &["cache/prepared: Not a directory (os error 20)"],
    );
    assert_eq!(stderr.matches("Not a directory").count(), 1, "{stderr}");
}
