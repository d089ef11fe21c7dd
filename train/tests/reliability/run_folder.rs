//! What a run folder guarantees: a resume cannot change the run's identity or skip or repeat
//! a step, an export cannot overwrite what it reads, a corpus folder is read once per real
//! file, a lock names its owner, and nothing is left behind or passed over in silence.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::common::{hla, ok, one_error, process_start, read_json, tiny_config, train};

/// Every file under `dir` with its bytes (`run.lock` aside: a refused command takes it).
fn snapshot(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut files = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(at) = stack.pop() {
        for entry in std::fs::read_dir(&at).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else if path.file_name().unwrap() != "run.lock" {
                files.insert(path.clone(), std::fs::read(&path).unwrap());
            }
        }
    }
    files
}

/// A finished tiny hla2 run (`steps` steps, a validation every `interval`) in `dir/name`.
fn trained(dir: &Path, name: &str, steps: usize, interval: usize) -> PathBuf {
    let config = tiny_config(dir, "hla2");
    let (steps, interval) = (
        format!("train.steps={steps}"),
        format!("train.eval_interval={interval}"),
    );
    let sets = ["--set", &steps, "--set", &interval];
    train(
        dir,
        &config,
        name,
        &[&sets[..], &["--set", "train.keep_checkpoints=20"]].concat(),
    )
}

/// A resume that would change what the run is (its model, data, tokenizer, seed or batch
/// shape) is refused with every key named, exit status 2, and the folder untouched.
#[test]
fn a_resume_cannot_change_the_run() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let run = trained(d, "run", 4, 2);
    let run_s = run.to_str().unwrap();
    let before = snapshot(&run);
    let refused = [
        (
            vec!["model.d_model=64", "data.tokenizer=\"byte\""],
            vec![
                "model.d_model: 32 (recorded) → 64",
                "data.tokenizer: \"char\" (recorded) → \"byte\"",
            ],
        ),
        (
            vec!["model.mixer=softmax"],
            vec!["model.mixer: \"hla2\" (recorded) → \"softmax\""],
        ),
        (
            vec!["train.seed=7"],
            vec!["train.seed: 1337 (recorded) → 7"],
        ),
        (
            vec!["train.batch_size=4"],
            vec!["train.batch_size: 8 (recorded) → 4"],
        ),
    ];
    for (sets, named) in refused {
        let mut args = vec!["train", "--out", run_s, "--resume"];
        for set in &sets {
            args.extend(["--set", set]);
        }
        let output = hla(d, &args);
        assert_eq!(output.status.code(), Some(2), "{sets:?}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!stderr.contains("panicked"), "{stderr}");
        for part in named.iter().chain(&["--force"]) {
            assert!(stderr.contains(part), "{part:?} not in {stderr}");
        }
        assert_eq!(snapshot(&run), before, "{sets:?} changed the folder");
    }
}

