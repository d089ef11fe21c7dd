//! `hla compare` end to end on a two-run toy MQAR experiment: runs, results.md,
//! results.csv, charts; a second call skips the finished runs; more steps extend them; a
//! changed identity (the seed) is refused until `--force`.

use std::path::Path;
use std::process::Output;
use std::time::Instant;

fn hla(dir: &Path, args: &[&str]) -> Output {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_hla"))
        .args(args)
        .current_dir(dir)
        .output()
        .expect("the hla binary runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!stderr.contains("panicked"), "{args:?} panicked: {stderr}");
    output
}

fn ok(dir: &Path, args: &[&str]) -> String {
    let output = hla(dir, args);
    assert!(
        output.status.success(),
        "{args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).expect("UTF-8 output")
}

const CONFIG: &str = "[model]\nmixer = \"hla2\"\nd_model = 16\nn_layers = 1\nn_heads = 2\n\
    chunk_size = 8\n\n[data.mqar]\nvocab_size = 32\nrandom_non_queries = false\n\
    settings = [{ seq_len = 16, num_kv_pairs = 2, train_examples = 64, test_examples = 16 }]\n\n\
    [train]\nbatch_size = 8\nsteps = 4\neval_interval = 2\nwarmup_steps = 1\n";

fn experiment(dir: &Path, steps: usize, seed: u64) -> String {
    let folder = dir.join("experiments/toy");
    std::fs::create_dir_all(&folder).unwrap();
    std::fs::write(dir.join("tiny.toml"), CONFIG).unwrap();
    let text = format!(
        "title = \"Toy\"\nconfig = \"../../tiny.toml\"\n\
         set = [\"train.steps={steps}\", \"train.seed={seed}\"]\n\n\
         [[sweep]]\nname = \"toy\"\n[[sweep.axis]]\nkey = \"model.mixer\"\nvalues = [\"hla2\", \"linear\"]\n"
    );
    let path = folder.join("experiment.toml");
    std::fs::write(&path, text).unwrap();
    "experiments/toy/experiment.toml".into()
}

#[test]
fn compare_trains_reports_and_skips_finished_runs() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let file = experiment(d, 4, 1337);
    let folder = d.join("experiments/toy");

    let plan = ok(d, &["compare", "--experiment", &file, "--dry-run"]);
    assert!(
        plan.contains("toy-hla2") && plan.contains("--set model.mixer=\"linear\""),
        "{plan}"
    );
    assert!(!folder.join("runs").exists(), "a dry run trains nothing");

    let log = ok(d, &["compare", "--experiment", &file]);
    assert!(
        log.contains("[1/2] toy-hla2: training") && log.contains("[2/2] toy-linear: training"),
        "{log}"
    );
    for run in ["toy-hla2", "toy-linear"] {
        assert!(folder.join("runs").join(run).join("model.bpk").exists());
    }
    results_csv_has_a_row_per_run(&folder);
    results_md_and_charts(&folder);
    finished_runs_are_skipped(d, &file, &folder);
    changed_runs_continue_or_start_over(d, &file);
}

/// `results.csv`: a header with every column and one row per run, in order.
fn results_csv_has_a_row_per_run(folder: &Path) {
    let csv = std::fs::read_to_string(folder.join("results.csv")).unwrap();
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(lines.len(), 3, "a header and two rows: {csv}");
    let header: Vec<&str> = lines[0].split(',').collect();
    for column in [
        "name",
        "mixer",
        "params",
        "state_floats",
        "wall_seconds",
        "tokens_per_second",
        "final_loss",
        "best_loss",
        "final_accuracy",
    ] {
        assert!(header.contains(&column), "{column} in {header:?}");
    }
    assert!(lines[1].starts_with("toy-hla2,toy-hla2,hla2,16,"), "{csv}");
    assert!(
        lines[2].starts_with("toy-linear,toy-linear,linear,16,"),
        "{csv}"
    );
    for line in &lines[1..] {
        assert_eq!(line.split(',').count(), header.len(), "{line}");
    }
}

/// `results.md` (title, runs finished, the runs' table) and each chart as PNG and SVG.
fn results_md_and_charts(folder: &Path) {
    let md = std::fs::read_to_string(folder.join("results.md")).unwrap();
    assert!(
        md.starts_with("# Toy") && md.contains("2 of 2 runs finished"),
        "{md}"
    );
    assert!(md.contains("| run | mixer | d_model | T | N |"), "{md}");
    assert!(md.contains("| toy-hla2 | hla2 | 16 | 16 | 2 |"), "{md}");
    assert!(md.contains("| toy-linear | linear |"), "{md}");
    for chart in ["validation-loss", "mqar-accuracy", "metric-vs-state"] {
        let png = std::fs::read(folder.join(format!("{chart}.png"))).unwrap();
        assert!(
            png.starts_with(b"\x89PNG\r\n\x1a\n") && png.len() > 1000,
            "{chart}.png"
        );
        let svg = std::fs::read_to_string(folder.join(format!("{chart}.svg"))).unwrap();
        assert!(
            svg.trim_start().starts_with("<svg") && svg.contains("<text"),
            "{chart}.svg"
        );
    }
}

/// A second call on other devices (not another config) skips the finished runs quickly and
/// leaves their weights alone.
fn finished_runs_are_skipped(d: &Path, file: &str, folder: &Path) {
    let weights = std::fs::read(folder.join("runs/toy-hla2/model.bpk")).unwrap();
    let started = Instant::now();
    // Other devices are not another config: the finished runs stay finished.
    let again = ok(
        d,
        &["compare", "--experiment", file, "--devices", "flex,flex"],
    );
    assert!(
        again.contains("[1/2] toy-hla2: finished already, skipped")
            && again.contains("[2/2] toy-linear: finished already, skipped"),
        "{again}"
    );
    assert!(started.elapsed().as_secs() < 30, "skipping trains nothing");
    assert_eq!(
        std::fs::read(folder.join("runs/toy-hla2/model.bpk")).unwrap(),
        weights
    );
}

/// More steps continue the finished runs from their last checkpoint; another seed is
/// refused until `--force`, which starts over.
fn changed_runs_continue_or_start_over(d: &Path, file: &str) {
    // More steps: the finished runs continue from their last checkpoint.
    experiment(d, 6, 1337);
    let extended = ok(d, &["compare", "--experiment", file]);
    assert!(
        extended.contains("toy-hla2: resuming")
            && extended.contains("resuming at step 4")
            && extended.contains("step      6/6"),
        "{extended}"
    );
    // Another seed: not the same runs any more, refused until --force.
    experiment(d, 6, 7);
    let refused = hla(d, &["compare", "--experiment", file]);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("toy-hla2: train.seed: 1337 → 7") && stderr.contains("--force"),
        "{stderr}"
    );
    let forced = ok(
        d,
        &[
            "compare",
            "--experiment",
            file,
            "--force",
            "--only",
            "toy-linear",
        ],
    );
    assert!(
        forced.contains("[1/1] toy-linear: config changed: starting over"),
        "{forced}"
    );
    assert!(forced.contains("step      6/6"), "{forced}");
}

