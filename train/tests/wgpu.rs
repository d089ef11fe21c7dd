//! `hla train --device wgpu`: a 20-step run of a tiny model on a corpus the test writes
//! finishes, and its loss is finite and falls; `hla bench --device wgpu` measures and
//! reports, and models the cost of the GPU forms.
#![cfg(feature = "wgpu")]

use std::path::Path;
use std::process::Command;

/// A char-level corpus of repeating words and a one-layer model small enough for a
/// software Vulkan device.
fn tiny_config(dir: &Path) -> std::path::PathBuf {
    let corpus = dir.join("corpus.txt");
    let words = ["the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran"];
    let text: Vec<&str> = (0..2000)
        .map(|i| words[(i * 7 + i / 3) % words.len()])
        .collect();
    std::fs::write(&corpus, text.join(" ")).unwrap();
    let config = dir.join("tiny.toml");
    let toml = format!(
        "[model]\nmixer = \"hla2\"\nd_model = 32\nn_layers = 1\nn_heads = 2\nchunk_size = 16\n\n\
         [data]\ncorpus = \"{}\"\n\n\
         [train]\ncontext = 32\nbatch_size = 8\nsteps = 20\neval_interval = 10\neval_batches = 2\n\
         warmup_steps = 2\nlr = 3e-3\n",
        corpus.display()
    );
    std::fs::write(&config, toml).unwrap();
    config
}

/// Runs `command`, checks that it succeeded, and returns its standard output.
fn stdout_of(command: &mut Command) -> String {
    let output = command.output().expect("the hla binary runs");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr),
    );
    assert!(
        output.status.success(),
        "{}\n{stdout}\n{stderr}",
        output.status
    );
    stdout.into_owned()
}

/// The `(step, value)` rows of `metric` on `split` in a run's `metrics.csv`.
fn metric(run: &Path, split: &str, metric: &str) -> Vec<(usize, f64)> {
    std::fs::read_to_string(run.join("metrics.csv"))
        .unwrap()
        .lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split(',').collect();
            (fields[1] == split && fields[2] == metric)
                .then(|| (fields[0].parse().unwrap(), fields[3].parse().unwrap()))
        })
        .collect()
}

#[test]
fn training_on_wgpu_lowers_the_loss() {
    let dir = tempfile::tempdir().unwrap();
    let config = tiny_config(dir.path());
    let run = dir.path().join("run");
    let mut command = Command::new(env!("CARGO_BIN_EXE_hla"));
    command
        .args(["train", "--device", "wgpu", "--config"])
        .arg(&config)
        .arg("--out")
        .arg(&run)
        .env("HLA_DATA_DIR", dir.path())
        .env("HLA_CACHE_DIR", dir.path().join("cache"));
    let stdout = stdout_of(&mut command);
    assert!(
        stdout.contains("Wgpu") && stdout.contains("step     20/20"),
        "{stdout}"
    );

    let train = metric(&run, "train", "loss");
    let steps: Vec<usize> = train.iter().map(|(step, _)| *step).collect();
    assert_eq!(steps, [10, 20], "{train:?}");
    let (first, last) = (train[0].1, train[1].1);
    assert!(first.is_finite() && last.is_finite(), "{train:?}");
    assert!(last < first, "the loss did not fall: {train:?}");
    let valid = metric(&run, "valid", "loss");
    assert!(
        !valid.is_empty() && valid.iter().all(|(_, loss)| loss.is_finite()),
        "{valid:?}"
    );
}

/// A malformed adapter choice is a usage mistake: one message, exit status 2.
#[test]
fn a_bad_adapter_choice_has_one_clear_message() {
    let output = Command::new(env!("CARGO_BIN_EXE_hla"))
        .args(["verify", "--device", "wgpu"])
        .env("CUBECL_WGPU_DEFAULT_DEVICE", "Gpu(0)")
        .output()
        .expect("the hla binary runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.starts_with("error: cannot start the wgpu device")
            && stderr.contains("CUBECL_WGPU_DEFAULT_DEVICE: Gpu(0)")
            && !stderr.contains("panicked"),
        "{stderr}"
    );
}

/// `hla bench` on the wgpu device: the plain matmul section (the operators themselves are
/// checked against ndarray in `model/tests/wgpu/`) gives positive GFLOP/s, and the
/// report names the device.
#[test]
fn bench_runs_on_wgpu() {
    let stdout = stdout_of(Command::new(env!("CARGO_BIN_EXE_hla")).args([
        "bench", "--device", "wgpu", "--quick", "--only", "matmul", "--json",
    ]));
    let report: serde_json::Value = serde_json::from_str(&stdout).expect("JSON on stdout");
    assert_eq!(report["device"], "wgpu");
    let rows = report["matmul"].as_array().expect("matmul rows");
    assert_eq!(rows.len(), 2, "{report}");
    assert!(
        rows.iter()
            .all(|r| r["gflops"].as_f64().is_some_and(|g| g > 0.0)),
        "{report}"
    );
}

