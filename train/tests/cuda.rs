//! The `cuda` build, checked without a GPU (`scripts/cuda-build.sh --test`, which also runs
//! hla-model's PTX tests, `model/src/ptx_tests.rs`): the binary gives one message where no
//! CUDA driver is installed.
#![cfg(feature = "cuda")]

use std::process::Command;

#[test]
fn no_cuda_driver_is_one_message() {
    let libcuda = [
        "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
        "/usr/lib64/libcuda.so.1",
    ];
    if libcuda.iter().any(|p| std::path::Path::new(p).exists()) {
        eprintln!("skipped: this machine has a CUDA driver");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_hla"))
        .args(["train", "--device", "cuda", "--config"])
        .arg(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs/smoke.toml"))
        .arg("--out")
        .arg(dir.path().join("run"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("cannot start the CUDA device cuda:0: no CUDA driver"),
        "{stderr}"
    );
    assert!(!dir.path().join("run").exists(), "nothing is written");
}
