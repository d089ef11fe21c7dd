//! `hla` under bad input and faults: preparations of the data cache at once (two real
//! processes), failed and stale ones; size keys; usage mistakes and their exit status; I/O
//! errors printed once; what a run folder guarantees ([`run_folder`]). A full disk:
//! `full_disk.rs`.

#[path = "../common/mod.rs"]
mod common;
mod run_folder;

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
    assert_eq!(prepared_text(&again), (x_dir.clone(), x_text.clone()));
    let forced = ok(d, &["prepare", "--config", &x, "--force"]);
    assert!(
        forced.starts_with("prepared"),
        "--force tokenizes again: {forced}"
    );
    assert_eq!(prepared_text(&forced), (x_dir, x_text.clone()));

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

/// Every size key is checked before anything runs: one message naming the key, exit
/// status 2, no panic, no run directory left.
#[test]
fn size_keys_are_checked() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let text = tiny_config(d, "hla2");
    let mqar = mqar_config(d);
    let text_cases = model_and_train_keys()
        .into_iter()
        .map(|c| (text.as_path(), c));
    let mqar_cases = mqar_keys().into_iter().map(|c| (mqar.as_path(), c));
    let fresh = d.join("fresh");
    for (config, (set, message)) in text_cases.chain(mqar_cases) {
        let config = config.to_str().unwrap();
        for command in ["info", "train"] {
            let mut args = vec![command, "--config", config, "--set", &set];
            if command == "train" {
                args.extend(["--out", fresh.to_str().unwrap()]);
            }
            one_error(&hla(d, &args), 2, &[&message]);
        }
        assert!(!fresh.exists(), "{set}: no run directory");
    }
}

/// What serde says of a negative or fractional size.
const WHOLE: &str = "expected a whole number ≥ 0";

/// A `--set KEY=VALUE` and a part of the one message it must get.
fn case(set: &str, message: &str) -> (String, String) {
    (set.into(), message.into())
}

/// The size keys of `[model]` and `[train]`: zero, negative, fractional and 1e20.
fn model_and_train_keys() -> Vec<(String, String)> {
    vec![
        case("model.d_model=0", "model.d_model must be at least 1, got 0"),
        case(
            "model.d_model=-1",
            &format!("model.d_model: invalid value: integer `-1`, {WHOLE}"),
        ),
        case("model.n_layers=0", "model.n_layers must be at least 1"),
        case(
            "model.n_heads=0",
            "model.n_heads must be a divisor of d_model",
        ),
        case("model.chunk_size=0", "model.chunk_size must be at least 1"),
        case(
            "model.max_seq_len=0",
            "model.max_seq_len must be at least 1",
        ),
        case(
            "model.short_conv=1",
            "model.short_conv must be 0 (off) or a kernel of at least 2",
        ),
        case(
            "model.d_ff=-3",
            &format!("model.d_ff: invalid value: integer `-3`, {WHOLE}"),
        ),
        case(
            "model.segment_size=2.5",
            &format!("model.segment_size: invalid type: floating point `2.5`, {WHOLE}"),
        ),
        case(
            "train.steps=1e20",
            &format!(
                "train.steps: invalid type: floating point `100000000000000000000.0`, {WHOLE}"
            ),
        ),
        case("train.steps=0", "train.steps must be at least 1"),
        case("train.context=0", "train.context must be at least 1"),
        case("train.batch_size=0", "train.batch_size must be at least 1"),
        case(
            "train.grad_accumulation=0",
            "train.grad_accumulation must be at least 1",
        ),
        case(
            "train.eval_interval=0",
            "train.eval_interval must be at least 1",
        ),
        case(
            "train.eval_batches=0",
            "train.eval_batches must be at least 1",
        ),
        case(
            "train.keep_checkpoints=0",
            "train.keep_checkpoints must be at least 1",
        ),
        case(
            "train.seed=-1",
            &format!("train.seed: invalid value: integer `-1`, {WHOLE}"),
        ),
    ]
}

