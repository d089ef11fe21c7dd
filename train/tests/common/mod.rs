//! Shared helpers of the binary's tests: running `hla`, a tiny config and corpus.
#![allow(dead_code)] // each test binary uses its own subset

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use hla_data::prepared;

/// Runs `hla` with `data_dir` as its data and cache directories; a panic fails the test.
pub fn hla(data_dir: &Path, args: &[&str]) -> Output {
    let output = Command::new(env!("CARGO_BIN_EXE_hla"))
        .args(args)
        .env("HLA_DATA_DIR", data_dir)
        .env("HLA_CACHE_DIR", data_dir.join("cache"))
        .output()
        .expect("the hla binary runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!stderr.contains("panicked"), "{args:?} panicked: {stderr}");
    output
}

/// Runs `hla` and returns its standard output; a failure fails the test.
pub fn ok(data_dir: &Path, args: &[&str]) -> String {
    let output = hla(data_dir, args);
    assert!(
        output.status.success(),
        "{args:?} failed ({}): {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).expect("UTF-8 output")
}

/// Checks that `output` failed with `code` and one message, on one line, that holds every
/// one of `parts`; returns it.
pub fn one_error(output: &Output, code: i32, parts: &[&str]) -> String {
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert_eq!(output.status.code(), Some(code), "{stderr}");
    assert!(
        !stderr.contains("panicked") && !stderr.contains("PANIC"),
        "{stderr}"
    );
    let errors: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(errors.len(), 1, "one message: {stderr}");
    for part in parts {
        assert!(errors[0].contains(part), "{part:?} not in {stderr}");
    }
    stderr
}

/// The folder `hla prepare` printed, and its corpus decoded.
pub fn prepared_text(stdout: &str) -> (PathBuf, String) {
    let first = stdout.lines().next().unwrap();
    let dir = first.split_whitespace().nth(1).unwrap();
    let p = prepared::open(Path::new(dir)).unwrap();
    let text = p
        .tokenizer
        .decode(&p.tokens.read(0..p.tokens.len()))
        .unwrap();
    (dir.into(), text)
}

/// A tiny config for `mixer` on a repetitive word corpus written into `dir`.
pub fn tiny_config(dir: &Path, mixer: &str) -> std::path::PathBuf {
    let corpus = dir.join("corpus.txt");
    let words = [
        "the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran", "far",
    ];
    let text: Vec<&str> = (0..4000)
        .map(|i| words[(i * 7 + i / 3) % words.len()])
        .collect();
    std::fs::write(&corpus, text.join(" ")).unwrap();
    let config = dir.join(format!("tiny-{mixer}.toml"));
    let toml = format!(
        "[model]\nmixer = \"{mixer}\"\nd_model = 32\nn_layers = 1\nn_heads = 2\nchunk_size = 16\n\n\
         [data]\ncorpus = \"{}\"\n\n\
         [train]\ncontext = 32\nbatch_size = 8\nsteps = 4\neval_interval = 2\neval_batches = 2\nwarmup_steps = 1\n",
        corpus.display()
    );
    std::fs::write(&config, toml).unwrap();
    config
}

/// The JSON file at `path`.
pub fn read_json(path: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// Every tensor of a safetensors file (float32), by name.
pub fn read_safetensors(path: &Path) -> std::collections::BTreeMap<String, Vec<f32>> {
    let bytes = std::fs::read(path).unwrap();
    let header_len = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + header_len]).unwrap();
    let data = &bytes[8 + header_len..];
    header
        .as_object()
        .unwrap()
        .iter()
        .filter(|(name, _)| *name != "__metadata__")
        .map(|(name, info)| {
            assert_eq!(info["dtype"], "F32", "{name}");
            let [start, end] = [0, 1].map(|i| info["data_offsets"][i].as_u64().unwrap() as usize);
            let values = data[start..end]
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
                .collect();
            (name.clone(), values)
        })
        .collect()
}

/// When process `pid` started, in clock ticks after boot (`/proc/<pid>/stat`'s 22nd field),
/// as `hla` records it in a run's lock.
pub fn process_start(pid: &str) -> String {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    stat[stat.rfind(')').unwrap() + 1..]
        .split_whitespace()
        .nth(19)
        .unwrap()
        .to_string()
}

/// Trains `config` into `dir/name` with extra arguments, and returns the run directory.
pub fn train(dir: &Path, config: &Path, name: &str, extra: &[&str]) -> PathBuf {
    let run = dir.join(name);
    let mut args = vec![
        "train",
        "--config",
        config.to_str().unwrap(),
        "--out",
        run.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    ok(dir, &args);
    run
}
