//! The `hla` binary end to end on a tiny config and a corpus the test writes: train →
//! checkpoints → eval (recurrent == chunked) → generate → export (safetensors reload gives
//! the same logits) → resume.

mod common;

use std::path::Path;
use std::process::Command;

use burn::module::Module;
use burn::prelude::*;
use burn::store::{ModuleSnapshot, SafetensorsStore};
use hla_model::lm::LmConfig;

use common::{hla, ok, process_start, tiny_config};

#[test]
fn train_eval_generate_export_resume() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let config = tiny_config(dir.path(), "hla2");
    let run = dir.path().join("run");
    let (config, run_str) = (config.to_str().unwrap(), run.to_str().unwrap());

    let log = ok(&data, &["train", "--config", config, "--out", run_str]);
    assert!(log.contains("step      4/4"), "{log}");
    assert!(run.join("checkpoint/model-2.bpk").exists() && run.join("model.bpk").exists());
    assert!(run.join("config.toml").exists() && run.join("tokenizer.json").exists());
    let metrics: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("metrics.json")).unwrap()).unwrap();
    let estimate = &metrics["random_batch_estimate"];
    assert!(estimate["loss"].as_f64().unwrap().is_finite(), "{metrics}");
    assert_eq!(estimate["batches"], 2);
    assert_eq!(
        metrics["state_floats_per_sequence"],
        metrics["state_floats_per_layer"]
    );

    let again = hla(&data, &["train", "--config", config, "--out", run_str]);
    assert!(!again.status.success() && String::from_utf8_lossy(&again.stderr).contains("--resume"));

    let eval = |mode: &str| -> serde_json::Value {
        serde_json::from_str(&ok(
            &data,
            &["eval", "--run", run_str, "--mode", mode, "--json"],
        ))
        .unwrap()
    };
    let (recurrent, chunked) = (eval("recurrent"), eval("chunked"));
    let (r, c) = (
        recurrent["loss"].as_f64().unwrap(),
        chunked["loss"].as_f64().unwrap(),
    );
    assert!(r.is_finite() && r > 0.0);
    assert!((r - c).abs() <= 1e-4 * c, "recurrent {r} vs chunked {c}");
    assert_eq!(recurrent["tokens"], chunked["tokens"]);

    let text = ok(
        &data,
        &[
            "generate",
            "--run",
            run_str,
            "--prompt",
            "the cat",
            "--max-tokens",
            "20",
        ],
    );
    assert!(
        text.starts_with("the cat")
            && text.strip_suffix('\n').map(|t| t.chars().count()) == Some(27),
        "{text:?}"
    );
    let unknown = hla(&data, &["generate", "--run", run_str, "--prompt", "The"]);
    assert!(String::from_utf8_lossy(&unknown.stderr).contains("'T' is not in the vocabulary"));

    let export = dir.path().join("export");
    ok(
        &data,
        &[
            "export",
            "--run",
            run_str,
            "--format",
            "safetensors",
            "--out",
            export.to_str().unwrap(),
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
    let device = Device::default();
    let described: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(export.join("config.json")).unwrap())
            .unwrap();
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
    let lm_config: LmConfig = serde_json::from_value(described["lm_config"].clone()).unwrap();
    let trained = lm_config.init(&device).load_file(run.join("model.bpk"));
    let mut fresh = lm_config.init(&device);
    let applied = fresh
        .load_from(&mut SafetensorsStore::from_file(
            export.join("model.safetensors"),
        ))
        .unwrap();
    assert!(applied.missing.is_empty(), "missing: {:?}", applied.missing);
    let tokens =
        Tensor::<2, Int>::from_data(TensorData::new(vec![1i64, 2, 3, 4, 5], [1, 5]), &device);
    let (a, b) = (trained.forward(tokens.clone()), fresh.forward(tokens));
    assert_eq!(
        a.into_data(),
        b.into_data(),
        "the exported weights give the same logits"
    );

    // The training time so far, recorded with the checkpoint the resume starts from.
    let state: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(run.join("checkpoint/state-2.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(state["step"], 4, "{state}");
    let before = state["seconds"].as_f64().unwrap();
    let resumed = ok(
        &data,
        &[
            "train",
            "--out",
            run_str,
            "--resume",
            "--set",
            "train.steps=6",
        ],
    );
    assert!(
        resumed.contains("resuming at step 4") && resumed.contains("step      6/6"),
        "{resumed}"
    );
    assert!(run.join("checkpoint/model-3.bpk").exists());
    // The resumed run's time and throughput cover all six steps (8 windows of 32 tokens
    // each), the time before the resume included.
    let metrics: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("metrics.json")).unwrap()).unwrap();
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

/// Usage and config mistakes exit with 2 and one clear message; runtime failures with 1.
#[test]
fn mistakes_exit_with_clear_messages() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, "[data]\ncorpus = \"x\"\n[model]\nmixr = \"hla2\"\n").unwrap();
    let missing_run = dir.path().join("nothing");
    let cases: [(&[&str], i32, &str); 7] = [
        (
            &["info", "--config", bad.to_str().unwrap()],
            2,
            "unknown field `mixr`",
        ),
        (&["verify", "--device", "tpu"], 2, "unknown device \"tpu\""),
        (&["bench", "--device", "tpu"], 2, "unknown device \"tpu\""),
        (
            &["bench", "--device", "flex", "--only", "cost"],
            2,
            "reads the GPU forms' launch plans on a CubeCL device",
        ),
        (
            &["bench", "--only", "cost", "--cost-shape", "4,16,2048"],
            2,
            "not four positive integers B,H,T,D",
        ),
        (
            &["train", "--config", "/no/such/file.toml"],
            2,
            "cannot read the config file",
        ),
        (
            &["eval", "--run", missing_run.to_str().unwrap()],
            2,
            "is not a run directory",
        ),
    ];
    for (args, code, message) in cases {
        let output = hla(dir.path(), args);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(code), "{args:?}: {stderr}");
        assert!(
            stderr.starts_with("error: ") && stderr.contains(message),
            "{args:?}: {stderr}"
        );
    }
}