/// `data.mqar.settings` of one setting with `train` examples of `pairs` key-value pairs.
fn mqar_setting(train: i64, pairs: i64) -> String {
    format!(
        "data.mqar.settings=[{{ seq_len = 16, num_kv_pairs = {pairs}, train_examples = \
         {train}, test_examples = 8 }}]"
    )
}

/// A small MQAR config, written into `dir`.
fn mqar_config(dir: &Path) -> std::path::PathBuf {
    let mqar = dir.join("mqar.toml");
    let config = format!(
        "[model]\nd_model = 32\nn_layers = 1\nn_heads = 2\n\n[data.mqar]\nvocab_size = 32\n\
         {}\n\n[train]\nbatch_size = 8\nsteps = 2\neval_interval = 2\n",
        mqar_setting(64, 2).trim_start_matches("data.mqar.")
    );
    std::fs::write(&mqar, config).unwrap();
    mqar
}

/// The size keys of `[data.mqar]`, of the MQAR config.
fn mqar_keys() -> Vec<(String, String)> {
    vec![
        case(
            "data.mqar.vocab_size=-1",
            &format!("data.mqar.vocab_size: invalid value: integer `-1`, {WHOLE}"),
        ),
        case(
            &mqar_setting(0, 2),
            "mqar.train_examples must be at least 1 in some setting",
        ),
        case(
            &mqar_setting(64, -2),
            &format!("data.mqar.settings[0].num_kv_pairs: invalid value: integer `-2`, {WHOLE}"),
        ),
    ]
}

/// A run that fails after claiming its directory but before writing to it (an empty
/// corpus) leaves no directory behind.
#[test]
fn a_run_that_fails_before_training_leaves_no_directory() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let config = tiny_config(d, "hla2");
    std::fs::write(d.join("empty.txt"), "").unwrap();
    let corpus = format!("data.corpus=\"{}\"", d.join("empty.txt").display());
    let fresh = d.join("fresh");
    let args = [
        "train",
        "--config",
        config.to_str().unwrap(),
        "--out",
        fresh.to_str().unwrap(),
        "--set",
        &corpus,
    ];
    one_error(&hla(d, &args), 1, &["is empty"]);
    assert!(!fresh.exists());
}

/// Usage mistakes exit with status 2 and one message naming the flag or what to pass:
/// `generate`'s values (`--temperature -1` read as a value, not a flag), training into a
/// finished run, exporting over an export.
#[test]
fn usage_mistakes_exit_with_2() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let config = tiny_config(d, "linear");
    let run = d.join("run");
    let (config, run) = (config.to_str().unwrap(), run.to_str().unwrap());
    ok(d, &["train", "--config", config, "--out", run]);
    let export = d.join("export");
    let export = export.to_str().unwrap();
    ok(d, &["export", "--run", run, "--out", export]);
    let generate = |extra: &[&'static str]| {
        let mut args = vec![
            "generate",
            "--run",
            run,
            "--prompt",
            "the",
            "--max-tokens",
            "3",
        ];
        args.extend(extra);
        args
    };
    let flag = |name: &str, value: &str| format!("invalid value '{value}' for '--{name} <");
    let cases: Vec<(Vec<&str>, String)> = vec![
        (generate(&["--top-k", "0"]), flag("top-k", "0")),
        (
            generate(&["--temperature", "nan"]),
            flag("temperature", "nan"),
        ),
        (
            generate(&["--temperature", "-1"]),
            flag("temperature", "-1"),
        ),
        (
            generate(&["--temperature", "inf"]),
            flag("temperature", "inf"),
        ),
        (
            vec!["generate", "--run", run, "--prompt", ""],
            "a value is required for '--prompt <PROMPT>'".into(),
        ),
        (
            vec!["train", "--config", config, "--out", run],
            "already holds a run; pass --resume to continue it or --force".into(),
        ),
        (vec!["train", "--resume"], "--resume needs --out".into()),
        (
            vec!["export", "--run", run, "--out", export],
            "already holds an export".into(),
        ),
    ];
    for (args, message) in cases {
        one_error(&hla(d, &args), 2, &[&message]);
    }
    let zero = ok(d, &generate(&["--temperature", "0", "--top-k", "2"]));
    assert!(zero.starts_with("the"), "{zero}");
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
