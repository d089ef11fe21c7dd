//! Several devices (`--devices`): data-parallel training is the same training as one
//! device with the same global batch. As in Burn's own tests, "several devices" here is one
//! CPU device listed twice; DDP needs two CUDA devices and runs only where they are.

mod common;

use std::path::Path;

use common::{ok, read_json, read_safetensors, tiny_config, train};

/// The run's parameters, through `hla export`.
fn parameters(dir: &Path, run: &Path) -> std::collections::BTreeMap<String, Vec<f32>> {
    let out = run.with_extension("export");
    ok(
        dir,
        &[
            "export",
            "--run",
            run.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ],
    );
    read_safetensors(&out.join("model.safetensors"))
}

/// The values of one of burn-train's logs, e.g. `train/epoch-1/Loss.log` (the epoch's
/// aggregate, the line marked `final`, left out).
fn log(run: &Path, name: &str) -> Vec<f64> {
    std::fs::read_to_string(run.join(name))
        .unwrap()
        .lines()
        .filter(|line| !line.ends_with(",final"))
        .map(|line| line.split(',').next().unwrap().parse().unwrap())
        .collect()
}

/// Each optimiser step's training loss: the mean of its `per_step` batch losses (one per
/// device; burn-train logs them in the order the devices finish).
fn step_losses(run: &Path, epochs: usize, per_step: usize) -> Vec<f64> {
    let batches: Vec<f64> = (1..=epochs)
        .flat_map(|e| log(run, &format!("train/epoch-{e}/Loss.log")))
        .collect();
    batches
        .chunks(per_step)
        .map(|step| step.iter().sum::<f64>() / per_step as f64)
        .collect()
}

fn final_loss(run: &Path) -> f64 {
    let metrics: serde_json::Value = read_json(&run.join("metrics.json"));
    metrics["validation"]["loss"].as_f64().unwrap()
}

fn assert_close(what: &str, a: &[f64], b: &[f64], tolerance: f64) {
    assert_eq!(a.len(), b.len(), "{what}: lengths");
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!((x - y).abs() <= tolerance, "{what} {i}: {x} against {y}");
    }
}

/// One optimiser step with global batch 8: on one device, on two (4 each), and on one
/// device as two accumulated batches of 4. The same loss and every parameter within 1e-5.
#[test]
fn one_step_on_two_devices_is_one_step_on_one() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let config = tiny_config(d, "hla2");
    let one_step = ["--set", "train.steps=1", "--set", "train.eval_interval=1"];
    let one = train(d, &config, "one", &one_step);
    let two = train(
        d,
        &config,
        "two",
        &[&one_step[..], &["--devices", "flex,flex"]].concat(),
    );
    let accumulated = [
        &one_step[..],
        &[
            "--set",
            "train.batch_size=4",
            "--set",
            "train.grad_accumulation=2",
        ],
    ]
    .concat();
    let accumulated = train(d, &config, "accumulated", &accumulated);

    let info = ok(
        d,
        &[
            "info",
            "--config",
            config.to_str().unwrap(),
            "--devices",
            "flex,flex",
        ],
    );
    assert!(
        info.contains("# devices           flex, flex (multi): batch 8 = 2 × 4 per device"),
        "{info}"
    );
    let reference = parameters(d, &one);
    for (run, per_step) in [(&two, 2), (&accumulated, 2)] {
        let what = run.file_name().unwrap().to_string_lossy().into_owned();
        assert_close(
            &format!("{what}: loss"),
            &step_losses(run, 1, per_step),
            &step_losses(&one, 1, 1),
            1e-5,
        );
        let params = parameters(d, run);
        assert_eq!(params.len(), reference.len());
        for (name, values) in &reference {
            let (a, b): (Vec<f64>, Vec<f64>) = values
                .iter()
                .zip(&params[name])
                .map(|(&x, &y)| (x as f64, y as f64))
                .unzip();
            assert_close(&format!("{what}: {name}"), &b, &a, 1e-5);
        }
    }
}