/// `hla bench --quick --only SECTION --json --out DIR`: the JSON on stdout (checked equal
/// to `DIR/bench.json`) and `DIR/bench.md`.
fn quick_bench(section: &str, extra: &[&str]) -> (serde_json::Value, String) {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("bench");
    let args = ["bench", "--quick", "--only", section, "--json", "--out"];
    let stdout = ok(
        dir.path(),
        &[&args[..], &[out.to_str().unwrap()], extra].concat(),
    );
    let report: serde_json::Value = serde_json::from_str(&stdout).expect("JSON on stdout");
    let written: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("bench.json")).unwrap()).unwrap();
    assert_eq!(written, report);
    let tables = std::fs::read_to_string(out.join("bench.md")).unwrap();
    (report, tables)
}

/// `hla bench` runs only the sections asked for, prints every figure as JSON and writes
/// its tables and JSON into `--out`.
#[test]
fn bench_reports_json_and_tables() {
    let (report, tables) = quick_bench("matmul", &[]);
    let matmul = report["matmul"].as_array().expect("matmul rows");
    assert_eq!(matmul.len(), 2, "{report}");
    assert!(matmul.iter().all(|m| m["gflops"].as_f64().unwrap() > 0.0));
    assert!(report["operators"].as_array().unwrap().is_empty());
    assert!(report["decode"].as_array().unwrap().is_empty());
    assert!(tables.contains("- square 512×512×512: "), "{tables}");
}

/// `hla bench --operator-shape B,H,D` sizes the operator problem (reported, and in the
/// chunk-shaped matmul), and `--composed` times every operator also without its fused
/// kernel, and every chunked form also as its node, in the same rounds.
#[test]
fn bench_takes_the_operator_shape_and_composed_operators() {
    let (report, tables) = quick_bench("matmul", &["--operator-shape", "2,3,16"]);
    assert_eq!(
        [
            &report["batch"],
            &report["heads"],
            &report["d"],
            &report["dv"]
        ],
        [2, 3, 16, 16],
        "{report}"
    );
    assert!(tables.contains("×16×64): "), "{tables}");

    let (report, _) = quick_bench("operators", &["--operator-shape", "1,1,8", "--composed"]);
    let rows = report["operators"].as_array().expect("operator rows");
    let count = |name: &str| rows.iter().filter(|r| r["operator"] == name).count();
    for op in ["hla2-chunked", "linear-chunked", "softmax"] {
        let composed = format!("{op} composed");
        assert_eq!(count(op), 8, "{op} at 4 lengths, 2 passes: {report}");
        assert_eq!(count(&composed), 8, "{composed}: {report}");
    }
    for (op, nodes) in [("hla2-chunked", 8), ("hla3-chunked", 8), ("softmax", 0)] {
        let node = format!("{op} node");
        assert_eq!(count(&node), nodes, "{node}: {report}");
    }

    let dir = tempfile::tempdir().unwrap();
    let output = hla(dir.path(), &["bench", "--operator-shape", "2,0,16"]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("not three positive integers"), "{stderr}");
}

