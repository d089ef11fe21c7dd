//! The files of a run directory.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use burn::lr_scheduler::LrSchedulerRecord;
use burn::module::Module;
use burn::optim::OptimizerRecord;
use burn::prelude::*;
use burn::store::ModuleRecord;
use hla_model::lm::Lm;

use super::config::RunConfig;
use super::usage::UsageError;

pub struct RunDir(PathBuf);

/// Keys that runs record today but older `hla` versions did not write, with the value those
/// versions trained with: before `train.clip` existed, each parameter's gradient was clipped
/// on its own.
const BEFORE_RECORDED: [(&str, &str, &str); 1] = [("train", "clip", "\"parameter\"")];

/// Holds a run directory's lock; removes it when dropped, and the directory too when this
/// lock created it and nothing was written there (a run that failed before it started).
pub struct RunLock {
    path: PathBuf,
    created: Option<PathBuf>,
}

impl Drop for RunLock {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
        if let Some(dir) = &self.created {
            // Fails, as it should, on a directory that holds anything.
            let _ = std::fs::remove_dir(dir);
        }
    }
}

impl RunDir {
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self(path.into())
    }

    pub fn path(&self) -> &Path {
        &self.0
    }

    pub fn config(&self) -> PathBuf {
        self.0.join("config.toml")
    }

    pub fn model(&self) -> PathBuf {
        self.0.join("model.bpk")
    }

    pub fn tokenizer(&self) -> PathBuf {
        self.0.join("tokenizer.json")
    }

    /// The prepared corpus's `meta.json` (text runs): its source, tokens, split and the
    /// documents a documents split holds out.
    pub fn data(&self) -> PathBuf {
        self.0.join("data.json")
    }

    pub fn checkpoints(&self) -> PathBuf {
        self.0.join("checkpoint")
    }

    pub fn metrics(&self) -> PathBuf {
        self.0.join("metrics.json")
    }

    /// The segments the run trained in ([`History`](super::history::History)).
    pub fn history(&self) -> PathBuf {
        self.0.join("history.json")
    }

    /// Claims the run directory for this process until the guard drops: a second `hla
    /// train` into the same directory is refused. The lock names its owner by pid and the
    /// time that process started, so that a lock left by a killed process is taken over even
    /// when its pid now belongs to another program.
    pub fn lock(&self) -> Result<RunLock> {
        let created = (!self.0.exists()).then(|| self.0.clone());
        std::fs::create_dir_all(&self.0)
            .with_context(|| format!("cannot create the run directory {}", self.0.display()))?;
        let path = self.0.join("run.lock");
        for _ in 0..2 {
            match std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&path)
            {
                Ok(mut file) => {
                    let lock = RunLock { path, created };
                    let owner = Owner::this_process().to_string();
                    std::io::Write::write_all(&mut file, owner.as_bytes())
                        .with_context(|| format!("cannot write {}", lock.path.display()))?;
                    return Ok(lock);
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    let text = std::fs::read_to_string(&path).unwrap_or_default();
                    let owner = Owner::parse(&text);
                    if let Some(owner) = owner.as_ref().filter(|o| o.is_running()) {
                        bail!(
                            "another hla process (pid {}) is training into {}: wait for it to \
                             finish, or stop it (kill {}); if no hla process uses this run, \
                             remove {}",
                            owner.pid,
                            self.0.display(),
                            owner.pid,
                            path.display()
                        );
                    }
                    std::fs::remove_file(&path).with_context(|| {
                        format!("cannot clear the stale lock {}", path.display())
                    })?;
                }
                Err(e) => {
                    return Err(e).with_context(|| format!("cannot lock {}", self.0.display()));
                }
            }
        }
        bail!("cannot lock {}", self.0.display())
    }

    /// Removes temporary files a killed run left half-written (`*.tmp`, here and in
    /// `checkpoint/`): every file that stays reads back.
    pub fn remove_partial_files(&self) -> Result<()> {
        for dir in [self.0.clone(), self.checkpoints()] {
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            for path in entries.filter_map(|e| e.ok().map(|e| e.path())) {
                if path.extension().is_some_and(|e| e == "tmp") {
                    std::fs::remove_file(&path)
                        .with_context(|| format!("cannot remove {}", path.display()))?;
                }
            }
        }
        Ok(())
    }

    /// Removes everything in the run directory but its lock (`--force`).
    pub fn clear(&self) -> Result<()> {
        let entries = std::fs::read_dir(&self.0)
            .with_context(|| format!("cannot read {}", self.0.display()))?;
        for entry in entries {
            let path = entry?.path();
            if path.file_name().is_some_and(|n| n == "run.lock") {
                continue;
            }
            let removed = if path.is_dir() {
                std::fs::remove_dir_all(&path)
            } else {
                std::fs::remove_file(&path)
            };
            removed.with_context(|| format!("cannot clear {}", path.display()))?;
        }
        Ok(())
    }

    /// The resolved config the run was trained with, with `overrides` applied. A key that
    /// an older `hla` did not record reads as what that `hla` did ([`BEFORE_RECORDED`]), not
    /// as today's default.
    pub fn load_config(&self, overrides: &[String]) -> Result<RunConfig> {
        let path = self.config();
        let Ok(text) = std::fs::read_to_string(&path) else {
            let error = anyhow::anyhow!(
                "{} is not a run directory (no config.toml)",
                self.0.display()
            );
            return Err(UsageError::from(error).into());
        };
        let recorded: toml::Table = toml::from_str(&text).unwrap_or_default();
        let mut all: Vec<String> = BEFORE_RECORDED
            .iter()
            .filter(|(section, key, _)| {
                !recorded
                    .get(*section)
                    .and_then(toml::Value::as_table)
                    .is_some_and(|t| t.contains_key(*key))
            })
            .map(|(section, key, value)| format!("{section}.{key}={value}"))
            .collect();
        all.extend_from_slice(overrides);
        RunConfig::load(&path, &all)
    }

    /// The trained model (weights of `model.bpk` into the architecture of the config).
    pub fn load_model(&self, config: &RunConfig, vocab_size: usize, device: &Device) -> Result<Lm> {
        let path = self.model();
        if !path.exists() {
            bail!(
                "{} has no trained model yet ({} is missing)",
                self.0.display(),
                path.display()
            );
        }
        let model = config.lm_config(vocab_size).init(device);
        model.try_load_file(&path).map_err(|e| {
            // A record of another architecture lists every mismatch; the first one tells.
            let reason = e.to_string();
            let first = reason.split("\", \"").next().unwrap_or(&reason);
            anyhow::anyhow!(
                "cannot load {} (truncated, or trained with another config?): {}",
                path.display(),
                first.chars().take(240).collect::<String>()
            )
        })
    }

    /// The newest checkpoint whose model, optimizer and scheduler files all read back: a run
    /// killed while burn-train wrote a checkpoint resumes from the one before, and says so.
    pub fn last_checkpoint(&self) -> Option<usize> {
        let mut epochs: Vec<usize> = std::fs::read_dir(self.checkpoints())
            .ok()?
            .filter_map(|e| {
                let name = e.ok()?.file_name().into_string().ok()?;
                name.strip_prefix("model-")?
                    .strip_suffix(".bpk")?
                    .parse()
                    .ok()
            })
            .collect();
        epochs.sort_unstable();
        let mut unreadable = Vec::new();
        let last = epochs.into_iter().rev().find(|&epoch| {
            let reads = self.checkpoint_reads(epoch);
            if !reads {
                unreadable.push(epoch);
            }
            reads
        });
        if !unreadable.is_empty() {
            let list: Vec<String> = unreadable.iter().map(|e| e.to_string()).collect();
            let instead = last.map_or("no other checkpoint does".into(), |e| {
                format!("resuming from checkpoint {e}, the newest that does")
            });
            eprintln!(
                "checkpoint {} in {} does not read back (cut short, or damaged): {instead}",
                list.join(", "),
                self.checkpoints().display()
            );
        }
        last
    }

    fn checkpoint_reads(&self, epoch: usize) -> bool {
        let file = |name: &str| self.checkpoints().join(format!("{name}-{epoch}.bpk"));
        ModuleRecord::load(file("model")).is_ok()
            && OptimizerRecord::load(file("optim")).is_ok()
            && LrSchedulerRecord::load(file("scheduler")).is_ok()
    }
}

