//! A run's life: its lock, seeded repeats, the training forms, kills and resumes, and a
//! diverging loss.

use std::path::Path;
use std::process::Command;

use crate::common::{self, hla, ok, process_start, tiny_config};

/// A run directory is locked while training: a second process is refused; a lock whose
/// process is gone is taken over.
#[test]
fn run_directories_are_locked() {
    let dir = tempfile::tempdir().unwrap();
    let config = tiny_config(dir.path(), "linear");
    let run = dir.path().join("run");
    std::fs::create_dir_all(&run).unwrap();
    let (config, run_str) = (config.to_str().unwrap(), run.to_str().unwrap());
    // A live process (this test) holds the lock: its pid and start time, as hla writes them.
    let owner = format!("{} {}\n", std::process::id(), process_start("self"));
    std::fs::write(run.join("run.lock"), owner).unwrap();
    let refused = hla(dir.path(), &["train", "--config", config, "--out", run_str]);
    assert_eq!(refused.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&refused.stderr).contains("is training into"));
    // A stale lock (no such process) is taken over, and released at the end.
    std::fs::write(run.join("run.lock"), "999999999").unwrap();
    ok(dir.path(), &["train", "--config", config, "--out", run_str]);
    assert!(!run.join("run.lock").exists());
}

/// The same config and seed give bit-identical losses, batch by batch, for 50 steps.
#[test]
fn seeded_runs_repeat() {
    let dir = tempfile::tempdir().unwrap();
    let config = tiny_config(dir.path(), "hla2");
    let losses = |name: &str| {
        let run = dir.path().join(name);
        let args = [
            "train",
            "--config",
            config.to_str().unwrap(),
            "--out",
            run.to_str().unwrap(),
            "--set",
            "train.steps=50",
            "--set",
            "train.eval_interval=25",
        ];
        ok(dir.path(), &args);
        [
            "train/epoch-1/Loss.log",
            "train/epoch-2/Loss.log",
            "valid/epoch-2/Loss.log",
        ]
        .map(|log| std::fs::read_to_string(run.join(log)).unwrap())
    };
    let (a, b) = (losses("a"), losses("b"));
    assert_eq!(
        a[0].lines().count() + a[1].lines().count(),
        52,
        "50 batches and 2 epoch means"
    );
    assert_eq!(a, b);
}

/// `train.form` trains in that form: after four steps the node's and the composed form's
/// weights are the default form's (the CPU kernels) within 1e-5, yet not all equal to them
/// (another sum order), so the form did change what ran.
#[test]
fn the_forms_train_alike() {
    let dir = tempfile::tempdir().unwrap();
    let config = tiny_config(dir.path(), "hla2");
    let weights = |form: &str| {
        let run = dir.path().join(form);
        let export = dir.path().join(format!("{form}-export"));
        let set = format!("train.form={form}");
        let [config, run, export] = [&config, &run, &export].map(|p| p.to_str().unwrap());
        let out = ok(
            dir.path(),
            &["train", "--config", config, "--out", run, "--set", &set],
        );
        assert_eq!(out.contains(&format!("the {form} form")), form != "auto");
        let args = [
            "export",
            "--run",
            run,
            "--format",
            "safetensors",
            "--out",
            export,
        ];
        ok(dir.path(), &args);
        common::read_safetensors(&Path::new(export).join("model.safetensors"))
    };
    let auto = weights("auto");
    for form in ["node", "composed"] {
        let other = weights(form);
        assert_eq!(
            other.keys().collect::<Vec<_>>(),
            auto.keys().collect::<Vec<_>>()
        );
        let pairs = || {
            auto.values()
                .zip(other.values())
                .flat_map(|(a, b)| a.iter().zip(b))
        };
        let gap = pairs().map(|(a, b)| (a - b).abs()).fold(0.0, f32::max);
        assert!(gap < 1e-5, "{form}: weights {gap} from the default form's");
        assert!(
            pairs().any(|(a, b)| a != b),
            "{form} ran what the default runs"
        );
    }
}

/// Killed at any moment (SIGKILL), a run resumes from its last complete checkpoint and
/// reaches its final step; every checkpoint left reads back.
#[test]
fn killed_runs_resume() {
    let dir = tempfile::tempdir().unwrap();
    let config = tiny_config(dir.path(), "hla2");
    let run = dir.path().join("run");
    let mut child = Command::new(env!("CARGO_BIN_EXE_hla"))
        .args([
            "train",
            "--config",
            config.to_str().unwrap(),
            "--out",
            run.to_str().unwrap(),
        ])
        .args([
            "--set",
            "train.steps=400",
            "--set",
            "train.eval_interval=20",
        ])
        .env("HLA_DATA_DIR", dir.path())
        .env("HLA_CACHE_DIR", dir.path().join("cache"))
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while !run.join("checkpoint/model-3.bpk").exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "no checkpoint within two minutes"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    child.kill().unwrap(); // SIGKILL on Unix
    child.wait().unwrap();
    assert!(!run.join("model.bpk").exists(), "killed before the end");

    let log = ok(
        dir.path(),
        &["train", "--out", run.to_str().unwrap(), "--resume"],
    );
    assert!(
        log.contains("resuming at step") && log.contains("step    400/400"),
        "{log}"
    );
    for entry in std::fs::read_dir(run.join("checkpoint")).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let reads = if name.starts_with("state-") {
            let text = std::fs::read_to_string(&path).unwrap();
            serde_json::from_str::<serde_json::Value>(&text).unwrap()["step"].is_u64()
        } else if name.starts_with("model-") {
            burn::store::ModuleRecord::load(&path).is_ok()
        } else if name.starts_with("optim-") {
            burn::optim::OptimizerRecord::load(&path).is_ok()
        } else {
            burn::lr_scheduler::LrSchedulerRecord::load(&path).is_ok()
        };
        assert!(reads, "{name} does not read back");
    }
    let eval = ok(
        dir.path(),
        &["eval", "--run", run.to_str().unwrap(), "--json"],
    );
    assert!(eval.contains("\"loss\""), "{eval}");
}

/// A diverging run stops at the first non-finite loss, names the step, and writes no model.
#[test]
fn non_finite_loss_stops_training() {
    let dir = tempfile::tempdir().unwrap();
    let config = tiny_config(dir.path(), "hla2");
    let run = dir.path().join("run");
    let args = [
        "train",
        "--config",
        config.to_str().unwrap(),
        "--out",
        run.to_str().unwrap(),
        // Weights this large make the loss NaN at the first step; far larger ones (1e20
        // and up) overflow the RMSNorms' mean squares, whose outputs are then zeros and the
        // logits uniform: a finite loss.
        "--set",
        "model.init_std=1e15",
    ];
    let output = hla(dir.path(), &args);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("the loss became") && stderr.contains("at step"),
        "{stderr}"
    );
    assert!(!run.join("model.bpk").exists());
}