/// Fifty steps on two devices follow the one-device loss curve step by step; validation
/// during training runs once per interval on the main device (the same batches and
/// losses as one device), and so does the final recurrent evaluation.
#[test]
fn fifty_steps_on_two_devices_follow_one_device() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let config = tiny_config(d, "hla2");
    let fifty = ["--set", "train.steps=50", "--set", "train.eval_interval=25"];
    let one = train(d, &config, "one", &fifty);
    let two = train(
        d,
        &config,
        "two",
        &[&fifty[..], &["--devices", "flex,flex"]].concat(),
    );
    assert_close(
        "step loss",
        &step_losses(&two, 2, 2),
        &step_losses(&one, 2, 1),
        1e-5,
    );
    for epoch in 1..=2 {
        let name = format!("valid/epoch-{epoch}/Loss.log");
        assert_eq!(log(&one, &name).len(), 2, "eval_batches validation batches");
        assert_close(&name, &log(&two, &name), &log(&one, &name), 1e-5);
    }
    assert_close(
        "final validation",
        &[final_loss(&two)],
        &[final_loss(&one)],
        1e-5,
    );
}

/// A run cut back to its first checkpoint resumes, on one device or two, to the numbers of
/// the run that never stopped (the same losses, step by step).
#[test]
fn runs_on_several_devices_resume() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let config = tiny_config(d, "hla2");
    let fifty = ["--set", "train.steps=50", "--set", "train.eval_interval=25"];
    for devices in ["flex", "flex,flex"] {
        let whole = train(
            d,
            &config,
            devices,
            &[&fifty[..], &["--devices", devices]].concat(),
        );
        let cut = d.join(format!("{devices}-resumed"));
        copy_dir(&whole, &cut);
        for stale in ["metrics.json", "model.bpk"] {
            std::fs::remove_file(cut.join(stale)).unwrap();
        }
        for stale in ["model-2.bpk", "optim-2.bpk", "scheduler-2.bpk"] {
            std::fs::remove_file(cut.join("checkpoint").join(stale)).unwrap();
        }
        for stale in ["train/epoch-2", "valid/epoch-2"] {
            std::fs::remove_dir_all(cut.join(stale)).unwrap();
        }
        let log = ok(d, &["train", "--out", cut.to_str().unwrap(), "--resume"]);
        assert!(log.contains("resuming at step 25"), "{log}");
        let per_step = devices.split(',').count();
        assert_close(
            &format!("{devices}: resumed step loss"),
            &step_losses(&cut, 2, per_step),
            &step_losses(&whole, 2, per_step),
            0.0,
        );
    }
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let path = entry.unwrap().path();
        let target = to.join(path.file_name().unwrap());
        if path.is_dir() {
            copy_dir(&path, &target);
        } else {
            std::fs::copy(&path, &target).unwrap();
        }
    }
}

/// DDP (NCCL all-reduce) over two CUDA devices against one: runs only in a build with the
/// `cuda` feature on a machine with at least two NVIDIA GPUs, and says when it skips.
#[test]
fn ddp_on_two_cuda_devices_is_one_device() {
    if !cfg!(feature = "cuda") {
        eprintln!("skipped: this build has no cuda feature");
        return;
    }
    let gpus = std::process::Command::new("nvidia-smi")
        .arg("-L")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).lines().count())
        .unwrap_or(0);
    if gpus < 2 {
        eprintln!("skipped: DDP needs two CUDA devices, nvidia-smi lists {gpus}");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let config = tiny_config(d, "hla2");
    let steps = ["--set", "train.steps=4", "--set", "train.eval_interval=2"];
    let one = train(
        d,
        &config,
        "one",
        &[&steps[..], &["--device", "cuda:0"]].concat(),
    );
    let ddp = [
        &steps[..],
        &["--devices", "cuda:0,cuda:1", "--set", "train.strategy=ddp"],
    ]
    .concat();
    let ddp = train(d, &config, "ddp", &ddp);
    // GPU reductions are not bit-reproducible: a looser bound than on the CPU.
    assert_close(
        "final validation",
        &[final_loss(&ddp)],
        &[final_loss(&one)],
        1e-3,
    );
}