/// Mistakes in the experiment exit with status 2 and one message, before anything trains.
#[test]
fn experiment_mistakes_exit_with_2() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let file = experiment(d, 4, 1337);
    let write = |name: &str, text: &str| {
        let path = d.join("experiments/toy").join(name);
        std::fs::write(&path, text).unwrap();
        format!("experiments/toy/{name}")
    };
    let unknown = write("unknown.toml", "confg = \"x\"\n");
    let missing = write(
        "missing.toml",
        "[[run]]\nname = \"a\"\nconfig = \"no-such.toml\"\n",
    );
    let bad_set = write(
        "bad-set.toml",
        "[[run]]\nname = \"a\"\nconfig = \"../../tiny.toml\"\nset = [\"model.mixr=x\"]\n",
    );
    let cases: [(&[&str], &str); 5] = [
        (
            &["compare", "--experiment", "nothing.toml"],
            "cannot read the experiment file",
        ),
        (
            &["compare", "--experiment", &unknown],
            "unknown field `confg`",
        ),
        (
            &["compare", "--experiment", &missing],
            "cannot read the config file",
        ),
        (
            &["compare", "--experiment", &bad_set],
            "unknown field `mixr`",
        ),
        (
            &["compare", "--experiment", &file, "--only", "nope"],
            "--only nope: the experiment has no such run",
        ),
    ];
    for (args, message) in cases {
        let output = hla(d, args);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(
            stderr.starts_with("error: ") && stderr.contains(message),
            "{args:?}: {stderr}"
        );
    }
    assert!(!d.join("experiments/toy/runs").exists());
}

/// Every committed run was trained with what its experiment file and today's defaults
/// say: a changed default (or a key added later with another default) would otherwise
/// make `hla compare` refuse to go on, and `hla eval` rebuild the run with another model.
#[test]
fn committed_runs_match_their_experiments() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut checked = 0;
    for entry in std::fs::read_dir(root.join("experiments")).unwrap() {
        let file = entry.unwrap().path().join("experiment.toml");
        if !file.exists() {
            continue;
        }
        let plan = ok(
            &root,
            &[
                "compare",
                "--experiment",
                file.to_str().unwrap(),
                "--dry-run",
            ],
        );
        let changed: Vec<&str> = plan
            .lines()
            .filter(|l| l.contains("config changed"))
            .collect();
        assert!(
            changed.is_empty(),
            "{}:\n{}",
            file.display(),
            changed.join("\n")
        );
        checked += plan.matches("finished already").count();
    }
    assert!(checked > 0, "no committed runs found");
}
