//! The export against an independent implementation: `train/python/hla_reference.py`
//! (NumPy, written from the export's config.json alone) reproduces `hla generate
//! --temperature 0` token for token and `hla eval`'s loss within 1e-5, for every mixer and
//! option a model trained here can have, and hybrid stacks (a mixer per layer).
//!
//! It needs `python3` with numpy and safetensors (`pip install numpy safetensors`). Without
//! them it says so and passes, unless `HLA_REQUIRE_PYTHON` is set (CI sets it), when it
//! fails.

mod common;

use std::path::Path;
use std::process::Command;

use common::{ok, tiny_config};

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/python/hla_reference.py");

/// Whether python3 can import numpy and safetensors; panics without them under
/// `HLA_REQUIRE_PYTHON`.
fn python_ready() -> bool {
    let ready = Command::new("python3")
        .args(["-c", "import numpy, safetensors"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ready {
        assert!(
            std::env::var_os("HLA_REQUIRE_PYTHON").is_none(),
            "HLA_REQUIRE_PYTHON is set, but python3 cannot import numpy and safetensors"
        );
        eprintln!(
            "skipped: python3 with numpy and safetensors is needed (pip install numpy safetensors)"
        );
    }
    ready
}

fn python(args: &[&str]) -> String {
    let output = Command::new("python3")
        .arg(SCRIPT)
        .args(args)
        .output()
        .expect("python3 runs");
    assert!(
        output.status.success(),
        "hla_reference.py {args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).expect("UTF-8 output")
}

fn loss(json: &str) -> f64 {
    let value: serde_json::Value = serde_json::from_str(json).expect("JSON");
    value["loss"].as_f64().expect("a loss")
}

/// Trains the tiny model with `sets`, exports it and compares the two implementations.
fn check(dir: &Path, case: usize, mixer: &str, sets: &[&str]) {
    let data = dir.join("data");
    let config = tiny_config(dir, mixer);
    let run = dir.join(format!("run-{case}"));
    let export = run.with_extension("export");
    let (run, export) = (run.to_str().unwrap(), export.to_str().unwrap());
    let mut train = vec!["train", "--config", config.to_str().unwrap(), "--out", run];
    train.extend(["--set", "train.steps=20", "--set", "train.eval_interval=10"]);
    train.extend(sets.iter().flat_map(|s| ["--set", s]));
    ok(&data, &train);
    ok(&data, &["export", "--run", run, "--out", export]);
    let case = format!("{mixer} {sets:?}");

    let ours = loss(&ok(&data, &["eval", "--run", run, "--json"]));
    let corpus = dir.join("corpus.txt");
    let theirs = loss(&python(&[
        export,
        "eval",
        "--corpus",
        corpus.to_str().unwrap(),
        "--json",
    ]));
    assert!(
        (ours - theirs).abs() <= 1e-5,
        "{case}: hla eval {ours} vs the reference {theirs}"
    );

    let prompt = ["--prompt", "the cat", "--max-tokens", "40"];
    let mut generate = vec!["generate", "--run", run, "--temperature", "0"];
    generate.extend(prompt);
    let ours = ok(&data, &generate);
    let theirs = python(&[&[export, "generate"], &prompt[..]].concat());
    assert_eq!(ours, theirs, "{case}: greedy text");
}

#[test]
fn the_reference_reproduces_every_mixer() {
    if !python_ready() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let gpt2 = [
        "model.positions=learned",
        "model.norm=layer",
        "model.mlp_kind=gelu",
        "model.max_seq_len=64",
    ];
    let cases = [
        ("hla2", &[][..]),
        ("linear", &[]),
        ("hla3", &[]),
        ("ahla", &["model.mlp=false", "model.decay=none"]),
        ("softmax", &[]),
        ("softmax", &gpt2),
        ("hla2", &gpt2),
        (
            "hla2",
            &[
                "model.decay=gated",
                "model.shared_keys=true",
                "model.normalize=true",
                "model.output_gate=true",
                "model.feature_map=elu_plus_one",
                "model.output_norm=false",
            ],
        ),
        (
            "linear",
            &[
                "model.feature_map=scale",
                "model.short_conv=0",
                "model.tie_embeddings=false",
                "model.decay_base=1.5",
            ],
        ),
        // Hybrid stacks: every mixer in one, and HLA and linear attention with their own
        // feature maps (no denominator) around softmax attention.
        (
            "hla2",
            &[
                "model.n_layers=5",
                "model.layers=[\"hla2\", \"hla3\", \"ahla\", \"linear\", \"softmax\"]",
            ],
        ),
        (
            "hla2",
            &[
                "model.n_layers=3",
                "model.layers=[\"linear\", \"softmax\", \"hla2\"]",
                "model.normalize=false",
                "model.decay=gated",
            ],
        ),
    ];
    for (i, (mixer, sets)) in cases.into_iter().enumerate() {
        check(dir.path(), i, mixer, sets);
    }
}