/// `hla bench --operator A,B --time T,…` times only those operators at those lengths (in
/// increasing order), with `--composed` each also composed and hla2 also as its node, and
/// the table of the kernels against both; an unknown operator gets one message listing
/// the operators.
#[test]
fn bench_takes_the_operators_and_lengths() {
    let args = [
        "--operator-shape",
        "1,1,8",
        "--composed",
        "--operator",
        "softmax,hla2-chunked",
        "--time",
        "96,32",
    ];
    let (report, tables) = quick_bench("operators", &args);
    let rows = report["operators"].as_array().expect("operator rows");
    let mut seen: Vec<(String, u64)> = rows
        .iter()
        .map(|r| {
            (
                r["operator"].as_str().unwrap().to_string(),
                r["time"].as_u64().unwrap(),
            )
        })
        .collect();
    seen.dedup();
    let want: Vec<(String, u64)> = [32, 96]
        .into_iter()
        .flat_map(|t| {
            [
                "hla2-chunked",
                "hla2-chunked node",
                "hla2-chunked composed",
                "softmax",
                "softmax composed",
            ]
            .map(|op| (op.to_string(), t))
        })
        .collect();
    assert_eq!(seen, want, "{report}");
    let (_, against) = tables
        .split_once("Kernels against the composed forms and the nodes")
        .unwrap_or_else(|| panic!("{tables}"));
    let line = against
        .lines()
        .find(|l| l.starts_with("| hla2-chunked | forward+backward | 96 | "))
        .unwrap_or_else(|| panic!("{tables}"));
    let cells: Vec<&str> = line.split('|').map(str::trim).collect();
    // composed / kernels and node / kernels are ratios; the fastest form is one of three.
    assert!(
        cells[4].parse::<f64>().is_ok() && cells[5].parse::<f64>().is_ok(),
        "{line}"
    );
    assert!(
        ["kernels", "node", "composed"].contains(&cells[6]),
        "{line}"
    );

    let dir = tempfile::tempdir().unwrap();
    let output = hla(dir.path(), &["bench", "--operator", "hla4"]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("\"hla4\" is not one of hla2-chunked, hla3-chunked"),
        "{stderr}"
    );
}

/// `hla bench --gates data` times the operators on data-dependent gates with their
/// gradient, and `--tensor-cores off` with the register tiles (each reported, and named in
/// the tables' header); an unknown kind or switch (bench's, verify's) gets one message.
#[test]
fn bench_takes_data_dependent_gates_and_the_tensor_cores_switch() {
    let args = [
        "--operator-shape",
        "1,1,8",
        "--form",
        "node,composed",
        "--operator",
        "hla2-chunked",
        "--time",
        "40",
        "--gates",
        "data",
        "--tensor-cores",
        "off",
    ];
    let (report, tables) = quick_bench("operators", &args);
    assert_eq!(report["gates"], "data", "{report}");
    assert_eq!(report["tensor_cores"], false, "{report}");
    let rows = report["operators"].as_array().expect("operator rows");
    assert_eq!(rows.len(), 4, "node and composed, two passes: {report}");
    assert!(
        tables.contains(", data-dependent gates, tensor cores off)"),
        "{tables}"
    );

    let dir = tempfile::tempdir().unwrap();
    for (args, message) in [
        (["bench", "--gates", "learned"], "not one of fixed, data"),
        (["bench", "--tensor-cores", "yes"], "expected `on` or `off`"),
        (["verify", "--tensor-cores", "no"], "expected `on` or `off`"),
    ] {
        let output = hla(dir.path(), &args);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{stderr}");
        assert!(stderr.contains(message), "{stderr}");
    }
}