/// The step a run resumes at is the one its checkpoint was taken at, whatever the cadence
/// is now: a run resumed at step 4 with a validation every step ends exactly as the run
/// that never stopped, and its metrics put each validation at its step.
#[test]
fn a_resume_starts_at_the_checkpoint_step_whatever_the_cadence() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let whole = trained(d, "whole", 8, 2);
    let cut = trained(d, "cut", 8, 2);
    // Back to step 4: the checkpoints of steps 6 and 8, and the finished model, gone.
    for file in [
        "model.bpk",
        "metrics.json",
        "checkpoint/model-3.bpk",
        "checkpoint/model-4.bpk",
    ] {
        std::fs::remove_file(cut.join(file)).unwrap();
    }
    assert_eq!(read_json(&cut.join("checkpoint/state-2.json"))["step"], 4);
    for (interval, log) in [("1", "resuming at step 4"), ("4", "resuming at step 4")] {
        let resumed = ok(
            d,
            &[
                "train",
                "--out",
                cut.to_str().unwrap(),
                "--resume",
                "--set",
                &format!("train.eval_interval={interval}"),
            ],
        );
        assert!(
            resumed.contains(log) && resumed.contains("step      8/8"),
            "{resumed}"
        );
        assert_eq!(
            read_json(&cut.join("metrics.json"))["validation"],
            read_json(&whole.join("metrics.json"))["validation"],
            "interval {interval}: not the uninterrupted run's result"
        );
        let history = read_json(&cut.join("history.json"));
        let last = &history["segments"][1];
        assert_eq!(last["first_step"], 4, "{history}");
        assert_eq!(last["eval_interval"].to_string(), interval, "{history}");
        assert_eq!(
            last["changed"][0]["key"], "train.eval_interval",
            "{history}"
        );
        if interval == "1" {
            let csv = std::fs::read_to_string(cut.join("metrics.csv")).unwrap();
            let steps: Vec<&str> = csv
                .lines()
                .filter(|l| l.contains(",valid,loss,"))
                .map(|l| l.split(',').next().unwrap())
                .collect();
            assert_eq!(steps, ["2", "4", "5", "6", "7", "8"], "{csv}");
        }
        // Again from step 4 with the other cadence.
        for epoch in 3..=6 {
            let _ = std::fs::remove_file(cut.join(format!("checkpoint/model-{epoch}.bpk")));
        }
        std::fs::remove_file(cut.join("metrics.json")).unwrap();
    }
    // Steps left that are not a whole number of intervals: refused, naming both.
    let output = hla(
        d,
        &[
            "train",
            "--out",
            cut.to_str().unwrap(),
            "--resume",
            "--set",
            "train.eval_interval=3",
            "--set",
            "train.steps=9",
        ],
    );
    one_error(
        &output,
        2,
        &["resumes at step 4", "train.eval_interval (3)"],
    );
}

/// A truncated newest checkpoint: the resume falls back to the one before and says so.
#[test]
fn a_fallback_to_an_older_checkpoint_is_announced() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let run = trained(d, "run", 4, 2);
    let newest = run.join("checkpoint/model-2.bpk");
    let bytes = std::fs::read(&newest).unwrap();
    std::fs::write(&newest, &bytes[..bytes.len() / 2]).unwrap();
    let output = hla(
        d,
        &[
            "train",
            "--out",
            run.to_str().unwrap(),
            "--resume",
            "--set",
            "train.steps=6",
        ],
    );
    assert!(output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        stderr.contains("checkpoint 2 in") && stderr.contains("resuming from checkpoint 1"),
        "{stderr}"
    );
    assert!(stdout.contains("resuming at step 2"), "{stdout}");
}

/// An export into the run folder, or into a folder whose files are the run's, is refused
/// and leaves the run whole; an export cut short is written over.
#[test]
fn an_export_never_writes_over_what_it_reads() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let run = trained(d, "run", 2, 2);
    let run_s = run.to_str().unwrap();
    let before = snapshot(&run);
    for format in ["safetensors", "burnpack"] {
        let output = hla(
            d,
            &["export", "--run", run_s, "--out", run_s, "--format", format],
        );
        one_error(&output, 2, &["cannot export into", "choose another --out"]);
        assert_eq!(snapshot(&run), before, "{format}");
    }
    let linked = d.join("linked");
    std::fs::create_dir_all(&linked).unwrap();
    std::os::unix::fs::symlink(run.join("tokenizer.json"), linked.join("tokenizer.json")).unwrap();
    let output = hla(
        d,
        &["export", "--run", run_s, "--out", linked.to_str().unwrap()],
    );
    one_error(&output, 2, &["tokenizer.json, which the export reads"]);
    assert_eq!(snapshot(&run), before);

    let partial = d.join("partial");
    std::fs::create_dir_all(&partial).unwrap();
    std::fs::write(partial.join("model.bpk"), b"cut short").unwrap();
    let out = partial.to_str().unwrap();
    ok(
        d,
        &[
            "export", "--run", run_s, "--out", out, "--format", "burnpack",
        ],
    );
    assert!(partial.join("manifest.json").exists());
    let again = hla(d, &["export", "--run", run_s, "--out", out]);
    one_error(&again, 2, &["already holds an export"]);
}

