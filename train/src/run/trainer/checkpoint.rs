//! Checkpoints written atomically: burn-train's file checkpointer writes in place, so a run
//! killed mid-write would leave an unreadable file; this one writes a temporary file, syncs
//! it and renames it. The model's checkpointer also records beside each checkpoint the step
//! it was taken at and the run's training time so far (`state-<epoch>.json`), so that a
//! resumed run starts at that step whatever its cadence is now, and reports the time of all
//! its steps.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result};
use burn::train::checkpoint::{Checkpoint, Checkpointer, CheckpointerError};
use serde::{Deserialize, Serialize};

use super::failure::Failure;
use crate::run::history::Cadence;
use crate::run::run_dir::write_atomic;

/// What is recorded beside a checkpoint.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq)]
pub struct CheckpointState {
    /// The optimiser steps done when it was taken (`None`: written by an older `hla`, which
    /// recorded only the time).
    pub step: Option<usize>,
    /// The training time of the run so far (`None`: not known).
    pub seconds: Option<f64>,
}

impl CheckpointState {
    /// The state recorded beside checkpoint `epoch` in `dir`, if any.
    pub fn read(dir: &Path, epoch: usize) -> Option<Self> {
        if let Ok(text) = std::fs::read_to_string(state_path(dir, epoch)) {
            return serde_json::from_str(&text).ok();
        }
        // The time alone, as an older `hla` recorded it.
        let seconds = std::fs::read_to_string(old_seconds_path(dir, epoch)).ok()?;
        Some(Self {
            step: None,
            seconds: seconds.trim().parse().ok(),
        })
    }
}

/// A run's training time across its segments: the seconds recorded with the checkpoint it
/// resumed from, and this process's own since it started training.
#[derive(Clone, Copy, Debug)]
pub struct TrainingClock {
    /// `None` when a resumed checkpoint has no recorded time (written by an older `hla`).
    before: Option<f64>,
    started: Instant,
}

impl TrainingClock {
    /// Starts the clock of a run that trained `before` seconds already (`None`: not known).
    pub fn start(before: Option<f64>) -> Self {
        Self {
            before,
            started: Instant::now(),
        }
    }

    /// Seconds of every segment, if the earlier ones are known.
    pub fn total(&self) -> Option<f64> {
        self.before.map(|b| b + self.own())
    }

    /// Seconds of this process's segment.
    pub fn own(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }
}

fn state_path(dir: &Path, epoch: usize) -> PathBuf {
    dir.join(format!("state-{epoch}.json"))
}

fn old_seconds_path(dir: &Path, epoch: usize) -> PathBuf {
    dir.join(format!("seconds-{epoch}.txt"))
}

pub struct AtomicCheckpointer {
    dir: PathBuf,
    name: &'static str,
    /// The run's clock and the segment's cadence, whose time and step are recorded beside
    /// each checkpoint, if given.
    progress: Option<(TrainingClock, Cadence)>,
    /// Where a failed save is reported, if given.
    failure: Option<Failure>,
}

impl AtomicCheckpointer {
    pub fn new(dir: PathBuf, name: &'static str) -> Self {
        Self {
            dir,
            name,
            progress: None,
            failure: None,
        }
    }

    /// Also records beside each checkpoint its step (by `cadence`) and the training time so
    /// far.
    pub fn with_progress(self, clock: TrainingClock, cadence: Cadence) -> Self {
        Self {
            progress: Some((clock, cadence)),
            ..self
        }
    }

    /// Also reports a failed save (a full disk) to `failure`, in words the run's error can
    /// print; burn-train stops training on it either way.
    pub fn with_failure(self, failure: Failure) -> Self {
        Self {
            failure: Some(failure),
            ..self
        }
    }

    fn path(&self, epoch: usize) -> PathBuf {
        self.dir.join(format!("{}-{epoch}.bpk", self.name))
    }

    fn write<R: Checkpoint>(&self, epoch: usize, record: R) -> Result<()> {
        std::fs::create_dir_all(&self.dir)
            .with_context(|| format!("cannot create {}", self.dir.display()))?;
        let (tmp, path) = (self.path(epoch).with_extension("tmp"), self.path(epoch));
        // The state first: a checkpoint is complete once its record is, and then its state
        // is there too (a state without its checkpoint is never read).
        if let Some((clock, cadence)) = self.progress {
            let state = CheckpointState {
                step: Some(cadence.step_at(epoch)),
                seconds: clock.total(),
            };
            let json = serde_json::to_string(&state).expect("the state serialises");
            write_atomic(&state_path(&self.dir, epoch), json.as_bytes())?;
        }
        let written = record
            .save(tmp.clone())
            .map_err(anyhow::Error::from)
            .and_then(|()| {
                std::fs::File::open(&tmp)
                    .and_then(|file| file.sync_all())
                    .and_then(|()| std::fs::rename(&tmp, &path))
                    .map_err(anyhow::Error::from)
            });
        written.map_err(|e| {
            // Whatever was written of it only takes room.
            let _ = std::fs::remove_file(&tmp);
            anyhow::anyhow!("cannot write {}: {e}", path.display())
        })
    }
}

impl<R: Checkpoint> Checkpointer<R> for AtomicCheckpointer {
    fn save(&self, epoch: usize, record: R) -> Result<(), CheckpointerError> {
        self.write(epoch, record).map_err(|e| {
            let message = format!("{e:#}");
            if let Some(failure) = &self.failure {
                failure.record(message.clone());
            }
            CheckpointerError::Unknown(message)
        })
    }

    fn delete(&self, epoch: usize) -> Result<(), CheckpointerError> {
        let mut paths = vec![self.path(epoch)];
        if self.progress.is_some() {
            paths.push(state_path(&self.dir, epoch));
            paths.push(old_seconds_path(&self.dir, epoch));
        }
        for path in paths {
            match std::fs::remove_file(path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    return Err(CheckpointerError::IOError(e));
                }
                _ => {}
            }
        }
        Ok(())
    }

    fn restore(&self, epoch: usize) -> Result<R, CheckpointerError> {
        R::load(self.path(epoch))
    }
}
