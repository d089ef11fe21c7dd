//! `hla eval` past the training length and by position, its recall split, and `hla compare
//! --by-position` over an experiment's runs.

mod common;

use std::path::{Path, PathBuf};

use common::{hla, ok, one_error, read_json, tiny_config, train};

/// A finished tiny run of `mixer` (context 32) with `sets` in `dir/name`.
fn trained(dir: &Path, name: &str, mixer: &str, sets: &[&str]) -> PathBuf {
    let config = tiny_config(dir, mixer);
    let extra: Vec<&str> = sets.iter().flat_map(|set| ["--set", set]).collect();
    train(dir, &config, name, &extra)
}

fn eval_json(dir: &Path, run: &Path, extra: &[&str]) -> serde_json::Value {
    let mut args = vec!["eval", "--run", run.to_str().unwrap(), "--json"];
    args.extend(extra);
    serde_json::from_str(&ok(dir, &args)).unwrap()
}

/// Windows of 4× the training context, by position: the buckets are powers of two up to
/// the context and hold every token; the recall split adds up; the chart is written; the
/// serial form agrees with the chunked one.
#[test]
fn eval_past_the_training_length_by_position() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let run = trained(d, "hla2", "hla2", &[]);
    let serial = eval_json(d, &run, &["--context", "128", "--by-position"]);
    let buckets = serial["by_position"].as_array().unwrap();
    let ranges: Vec<(u64, u64)> = buckets
        .iter()
        .map(|b| (b["first"].as_u64().unwrap(), b["last"].as_u64().unwrap()))
        .collect();
    assert_eq!(
        ranges,
        [
            (1, 1),
            (2, 3),
            (4, 7),
            (8, 15),
            (16, 31),
            (32, 63),
            (64, 127),
            (128, 128)
        ]
    );
    let counted: u64 = buckets.iter().map(|b| b["tokens"].as_u64().unwrap()).sum();
    assert_eq!(counted, serial["tokens"].as_u64().unwrap());
    let recall = &serial["recall"];
    let (hits, other) = (&recall["hits"], &recall["other"]);
    assert_eq!(
        hits["tokens"].as_u64().unwrap() + other["tokens"].as_u64().unwrap(),
        counted
    );
    // A repetitive corpus: most tokens repeat a bigram of their window.
    assert!(
        hits["tokens"].as_u64() > other["tokens"].as_u64(),
        "{recall}"
    );
    let mean = (hits["loss"].as_f64().unwrap() * hits["tokens"].as_f64().unwrap()
        + other["loss"].as_f64().unwrap() * other["tokens"].as_f64().unwrap())
        / counted as f64;
    assert!((mean - serial["loss"].as_f64().unwrap()).abs() < 1e-9);
    for chart in ["eval-by-position-128.png", "eval-by-position-128.svg"] {
        assert!(run.join(chart).exists(), "{chart}");
    }
    let chunked = eval_json(d, &run, &["--context", "128", "--mode", "chunked"]);
    let (a, b) = (
        serial["loss"].as_f64().unwrap(),
        chunked["loss"].as_f64().unwrap(),
    );
    assert!((a - b).abs() < 1e-4 * a, "serial {a}, chunked {b}");
    assert!(chunked.get("by_position").is_none(), "only when asked");
    // Windows of the training context by default.
    let default = eval_json(d, &run, &["--by-position"]);
    let last = default["by_position"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    assert_eq!(last["last"], 32, "{default}");
}

/// RoPE's table grows past `max_seq_len` (it holds no weights); learned positions refuse,
/// and so does MQAR.
#[test]
fn positions_decide_how_far_eval_may_go() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let rope = trained(d, "rope", "softmax", &["model.max_seq_len=32"]);
    let past = eval_json(d, &rope, &["--context", "96", "--mode", "chunked"]);
    assert!(past["loss"].as_f64().unwrap().is_finite(), "{past}");
    let learned = trained(
        d,
        "learned",
        "hla2",
        &["model.positions=\"learned\"", "model.max_seq_len=32"],
    );
    let output = hla(
        d,
        &[
            "eval",
            "--run",
            learned.to_str().unwrap(),
            "--context",
            "96",
        ],
    );
    one_error(&output, 2, &["--context 96", "32 learned positions"]);
    let within = eval_json(d, &learned, &["--context", "16"]);
    assert!(within["loss"].as_f64().unwrap().is_finite());
}

/// `hla compare --by-position` evaluates every finished run and draws them on one chart,
/// keeping each run's evaluation for a machine without its weights; results.csv carries
/// each run's recall split.
#[test]
fn compare_draws_every_run_by_position() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let config = tiny_config(d, "hla2");
    let folder = d.join("experiments/toy");
    std::fs::create_dir_all(&folder).unwrap();
    std::fs::write(
        folder.join("experiment.toml"),
        format!(
            "title = \"Toy\"\nconfig = \"{}\"\n\n[[sweep]]\nname = \"toy\"\n[[sweep.axis]]\n\
             key = \"model.mixer\"\nvalues = [\"hla2\", \"linear\"]\n",
            config.display()
        ),
    )
    .unwrap();
    let file = folder.join("experiment.toml");
    let log = ok(
        d,
        &[
            "compare",
            "--experiment",
            file.to_str().unwrap(),
            "--by-position",
            "--context",
            "64",
        ],
    );
    assert!(log.contains("loss by position of 2 runs"), "{log}");
    for chart in ["loss-by-position-64.png", "loss-by-position-64.svg"] {
        assert!(folder.join(chart).exists(), "{chart}");
    }
    let json: serde_json::Value = read_json(&folder.join("by-position-64.json"));
    let runs = json["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2, "{json}");
    assert_eq!(runs[1]["run"], "toy-linear");
    assert_eq!(
        runs[1]["by_position"].as_array().unwrap().len(),
        7,
        "{json}"
    );
    // Each run keeps its evaluation: read back once its weights are gone (as after a
    // clone), skipped with a note once neither is here.
    let linear = folder.join("runs/toy-linear");
    let kept = linear.join("by-position-64-recurrent.json");
    assert!(kept.exists(), "{}", kept.display());
    std::fs::remove_file(linear.join("model.bpk")).unwrap();
    let again = [
        "compare",
        "--experiment",
        file.to_str().unwrap(),
        "--no-train",
        "--by-position",
        "--context",
        "64",
    ];
    let log = ok(d, &again);
    assert!(log.contains("loss by position of 2 runs"), "{log}");
    let reread: serde_json::Value = read_json(&folder.join("by-position-64.json"));
    assert_eq!(reread["runs"][1], runs[1], "{reread}");
    std::fs::remove_file(&kept).unwrap();
    let output = hla(d, &again);
    assert!(output.status.success());
    let log = String::from_utf8_lossy(&output.stdout);
    assert!(log.contains("loss by position of 1 runs"), "{log}");
    let note = String::from_utf8_lossy(&output.stderr);
    assert!(
        note.contains("not by position") && note.contains("toy-linear"),
        "{note}"
    );
    let csv = std::fs::read_to_string(folder.join("results.csv")).unwrap();
    let header: Vec<&str> = csv.lines().next().unwrap().split(',').collect();
    let column = header.iter().position(|h| *h == "recall_tokens").unwrap();
    for line in csv.lines().skip(1) {
        let tokens: usize = line.split(',').nth(column).unwrap().parse().unwrap();
        assert!(tokens > 0, "{csv}");
    }
}
