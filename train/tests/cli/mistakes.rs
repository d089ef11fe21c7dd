//! Mistakes: each bad input gets one clear message and its exit status.

use std::path::Path;

use crate::common::{hla, ok, tiny_config};

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
        fails_with(dir.path(), args, code, message);
    }
}

/// Every bad input gets one clear message and its exit status (2: usage or config, 1: a
/// failure while running), never a panic, and leaves what is on disk alone.
#[test]
fn every_bad_input_has_one_clear_message() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let config = tiny_config(d, "hla2");
    let run = d.join("run");
    ok(
        d,
        &["train", "--config", &text(&config), "--out", &text(&run)],
    );
    let weights = std::fs::read(run.join("model.bpk")).unwrap();
    let inputs = Inputs::write(d, &config, &run, &weights);
    let cases = [
        inputs.config_cases(),
        inputs.corpus_cases(),
        inputs.run_cases(),
        inputs.device_cases(),
    ];
    for (args, code, message) in cases.into_iter().flatten() {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        fails_with(d, &args, code, message);
    }
    assert_eq!(
        std::fs::read(run.join("model.bpk")).unwrap(),
        weights,
        "the existing run is untouched"
    );
}

/// A command line, the exit status it must end with and a part of its one message.
type Case = (Vec<String>, i32, &'static str);

/// `hla ARGS` exits with `code` and one message on stderr that holds `message`, with no
/// panic.
fn fails_with(dir: &Path, args: &[&str], code: i32, message: &str) {
    let output = hla(dir, args);
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

fn text(path: &Path) -> String {
    path.to_str().unwrap().to_string()
}

fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|a| a.to_string()).collect()
}

/// The bad inputs the cases name, written beside a trained run: configs, corpora, and
/// copies of the run with another architecture's config or half its weights.
struct Inputs {
    config: String,
    run: String,
    fresh: String,
    malformed: String,
    unknown: String,
    no_data: String,
    empty: String,
    short: String,
    binary: String,
    other: String,
    truncated: String,
}

impl Inputs {
    fn write(d: &Path, config: &Path, run: &Path, weights: &[u8]) -> Self {
        let write = |name: &str, text: &[u8]| {
            let path = d.join(name);
            std::fs::write(&path, text).unwrap();
            path.to_str().unwrap().to_string()
        };
        let base = std::fs::read_to_string(config).unwrap();
        let copy = |name: &str, files: &[&str]| {
            let to = d.join(name);
            std::fs::create_dir_all(&to).unwrap();
            for file in files {
                std::fs::copy(run.join(file), to.join(file)).unwrap();
            }
            to
        };
        let other = copy("other", &["config.toml", "model.bpk", "tokenizer.json"]);
        let other_config = std::fs::read_to_string(other.join("config.toml"))
            .unwrap()
            .replace("d_model = 32", "d_model = 64");
        std::fs::write(other.join("config.toml"), other_config).unwrap();
        let truncated = copy("truncated", &["config.toml", "tokenizer.json"]);
        std::fs::write(truncated.join("model.bpk"), &weights[..weights.len() / 2]).unwrap();
        Inputs {
            config: text(config),
            run: text(run),
            fresh: text(&d.join("fresh")),
            malformed: write("malformed.toml", b"[model\n"),
            unknown: write("unknown.toml", format!("{base}\nbatch = 3\n").as_bytes()),
            no_data: write("no-data.toml", b"[model]\nmixer = \"hla2\"\n"),
            empty: write("empty.txt", b""),
            short: write("short.txt", b"abc"),
            binary: write("binary.txt", &[b'o', b'k', 0xff]),
            other: text(&other),
            truncated: text(&truncated),
        }
    }

    /// `hla train` of the config into a fresh folder with `sets` (`--set KEY=VALUE`).
    fn train(&self, sets: &[&str]) -> Vec<String> {
        let mut args = strings(&["train", "--config", &self.config, "--out", &self.fresh]);
        for set in sets {
            args.extend(strings(&["--set", set]));
        }
        args
    }

    /// Configs that do not parse, and keys out of range.
    fn config_cases(&self) -> Vec<Case> {
        let info = |config: &str| strings(&["info", "--config", config]);
        vec![
            (info(&self.malformed), 2, "TOML parse error at line 1"),
            (info(&self.unknown), 2, "unknown field `batch`"),
            (info(&self.no_data), 2, "missing field `data`"),
            (
                self.train(&["model.d_model=31"]),
                2,
                "model.n_heads must be a divisor of d_model",
            ),
            (
                self.train(&["model.chunk_size=0"]),
                2,
                "model.chunk_size must be at least 1",
            ),
            (
                self.train(&["train.lr=-0.1"]),
                2,
                "train.lr must be positive and finite",
            ),
            (
                self.train(&["train.steps=5"]),
                2,
                "train.steps (5) must be a multiple of train.eval_interval (2)",
            ),
            (
                self.train(&["model.mixer=softmax", "model.max_seq_len=16"]),
                2,
                "longer than model.max_seq_len",
            ),
        ]
    }

    /// Corpora that are missing, empty, too short or not UTF-8.
    fn corpus_cases(&self) -> Vec<Case> {
        let corpus = |path: &str| self.train(&[&format!("data.corpus=\"{path}\"")]);
        vec![
            (
                corpus("/no/such/corpus.txt"),
                1,
                "no such file or directory",
            ),
            (corpus(&self.empty), 1, "is empty"),
            (corpus(&self.short), 1, "fewer than the 33 one window needs"),
            (corpus(&self.binary), 1, "is not valid UTF-8"),
        ]
    }

    /// Runs that do not load, a prompt outside the vocabulary, and output folders that
    /// cannot be made or already hold a run.
    fn run_cases(&self) -> Vec<Case> {
        let eval = |run: &str| strings(&["eval", "--run", run]);
        let train_into = |out: &str| strings(&["train", "--config", &self.config, "--out", out]);
        let generate = strings(&["generate", "--run", &self.run, "--prompt", "Zebra"]);
        vec![
            (eval(&self.truncated), 1, "cannot load"),
            (eval(&self.other), 1, "trained with another config"),
            (generate, 2, "'Z' is not in the vocabulary"),
            (train_into("/proc/hla-run"), 1, "cannot create"),
            (train_into(&self.run), 2, "already holds a run"),
        ]
    }

    /// Devices that are unknown, not compiled in, or do not divide the batch.
    fn device_cases(&self) -> Vec<Case> {
        let devices = |sets: &[&str], devices: &str| {
            [self.train(sets), strings(&["--devices", devices])].concat()
        };
        vec![
            (strings(&["verify", "--device", "tpu"]), 2, "unknown device"),
            #[cfg(not(feature = "wgpu"))]
            (
                strings(&["verify", "--device", "wgpu"]),
                2,
                "not compiled into this build",
            ),
            (
                devices(&[], "flex,flex,flex"),
                2,
                "train.batch_size (8) must be a multiple of the number of devices (3)",
            ),
            (
                devices(&["train.strategy=ddp"], "flex,flex"),
                2,
                "needs several CUDA devices",
            ),
            (devices(&[], "flex,tpu"), 2, "unknown device \"tpu\""),
            #[cfg(not(feature = "cuda"))]
            (
                [self.train(&[]), strings(&["--device", "cuda:1"])].concat(),
                2,
                "the cuda device was not compiled into this build",
            ),
        ]
    }
}