/// A training step on the GPU is counted in kernel launches (cubecl's launch observer),
/// with the chunked mixer's kernels, as its node and with its composed form: the kernels
/// launch fewer than the composed form.
#[test]
fn bench_counts_the_kernels_of_a_step_on_wgpu() {
    let stdout = stdout_of(Command::new(env!("CARGO_BIN_EXE_hla")).args([
        "bench",
        "--device",
        "wgpu",
        "--quick",
        "--only",
        "train",
        "--workload",
        "nanogpt",
        "--mixer",
        "hla2",
        "--composed",
        "--json",
    ]));
    let report: serde_json::Value = serde_json::from_str(&stdout).expect("JSON on stdout");
    let rows = report["train"].as_array().expect("train rows");
    assert_eq!(rows.len(), 3, "{report}");
    let launches = |fused: bool, node: bool| {
        let row = rows
            .iter()
            .find(|r| r["fused"] == fused && r.get("node").is_some() == node)
            .expect("every case");
        row["launches"].as_u64().expect("a launch count on wgpu")
    };
    let (kernels, composed) = (launches(true, false), launches(false, false));
    assert!(launches(false, true) > 100, "the node's step: {report}");
    // Four layers of embedding, norms, projections, the mixer, MLP, loss, their gradients
    // and AdamW: hundreds of kernels, even fused by Burn.
    assert!(kernels > 100, "{kernels} launches: {report}");
    assert!(
        kernels < composed,
        "the kernels launched {kernels}, the composed form {composed}: {report}"
    );
}

/// The JSON report of `hla bench --device wgpu --only cost` at B2 H2 T40 d8 in chunks of 16
/// with `extra` arguments.
fn cost_report(extra: &[&str]) -> serde_json::Value {
    cost_report_at("2,2,40,8", "16", extra)
}

/// [`cost_report`] at `shape` (`B,H,T,D`) in chunks of `chunk`.
fn cost_report_at(shape: &str, chunk: &str, extra: &[&str]) -> serde_json::Value {
    let args = [
        "bench",
        "--device",
        "wgpu",
        "--only",
        "cost",
        "--cost-shape",
        shape,
        "--chunk",
        chunk,
        "--json",
    ];
    let stdout = stdout_of(
        Command::new(env!("CARGO_BIN_EXE_hla"))
            .args(args)
            .args(extra),
    );
    serde_json::from_str(&stdout).expect("JSON on stdout")
}

/// `hla bench --only cost` gives a row of every GPU form of every mixer (no node for the
/// softmax attention), read off the device's launch plans: the hand-written kernels launch
/// fewer kernels than the composed form, and the roofline has a time for each; each row's
/// parts (its steps by what runs them) add up to it.
#[test]
fn bench_models_the_cost_of_every_gpu_form() {
    let report = cost_report(&["--gpu", "h100"]);
    let cost = &report["cost"];
    assert_eq!(cost["gpu"], "H100 SXM", "{report}");
    assert_eq!(cost["gates"], "fixed", "{report}");
    assert_eq!(
        (cost["time"].as_u64(), cost["chunk"].as_u64()),
        (Some(40), Some(16))
    );
    let rows = cost["rows"].as_array().expect("cost rows");
    let forms: Vec<String> = rows
        .iter()
        .map(|r| {
            format!(
                "{} {}",
                r["mixer"].as_str().unwrap(),
                r["form"].as_str().unwrap()
            )
        })
        .collect();
    let expected: Vec<String> = ["hla2", "hla3", "linear", "ahla"]
        .iter()
        .flat_map(|m| ["kernels", "node", "composed"].map(|f| format!("{m} {f}")))
        .chain(["softmax kernels".into(), "softmax composed".into()])
        .collect();
    assert_eq!(forms, expected, "{report}");
    for r in rows {
        for field in ["launches", "flops", "bytes", "roofline_ms"] {
            assert!(r[field].as_f64().is_some_and(|x| x > 0.0), "{field}: {r}");
            let parts = r["parts"].as_array().expect("the row's parts");
            let sum: f64 = parts.iter().map(|p| p[field].as_f64().unwrap()).sum();
            let whole = r[field].as_f64().unwrap();
            assert!((sum - whole).abs() <= 1e-9 * whole, "{field}: {r}");
        }
    }
    // Where the time goes: the node's parts are its kernels (its output step with its
    // cubes; its passes split at 4 sequences, their scans bound by memory), the composed
    // form's Burn's matmuls and memory-bound ops.
    let parts = |mixer: &str, form: &str| -> Vec<String> {
        let row = rows
            .iter()
            .find(|r| r["mixer"] == mixer && r["form"] == form);
        let parts = row.and_then(|r| r["parts"].as_array()).expect("every row");
        parts
            .iter()
            .map(|p| format!("{} ({})", p["what"].as_str().unwrap(), p["engine"]))
            .collect()
    };
    let node = parts("hla2", "node");
    assert!(
        node.iter()
            .any(|p| p.contains("chunk_output") && p.contains("cubes")),
        "{node:?}"
    );
    assert!(
        node.iter()
            .any(|p| p.contains("chunk_scan") && p.contains("memory-bound")),
        "{node:?}"
    );
    let composed = parts("hla2", "composed");
    assert!(
        ["matmul", "memory"]
            .iter()
            .all(|w| composed.iter().any(|p| p.starts_with(w))),
        "{composed:?}"
    );
    let launches = |mixer: &str, form: &str| {
        rows.iter()
            .find(|r| r["mixer"] == mixer && r["form"] == form)
            .and_then(|r| r["launches"].as_u64())
            .expect("every row")
    };
    for mixer in ["hla2", "hla3", "linear", "softmax"] {
        assert!(
            launches(mixer, "kernels") < launches(mixer, "composed"),
            "{mixer}: {report}"
        );
    }
}

