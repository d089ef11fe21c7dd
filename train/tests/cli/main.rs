//! The `hla` binary end to end on a tiny config and a corpus the test writes: train →
//! checkpoints → eval (recurrent == chunked) → generate → export (safetensors reload gives
//! the same logits) → resume.

mod bench;
#[path = "../common/mod.rs"]
mod common;
mod mistakes;
mod runs;

use std::path::Path;

use burn::module::Module;
use burn::prelude::*;
use burn::store::{ModuleSnapshot, SafetensorsStore};
use hla_model::lm::LmConfig;

use common::{hla, ok, read_json, tiny_config};

#[test]
fn train_eval_generate_export_resume() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let config = tiny_config(dir.path(), "hla2");
    let run = dir.path().join("run");
    trains(&data, &config, &run);
    evaluates_serial_as_chunked(&data, &run);
    generates(&data, &run);
    let export = dir.path().join("export");
    exports_the_trained_weights(&data, &run, &export);
    resumes(&data, &run);
}

/// `hla train` for four steps: checkpoints, the final model, the run's config, tokenizer
/// and metrics (with the loss of random batches); a second train into it asks for
/// `--resume`.
fn trains(data: &Path, config: &Path, run: &Path) {
    let (config, run_str) = (config.to_str().unwrap(), run.to_str().unwrap());
    let log = ok(data, &["train", "--config", config, "--out", run_str]);
    assert!(log.contains("step      4/4"), "{log}");
    assert!(run.join("checkpoint/model-2.bpk").exists() && run.join("model.bpk").exists());
    assert!(run.join("config.toml").exists() && run.join("tokenizer.json").exists());
    let metrics = read_json(&run.join("metrics.json"));
    let estimate = &metrics["random_batch_estimate"];
    assert!(estimate["loss"].as_f64().unwrap().is_finite(), "{metrics}");
    assert_eq!(estimate["batches"], 2);
    assert_eq!(
        metrics["state_floats_per_sequence"],
        metrics["state_floats_per_layer"]
    );
    let again = hla(data, &["train", "--config", config, "--out", run_str]);
    assert!(!again.status.success() && String::from_utf8_lossy(&again.stderr).contains("--resume"));
}

/// `hla eval` in the serial recurrence and in the chunked form: one loss within 1e-4.
fn evaluates_serial_as_chunked(data: &Path, run: &Path) {
    let eval = |mode: &str| -> serde_json::Value {
        let run = run.to_str().unwrap();
        serde_json::from_str(&ok(data, &["eval", "--run", run, "--mode", mode, "--json"])).unwrap()
    };
    let (recurrent, chunked) = (eval("recurrent"), eval("chunked"));
    let (r, c) = (
        recurrent["loss"].as_f64().unwrap(),
        chunked["loss"].as_f64().unwrap(),
    );
    assert!(r.is_finite() && r > 0.0);
    assert!((r - c).abs() <= 1e-4 * c, "recurrent {r} vs chunked {c}");
    assert_eq!(recurrent["tokens"], chunked["tokens"]);
}

/// `hla generate` continues the prompt by the tokens asked for; a prompt outside the
/// vocabulary gets a message.
fn generates(data: &Path, run: &Path) {
    let run = run.to_str().unwrap();
    let args = [
        "generate",
        "--run",
        run,
        "--prompt",
        "the cat",
        "--max-tokens",
        "20",
    ];
    let text = ok(data, &args);
    assert!(
        text.starts_with("the cat")
            && text.strip_suffix('\n').map(|t| t.chars().count()) == Some(27),
        "{text:?}"
    );
    let unknown = hla(data, &["generate", "--run", run, "--prompt", "The"]);
    assert!(String::from_utf8_lossy(&unknown.stderr).contains("'T' is not in the vocabulary"));
}

