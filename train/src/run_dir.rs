//! The files of a run directory.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use burn::module::Module;
use burn::prelude::*;
use hla_model::lm::Lm;

use crate::config::RunConfig;

pub struct RunDir(PathBuf);

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

    pub fn checkpoints(&self) -> PathBuf {
        self.0.join("checkpoint")
    }

    pub fn metrics(&self) -> PathBuf {
        self.0.join("metrics.json")
    }

    /// The resolved config the run was trained with.
    pub fn load_config(&self) -> Result<RunConfig> {
        if !self.config().exists() {
            bail!(
                "{} is not a run directory (no config.toml)",
                self.0.display()
            );
        }
        RunConfig::load(&self.config(), &[])
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
        config
            .model
            .lm_config(vocab_size)
            .init(device)
            .try_load_file(&path)
            .with_context(|| {
                format!(
                    "cannot load {} (truncated, or another architecture?)",
                    path.display()
                )
            })
    }

    /// The highest checkpoint epoch written by burn-train, if any.
    pub fn last_checkpoint(&self) -> Option<usize> {
        std::fs::read_dir(self.checkpoints())
            .ok()?
            .filter_map(|e| {
                let name = e.ok()?.file_name().into_string().ok()?;
                name.strip_prefix("model-")?
                    .strip_suffix(".bpk")?
                    .parse()
                    .ok()
            })
            .max()
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
    write().with_context(|| format!("cannot write {}", path.display()))
}