/// `hla verify` on the CPU: every order's forms agree with no decay, the fixed decay and
/// data-dependent gates, each output kind; with `--gradients` the chunked form's gradients
/// agree with the reference's too (but where f32 cannot tell them apart, shown as `-`),
/// run as its node (`--form node`) as well as by default.
#[test]
fn verify_checks_the_forms_and_their_gradients() {
    let dir = tempfile::tempdir().unwrap();
    let plain = ok(
        dir.path(),
        &[
            "verify", "--device", "flex", "--time", "70", "--chunk", "16",
        ],
    );
    assert_eq!(plain.lines().count(), 1 + 4 * 3 * 2 + 2, "{plain}");
    let attention = |out: &str| -> String {
        out.lines()
            .find(|l| l.starts_with("softmax attention"))
            .unwrap_or_else(|| panic!("{out}"))
            .into()
    };
    assert!(attention(&plain).ends_with("gradients -"), "{plain}");
    assert!(
        plain.lines().last().unwrap().starts_with("all forms agree"),
        "{plain}"
    );
    for decay in ["none", "fixed", "data"] {
        assert!(
            plain
                .lines()
                .any(|l| l.split_whitespace().nth(1) == Some(decay)),
            "{plain}"
        );
    }
    assert!(
        plain.lines().skip(1).take(24).all(|l| l.ends_with(" -")),
        "{plain}"
    );
    for form in [&[][..], &["--form", "node"]] {
        let args = [
            &[
                "verify",
                "--device",
                "flex",
                "--time",
                "70",
                "--chunk",
                "16",
                "--gradients",
            ][..],
            form,
        ]
        .concat();
        let checked = ok(dir.path(), &args);
        assert!(!attention(&checked).ends_with("gradients -"), "{checked}");
        let rows: Vec<&str> = checked.lines().skip(1).take(24).collect();
        let unchecked: Vec<&&str> = rows.iter().filter(|l| l.ends_with(" -")).collect();
        assert_eq!(unchecked.len(), 1, "{checked}");
        assert!(
            unchecked[0].starts_with("Third       none   normalized"),
            "{checked}"
        );
        assert!(
            checked
                .lines()
                .last()
                .unwrap()
                .starts_with("all forms agree"),
            "{checked}"
        );
    }
}

/// `hla bench --only decode`: every mixer at every position, each timed over the same
/// rounds; HLA's state bytes do not grow, softmax attention's KV cache does; only the
/// decode section is rendered.
#[test]
fn bench_decodes_every_position_in_rounds() {
    let (report, tables) = quick_bench("decode", &[]);
    let rows = report["decode"].as_array().expect("decode rows");
    let bytes = |mixer: &str| -> Vec<u64> {
        rows.iter()
            .filter(|r| r["mixer"] == mixer)
            .map(|r| r["state_bytes"].as_u64().unwrap())
            .collect()
    };
    for mixer in ["hla2", "linear", "softmax"] {
        assert_eq!(
            bytes(mixer).len(),
            3,
            "{mixer} at 64, 1024 and 4096: {report}"
        );
    }
    assert!(bytes("hla2").windows(2).all(|w| w[0] == w[1]), "{report}");
    assert!(bytes("softmax").windows(2).all(|w| w[0] < w[1]), "{report}");
    let reps: Vec<u64> = rows
        .iter()
        .map(|r| r["timing"]["reps"].as_u64().unwrap())
        .collect();
    assert!(reps.iter().all(|&n| n == reps[0] && n > 1), "{report}");
    assert!(tables.contains("## Decoding"), "{tables}");
    assert!(!tables.contains("## Efficiency"), "{tables}");
}

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

