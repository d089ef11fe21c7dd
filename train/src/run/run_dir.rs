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

    /// Claims the run directory for this process until the guard drops: a second `hla
    /// train` into the same directory is refused. A lock left by a killed process (its pid
    /// no longer runs) is taken over.
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
                    std::io::Write::write_all(&mut file, std::process::id().to_string().as_bytes())
                        .with_context(|| format!("cannot write {}", lock.path.display()))?;
                    return Ok(lock);
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    let owner = std::fs::read_to_string(&path).unwrap_or_default();
                    let owner = owner.trim();
                    if Path::new("/proc").join(owner).exists() && !owner.is_empty() {
                        bail!(
                            "another hla process (pid {owner}) is training into {}",
                            self.0.display()
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

    /// The resolved config the run was trained with, with `overrides` applied.
    pub fn load_config(&self, overrides: &[String]) -> Result<RunConfig> {
        if !self.config().exists() {
            let error = anyhow::anyhow!(
                "{} is not a run directory (no config.toml)",
                self.0.display()
            );
            return Err(UsageError::from(error).into());
        }
        RunConfig::load(&self.config(), overrides)
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
    /// killed while burn-train wrote a checkpoint resumes from the one before.
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
        epochs
            .into_iter()
            .rev()
            .find(|&epoch| self.checkpoint_reads(epoch))
    }

    fn checkpoint_reads(&self, epoch: usize) -> bool {
        let file = |name: &str| self.checkpoints().join(format!("{name}-{epoch}.bpk"));
        ModuleRecord::load(file("model")).is_ok()
            && OptimizerRecord::load(file("optim")).is_ok()
            && LrSchedulerRecord::load(file("scheduler")).is_ok()
    }
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
