//! `hla bench` and `hla verify`: the sections asked for, their JSON and tables.

use std::process::Command;

use crate::common::{hla, ok, read_json, tiny_config};

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
    let written: serde_json::Value = read_json(&out.join("bench.json"));
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