/// Every bad input gets one clear message and its exit status (2: usage or config, 1: a
/// failure while running), never a panic, and leaves what is on disk alone.
#[test]
fn every_bad_input_has_one_clear_message() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let config = tiny_config(d, "hla2");
    let run = d.join("run");
    let (config_s, run_s) = (
        config.to_str().unwrap().to_string(),
        run.to_str().unwrap().to_string(),
    );
    ok(d, &["train", "--config", &config_s, "--out", &run_s]);
    let weights = std::fs::read(run.join("model.bpk")).unwrap();

    let write = |name: &str, text: &[u8]| {
        let path = d.join(name);
        std::fs::write(&path, text).unwrap();
        path.to_str().unwrap().to_string()
    };
    let base = std::fs::read_to_string(&config).unwrap();
    let malformed = write("malformed.toml", b"[model\n");
    let unknown = write("unknown.toml", format!("{base}\nbatch = 3\n").as_bytes());
    let no_data = write("no-data.toml", b"[model]\nmixer = \"hla2\"\n");
    let empty = write("empty.txt", b"");
    let short = write("short.txt", b"abc");
    let binary = write("binary.txt", &[b'o', b'k', 0xff]);
    // A copy of the run whose config describes another architecture.
    let other = d.join("other");
    std::fs::create_dir_all(&other).unwrap();
    for file in ["config.toml", "model.bpk", "tokenizer.json"] {
        std::fs::copy(run.join(file), other.join(file)).unwrap();
    }
    let other_config = std::fs::read_to_string(other.join("config.toml"))
        .unwrap()
        .replace("d_model = 32", "d_model = 64");
    std::fs::write(other.join("config.toml"), other_config).unwrap();
    let truncated = d.join("truncated");
    std::fs::create_dir_all(&truncated).unwrap();
    for file in ["config.toml", "tokenizer.json"] {
        std::fs::copy(run.join(file), truncated.join(file)).unwrap();
    }
    std::fs::write(truncated.join("model.bpk"), &weights[..weights.len() / 2]).unwrap();
    let (other_s, truncated_s) = (
        other.to_str().unwrap().to_string(),
        truncated.to_str().unwrap().to_string(),
    );
    let fresh = d.join("fresh").to_str().unwrap().to_string();
    let train = |sets: &[&str]| {
        let mut args = vec![
            "train".to_string(),
            "--config".into(),
            config_s.clone(),
            "--out".into(),
            fresh.clone(),
        ];
        for set in sets {
            args.extend(["--set".to_string(), set.to_string()]);
        }
        args
    };
    let corpus = |path: &str| format!("data.corpus=\"{path}\"");
    let cases: Vec<(Vec<String>, i32, &str)> = vec![
        (
            vec!["info".into(), "--config".into(), malformed],
            2,
            "TOML parse error at line 1",
        ),
        (
            vec!["info".into(), "--config".into(), unknown],
            2,
            "unknown field `batch`",
        ),
        (
            vec!["info".into(), "--config".into(), no_data],
            2,
            "missing field `data`",
        ),
        (
            train(&["model.d_model=31"]),
            2,
            "model.n_heads must be a divisor of d_model",
        ),
        (
            train(&["model.chunk_size=0"]),
            2,
            "model.chunk_size must be at least 1",
        ),
        (
            train(&["train.lr=-0.1"]),
            2,
            "train.lr must be positive and finite",
        ),
        (
            train(&["train.steps=5"]),
            2,
            "train.steps (5) must be a multiple of train.eval_interval (2)",
        ),
        (
            train(&["model.mixer=softmax", "model.max_seq_len=16"]),
            2,
            "longer than model.max_seq_len",
        ),
        (
            train(&[&corpus("/no/such/corpus.txt")]),
            1,
            "no such file or directory",
        ),
        (train(&[&corpus(&empty)]), 1, "is empty"),
        (
            train(&[&corpus(&short)]),
            1,
            "fewer than the 33 one window needs",
        ),
        (train(&[&corpus(&binary)]), 1, "is not valid UTF-8"),
        (
            vec!["eval".into(), "--run".into(), truncated_s],
            1,
            "cannot load",
        ),
        (
            vec!["eval".into(), "--run".into(), other_s],
            1,
            "trained with another config",
        ),
        (
            vec![
                "generate".into(),
                "--run".into(),
                run_s.clone(),
                "--prompt".into(),
                "Zebra".into(),
            ],
            2,
            "'Z' is not in the vocabulary",
        ),
        (
            vec![
                "train".into(),
                "--config".into(),
                config_s.clone(),
                "--out".into(),
                "/proc/hla-run".into(),
            ],
            1,
            "cannot create",
        ),
        (
            vec![
                "train".into(),
                "--config".into(),
                config_s.clone(),
                "--out".into(),
                run_s.clone(),
            ],
            2,
            "already holds a run",
        ),
        (
            vec!["verify".into(), "--device".into(), "tpu".into()],
            2,
            "unknown device",
        ),
        #[cfg(not(feature = "wgpu"))]
        (
            vec!["verify".into(), "--device".into(), "wgpu".into()],
            2,
            "not compiled into this build",
        ),
        (
            [
                train(&[]),
                vec!["--devices".into(), "flex,flex,flex".into()],
            ]
            .concat(),
            2,
            "train.batch_size (8) must be a multiple of the number of devices (3)",
        ),
        (
            [
                train(&["train.strategy=ddp"]),
                vec!["--devices".into(), "flex,flex".into()],
            ]
            .concat(),
            2,
            "needs several CUDA devices",
        ),
        (
            [train(&[]), vec!["--devices".into(), "flex,tpu".into()]].concat(),
            2,
            "unknown device \"tpu\"",
        ),
        #[cfg(not(feature = "cuda"))]
        (
            [train(&[]), vec!["--device".into(), "cuda:1".into()]].concat(),
            2,
            "the cuda device was not compiled into this build",
        ),
    ];
    for (args, code, message) in cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let output = hla(d, &args);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(code), "{args:?}: {stderr}");
        assert!(
            stderr.starts_with("error: ") && stderr.contains(message),
            "{args:?}: {stderr}"
        );
        assert!(
            !stderr.contains("panicked") && !stderr.contains("RUST_BACKTRACE"),
            "{args:?}: {stderr}"
        );
    }
    assert_eq!(
        std::fs::read(run.join("model.bpk")).unwrap(),
        weights,
        "the existing run is untouched"
    );
}