/// A corpus folder with a link to itself and a second link to one file: each real file is
/// read once, and `meta.json` lists what was read and what was passed over.
#[test]
fn a_corpus_folder_is_read_once_per_file() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let corpus = d.join("corpus");
    std::fs::create_dir_all(corpus.join("sub")).unwrap();
    std::fs::write(corpus.join("a.txt"), "the first document\n").unwrap();
    std::fs::write(corpus.join("sub/b.txt"), "the second document\n").unwrap();
    std::os::unix::fs::symlink(".", corpus.join("self")).unwrap();
    std::os::unix::fs::symlink("a.txt", corpus.join("c.txt")).unwrap();
    let config = d.join("corpus.toml");
    std::fs::write(
        &config,
        format!("[data]\ncorpus = \"{}\"\n", corpus.display()),
    )
    .unwrap();
    let out = ok(d, &["prepare", "--config", config.to_str().unwrap()]);
    let folder = out
        .lines()
        .next()
        .unwrap()
        .split_whitespace()
        .nth(1)
        .unwrap();
    let meta = read_json(&Path::new(folder).join("meta.json"));
    assert_eq!(meta["files"], 2, "{meta}");
    assert_eq!(meta["documents"], 2, "{meta}");
    let read: Vec<&str> = meta["read"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["path"].as_str().unwrap())
        .collect();
    assert!(
        read[0].ends_with("corpus/a.txt") && read[1].ends_with("corpus/sub/b.txt"),
        "{meta}"
    );
    let skipped: Vec<&str> = meta["skipped"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["path"].as_str().unwrap())
        .collect();
    assert!(
        skipped.iter().any(|p| p.ends_with("corpus/c.txt"))
            && skipped.iter().any(|p| p.ends_with("corpus/self")),
        "{meta}"
    );
}

/// A preparation that re-uses its folder still removes what a killed one left beside it.
#[test]
fn an_abandoned_part_folder_is_removed() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let corpus = d.join("corpus.txt");
    std::fs::write(&corpus, "some text to prepare\n").unwrap();
    let config = d.join("text.toml");
    std::fs::write(
        &config,
        format!("[data]\ncorpus = \"{}\"\n", corpus.display()),
    )
    .unwrap();
    let config = config.to_str().unwrap();
    let out = ok(d, &["prepare", "--config", config]);
    let folder = PathBuf::from(
        out.lines()
            .next()
            .unwrap()
            .split_whitespace()
            .nth(1)
            .unwrap(),
    );
    let part = PathBuf::from(format!("{}.part", folder.display()));
    std::fs::create_dir_all(&part).unwrap();
    std::fs::write(part.join("tokens.bin"), b"half").unwrap();
    ok(d, &["prepare", "--config", config]);
    assert!(!part.exists(), "{} left behind", part.display());
}

/// A lock whose pid runs but is not the process that wrote it is taken over; one whose
/// owner runs names it and what to do.
#[test]
fn a_lock_names_its_owner() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let config = tiny_config(d, "hla2");
    let run = d.join("run");
    std::fs::create_dir_all(&run).unwrap();
    let mut other = Command::new("sleep")
        .arg("60")
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let pid = other.id();
    let started = process_start(&pid.to_string());
    let lock = run.join("run.lock");
    let args = [
        "train",
        "--config",
        config.to_str().unwrap(),
        "--out",
        run.to_str().unwrap(),
    ];
    // Written by that process (its pid and start time): held.
    std::fs::write(&lock, format!("{pid} {started}\n")).unwrap();
    let output = hla(d, &args);
    one_error(
        &output,
        1,
        &[&format!("pid {pid}"), &format!("kill {pid}"), "remove"],
    );
    // The pid alone, as an older hla wrote it, of a process that is not hla: stale.
    std::fs::write(&lock, format!("{pid}\n")).unwrap();
    ok(d, &args);
    other.kill().unwrap();
    other.wait().unwrap();
}