/// `hla bench --only cost` plans the node's forward products (hla2's moments and output)
/// and the attention's forward on the named GPU's TF32 tensor cores where their widths and
/// tiles fit the fragments (16): a shorter roofline than with `--tensor-cores off`, the
/// same launches and bytes; the report says which. At flash-linear-attention's width and
/// chunk (d 128, chunk 64), where those products are bound by compute on the CUDA cores
/// even with a kernel's memory read at its cubes' share of the bandwidth (at d 32 in
/// chunks of 16 they would then be bound by memory either way).
#[test]
fn bench_models_the_forward_products_on_the_tensor_cores() {
    let rows = |cores: &str| {
        let extra = [
            "--mixer",
            "hla2,softmax",
            "--cost-form",
            "node,kernels",
            "--tensor-cores",
            cores,
        ];
        let report = cost_report_at("1,16,256,128", "64", &extra);
        let tensor_cores = report["cost"]["rows"]
            .as_array()
            .expect("cost rows")
            .iter()
            .filter(|r| r["form"] == "node" || r["mixer"] == "softmax")
            .map(|row| {
                let figure = |key: &str| {
                    row[key]
                        .as_f64()
                        .unwrap_or_else(|| panic!("{key}: {report}"))
                };
                let name = format!("{} {}", row["mixer"], row["form"]);
                (name, ["launches", "bytes", "roofline_ms"].map(figure))
            })
            .collect::<Vec<_>>();
        let switch = report["tensor_cores"]
            .as_bool()
            .expect("the switch, reported");
        (switch, tensor_cores)
    };
    let (on, with) = rows("on");
    let (off, without) = rows("off");
    assert!(on && !off);
    assert_eq!(
        with.len(),
        2,
        "hla2's node and the attention's kernels: {with:?}"
    );
    for ((name, [launches, bytes, roofline]), (_, [launches_off, bytes_off, roofline_off])) in
        with.iter().zip(&without)
    {
        assert_eq!((launches, bytes), (launches_off, bytes_off), "{name}");
        assert!(
            roofline < roofline_off,
            "{name}: {roofline} ms against {roofline_off} ms"
        );
    }
}

/// `hla bench --only cost --gates data` reads the forms with data-dependent gates and
/// their gradient: the report says so, and hla2's node, whose fused kernels take such
/// gates, still launches fewer kernels than its composed form.
#[test]
fn bench_models_the_cost_with_data_dependent_gates() {
    let report = cost_report(&[
        "--mixer",
        "hla2",
        "--cost-form",
        "node,composed",
        "--gates",
        "data",
    ]);
    assert_eq!(report["cost"]["gates"], "data", "{report}");
    let rows = report["cost"]["rows"].as_array().expect("cost rows");
    let launches: Vec<(&str, u64)> = rows
        .iter()
        .map(|r| (r["form"].as_str().unwrap(), r["launches"].as_u64().unwrap()))
        .collect();
    let [("node", node), ("composed", composed)] = launches[..] else {
        panic!("a node and a composed row: {report}");
    };
    assert!(node < composed, "{report}");
}
