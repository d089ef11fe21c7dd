//! `hla` on a full disk: a standard output that cannot be written, a metric log on
//! `/dev/full`, and a really full file system (a tmpfs, where this machine lets the test
//! mount one): one message, exit status 1, and what was done before stays usable.

mod common;

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::{hla, ok, one_error, prepared_text, tiny_config};

/// A standard output that cannot be written (a full disk behind `> log`) ends `hla` with
/// one message and status 1, also while burn-train prints during training; a later run
/// into the same directory takes over what was left.
#[test]
fn a_full_stdout_is_one_message() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let config = tiny_config(d, "hla2");
    let config = config.to_str().unwrap();
    let run = d.join("run");
    let run = run.to_str().unwrap();
    for args in [
        vec!["info", "--config", config],
        vec!["train", "--config", config, "--out", run],
    ] {
        let output = Command::new(env!("CARGO_BIN_EXE_hla"))
            .args(&args)
            .env("HLA_DATA_DIR", d)
            .env("HLA_CACHE_DIR", d.join("cache"))
            .stdout(File::create("/dev/full").unwrap())
            .output()
            .unwrap();
        let message = "error: cannot write to stdout: No space left on device";
        one_error(&output, 1, &[message]);
    }
    ok(d, &["train", "--config", config, "--out", run]);
}

/// A metric log on a full disk (`/dev/full`) in the second validation interval: one
/// message and status 1; the first checkpoint stays, and the run resumes from it.
#[test]
fn a_full_disk_while_logging_keeps_the_last_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let config = tiny_config(d, "hla2");
    let run = d.join("run");
    let log = run.join("train/epoch-2/Loss.log");
    std::fs::create_dir_all(log.parent().unwrap()).unwrap();
    std::os::unix::fs::symlink("/dev/full", &log).unwrap();
    let (config, run_s) = (config.to_str().unwrap(), run.to_str().unwrap());
    let output = hla(d, &["train", "--config", config, "--out", run_s]);
    let parts = [
        "Loss.log: No space left on device",
        "the last complete checkpoint",
        "--resume",
    ];
    one_error(&output, 1, &parts);
    assert!(run.join("checkpoint/model-1.bpk").exists());
    assert!(!run.join("checkpoint/model-2.bpk").exists());
    std::fs::remove_file(&log).unwrap();
    let resumed = ok(d, &["train", "--out", run_s, "--resume"]);
    assert!(resumed.contains("step      4/4"), "{resumed}");
}

/// `experiment.log` on a full disk (`/dev/full`): one message with its path, status 1.
#[test]
fn a_full_disk_under_the_experiment_log_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let config = tiny_config(d, "hla2");
    let run = d.join("run");
    std::fs::create_dir_all(&run).unwrap();
    std::os::unix::fs::symlink("/dev/full", run.join("experiment.log")).unwrap();
    let (config, run_s) = (config.to_str().unwrap(), run.to_str().unwrap());
    let output = hla(d, &["train", "--config", config, "--out", run_s]);
    one_error(
        &output,
        1,
        &["experiment.log: No space left on device", "--resume"],
    );
}

/// A tmpfs mounted at a folder until dropped.
struct Tmpfs(PathBuf);

impl Tmpfs {
    /// Mounts one of `size` at `dir`; `None`, saying why, where this machine does not let
    /// the test mount (not root, or a container without the capability).
    fn mount(dir: &Path, size: &str) -> Option<Self> {
        std::fs::create_dir_all(dir).unwrap();
        let mounted = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir)
            .output();
        match mounted {
            Ok(output) if output.status.success() => Some(Self(dir.into())),
            Ok(output) => {
                let why = String::from_utf8_lossy(&output.stderr);
                eprintln!("skipped: cannot mount a tmpfs here ({})", why.trim());
                None
            }
            Err(e) => {
                eprintln!("skipped: cannot run mount ({e})");
                None
            }
        }
    }

    /// Fills it but about `room` bytes: zeros written until it is full, then cut back.
    fn fill_but(&self, room: u64) -> PathBuf {
        let path = self.0.join("filler");
        let mut file = File::create(&path).unwrap();
        let block = vec![0u8; 1 << 16];
        while matches!(file.write(&block), Ok(n) if n > 0) {}
        let len = file.metadata().unwrap().len();
        file.set_len(len.saturating_sub(room)).unwrap();
        path
    }

    /// The bytes still free, as a file that fills them measures them (whatever the page
    /// size).
    fn free(&self) -> u64 {
        let filler = self.fill_but(0);
        let free = filler.metadata().unwrap().len();
        std::fs::remove_file(filler).unwrap();
        free
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

/// A really full disk (a tmpfs): a preparation fails with one message and leaves the
/// earlier one in the cache; a run that runs out of room after its first checkpoint stops
/// with one message and status 1, and resumes from that checkpoint once there is room.
#[test]
fn a_full_disk_is_one_message_and_keeps_what_was_done() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let Some(disk) = Tmpfs::mount(&d.join("disk"), "16m") else {
        return;
    };
    let config = tiny_config(d, "hla2");
    let config = config.to_str().unwrap();

    // The cache on the full disk.
    let (prepared, _) = prepared_text(&ok(&disk.0, &["prepare", "--config", config]));
    let before = std::fs::read(prepared.join("tokens.bin")).unwrap();
    let filler = disk.fill_but(0);
    let byte = [
        "prepare",
        "--config",
        config,
        "--set",
        "data.tokenizer=byte",
    ];
    one_error(&hla(&disk.0, &byte), 1, &["No space left on device"]);
    assert_eq!(std::fs::read(prepared.join("tokens.bin")).unwrap(), before);
    let again = ok(&disk.0, &["prepare", "--config", config]);
    assert!(again.starts_with("re-using"), "{again}");
    std::fs::remove_file(filler).unwrap();

    // A run of one validation interval measures what one needs; the next gets a little more
    // room than that, which its second checkpoint does not fit in.
    let run = |name: &str| disk.0.join(name).to_str().unwrap().to_string();
    let one = [
        "train",
        "--config",
        config,
        "--out",
        &run("one"),
        "--set",
        "train.steps=2",
    ];
    let free = disk.free();
    ok(d, &one);
    let room = free - disk.free() + 16 * 1024;
    std::fs::remove_dir_all(disk.0.join("one")).unwrap();
    let filler = disk.fill_but(room);
    let two = run("two");
    let output = hla(d, &["train", "--config", config, "--out", &two]);
    one_error(&output, 1, &["No space left on device", "--resume"]);
    assert!(Path::new(&two).join("checkpoint/model-1.bpk").exists());
    std::fs::remove_file(filler).unwrap();
    let resumed = ok(d, &["train", "--out", &two, "--resume"]);
    assert!(resumed.contains("step      4/4"), "{resumed}");
}