/// `hla export --format safetensors`: its files (readable by all), the self-description,
/// and weights that reload into a fresh model with the trained model's logits.
fn exports_the_trained_weights(data: &Path, run: &Path, export: &Path) {
    let (run_str, out) = (run.to_str().unwrap(), export.to_str().unwrap());
    ok(
        data,
        &[
            "export",
            "--run",
            run_str,
            "--format",
            "safetensors",
            "--out",
            out,
        ],
    );
    for file in [
        "model.safetensors",
        "config.json",
        "tokenizer.json",
        "manifest.json",
    ] {
        assert!(export.join(file).exists(), "{file}");
    }
    let described = read_json(&export.join("config.json"));
    assert_eq!(described["format"], "hla-export");
    assert_eq!(described["model"]["mixer"], "hla2", "names as in the TOML");
    // hla2's default output: the ratio normalisation.
    let mixer = &described["architecture"]["mixer"];
    assert_eq!(mixer["feature_map"]["kind"], "elu_plus_one");
    assert!(mixer["denominator"].is_object(), "{mixer}");
    assert!(mixer["output_norm"].is_null(), "{mixer}");
    #[cfg(unix)]
    for file in ["model.safetensors", "config.json", "manifest.json"] {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(export.join(file))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o644, "{file}");
    }
    let device = Device::default();
    let lm_config: LmConfig = serde_json::from_value(described["lm_config"].clone()).unwrap();
    let trained = lm_config.init(&device).load_file(run.join("model.bpk"));
    let mut fresh = lm_config.init(&device);
    let mut store = SafetensorsStore::from_file(export.join("model.safetensors"));
    let applied = fresh.load_from(&mut store).unwrap();
    assert!(applied.missing.is_empty(), "missing: {:?}", applied.missing);
    let tokens =
        Tensor::<2, Int>::from_data(TensorData::new(vec![1i64, 2, 3, 4, 5], [1, 5]), &device);
    let (a, b) = (trained.forward(tokens.clone()), fresh.forward(tokens));
    assert_eq!(
        a.into_data(),
        b.into_data(),
        "the exported weights give the same logits"
    );
}

/// `hla train --resume` to six steps from the checkpoint at four, whose training time so
/// far the resumed run's time and throughput include.
fn resumes(data: &Path, run: &Path) {
    let state = read_json(&run.join("checkpoint/state-2.json"));
    assert_eq!(state["step"], 4, "{state}");
    let before = state["seconds"].as_f64().unwrap();
    let run_str = run.to_str().unwrap();
    let args = [
        "train",
        "--out",
        run_str,
        "--resume",
        "--set",
        "train.steps=6",
    ];
    let resumed = ok(data, &args);
    assert!(
        resumed.contains("resuming at step 4") && resumed.contains("step      6/6"),
        "{resumed}"
    );
    assert!(run.join("checkpoint/model-3.bpk").exists());
    // All six steps: 8 windows of 32 tokens each.
    let metrics = read_json(&run.join("metrics.json"));
    let seconds = metrics["wall_seconds"].as_f64().unwrap();
    let tokens = metrics["tokens_per_second"].as_f64().unwrap() * seconds;
    assert!(
        (tokens - 6.0 * 8.0 * 32.0).abs() < 1e-6 * tokens,
        "{metrics}"
    );
    assert!(before > 0.0 && seconds > before, "{before} then {seconds}");
}

#[test]
fn smoke_config_runs_on_mqar_with_softmax() {
    let dir = tempfile::tempdir().unwrap();
    let smoke = Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs/smoke.toml");
    let run = dir.path().join("run");
    let sets = [
        "--set",
        "train.steps=2",
        "--set",
        "train.eval_interval=1",
        "--set",
        "model.mixer=softmax",
    ];
    let mut args = vec![
        "train",
        "--config",
        smoke.to_str().unwrap(),
        "--out",
        run.to_str().unwrap(),
    ];
    args.extend(sets);
    let log = ok(dir.path(), &args);
    assert!(log.contains("Accuracy"), "MQAR reports accuracy: {log}");
    let eval: serde_json::Value = serde_json::from_str(&ok(
        dir.path(),
        &["eval", "--run", run.to_str().unwrap(), "--json"],
    ))
    .unwrap();
    assert!((0.0..=1.0).contains(&eval["accuracy"].as_f64().unwrap()));
}