/// `hla bench --only train`: whole optimizer steps of the mixers and workloads asked for,
/// with and without the fused kernels in the same rounds, and an HLA mixer with its node;
/// the phases add up to the step.
#[test]
fn bench_times_training_steps() {
    let extra = [
        "--mixer",
        "linear,softmax",
        "--workload",
        "nanogpt",
        "--composed",
    ];
    let (report, tables) = quick_bench("train", &extra);
    let rows = report["train"].as_array().expect("train rows");
    assert_eq!(
        rows.len(),
        5,
        "two mixers, fused and composed, linear also as its node: {report}"
    );
    for row in rows {
        assert_eq!(row["workload"], "nanogpt");
        assert_eq!(
            (row["batch"].as_u64(), row["context"].as_u64()),
            (Some(12), Some(64))
        );
        let step = row["timing"]["median_s"].as_f64().unwrap();
        let tokens = row["tokens_per_s"].as_f64().unwrap();
        assert!((tokens * step - 768.0).abs() < 1e-6, "{row}");
        let phases: f64 = row["phases_s"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p.as_f64().unwrap())
            .sum();
        assert!(phases > 0.5 * step && phases < 2.0 * step, "{row}");
        assert!(
            row.get("launches").is_none(),
            "a CPU launches no kernel: {row}"
        );
    }
    // `node` is written only where it is true.
    let has = |mixer: &str, fused: bool, node: bool| {
        rows.iter().any(|r| {
            let is_node = r.get("node").is_some_and(|n| n == true);
            r["mixer"] == mixer && r["fused"] == fused && is_node == node
        })
    };
    assert!(
        has("linear", true, false) && has("linear", false, true),
        "{report}"
    );
    assert!(
        has("linear", false, false) && has("softmax", true, false),
        "{report}"
    );
    assert!(
        !has("softmax", false, true),
        "softmax has no node: {report}"
    );
    assert!(tables.contains("## Training steps"), "{tables}");
    assert!(tables.contains("- nanogpt softmax: "), "{tables}");
    let (_, nodes) = tables
        .split_once("Nodes over composed forms")
        .unwrap_or_else(|| panic!("{tables}"));
    assert!(nodes.contains("- nanogpt linear: "), "{tables}");
    assert!(!tables.contains("## Operators"), "{tables}");
}

/// A reader that stops early (`hla … | head`) ends `hla` quietly, by SIGPIPE as other Unix
/// tools, not with a panic from a failed print.
#[cfg(unix)]
#[test]
fn a_closed_pipe_ends_quietly() {
    use std::os::unix::process::ExitStatusExt;
    use std::process::Stdio;
    let dir = tempfile::tempdir().unwrap();
    let config = tiny_config(dir.path(), "hla2");
    let mut child = Command::new(env!("CARGO_BIN_EXE_hla"))
        .args(["info", "--config", config.to_str().unwrap()])
        .env("HLA_DATA_DIR", dir.path().join("data"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(output.status.signal(), Some(libc::SIGPIPE), "{stderr}");
}