/// The process a `run.lock` names: its pid, and its start time in clock ticks after boot
/// (the 22nd field of `/proc/<pid>/stat`; Linux only).
struct Owner {
    pid: u32,
    started: Option<u64>,
}

impl Owner {
    fn this_process() -> Self {
        let pid = std::process::id();
        Self {
            pid,
            started: start_time(pid),
        }
    }

    /// `pid` or `pid started` (a lock written by an older `hla` holds the pid alone).
    fn parse(text: &str) -> Option<Self> {
        let mut words = text.split_whitespace();
        let pid = words.next()?.parse().ok()?;
        let started = words.next().and_then(|w| w.parse().ok());
        Some(Self { pid, started })
    }

    /// Whether the owner still runs: its pid runs, and started when the lock says (without
    /// a recorded start, when that process is an `hla`).
    fn is_running(&self) -> bool {
        let Some(now) = start_time(self.pid) else {
            return false;
        };
        match self.started {
            Some(started) => started == now,
            None => {
                let name = |pid: String| std::fs::read_to_string(format!("/proc/{pid}/comm"));
                name(self.pid.to_string()).ok() == name("self".into()).ok()
            }
        }
    }
}

impl std::fmt::Display for Owner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.started {
            Some(started) => writeln!(f, "{} {started}", self.pid),
            None => writeln!(f, "{}", self.pid),
        }
    }
}

/// When process `pid` started (clock ticks after boot), if it runs (and this is Linux).
fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name, the second field, is in parentheses and may hold spaces.
    let rest = stat.get(stat.rfind(')')? + 1..)?;
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// Writes `bytes` to `path` through a temporary file, `fsync` and a rename, so a reader
/// (or a run killed mid-write) never sees half a file.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = path.with_extension("tmp");
    let write = || -> std::io::Result<()> {
        let mut file = std::fs::File::create(&tmp)?;
        std::io::Write::write_all(&mut file, bytes)?;
        file.sync_all()?;
        std::fs::rename(&tmp, path)
    };
    write().with_context(|| {
        // What was written of it (a full disk) only takes room.
        let _ = std::fs::remove_file(&tmp);
        format!("cannot write {}", path.display())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_an_older_hla_did_not_record_reads_as_what_it_did() {
        let dir = tempfile::tempdir().unwrap();
        let run = RunDir::new(dir.path());
        let old = "[data]\ncorpus = \"x\"\n\n[train]\ngrad_clip = 1.0\n";
        std::fs::write(run.config(), old).unwrap();
        let config = run.load_config(&[]).unwrap();
        assert_eq!(config.train.clip.name(), "parameter");
        // What the run records, and an override, win.
        let global = run.load_config(&["train.clip=\"global\"".into()]).unwrap();
        assert_eq!(global.train.clip.name(), "global");
        std::fs::write(run.config(), config.to_toml()).unwrap();
        assert_eq!(run.load_config(&[]).unwrap(), config);
    }
}
