//! Checkpoints written atomically: burn-train's file checkpointer writes in place, so a run
//! killed mid-write would leave an unreadable file; this one writes a temporary file, syncs
//! it and renames it. The model's checkpointer also records the run's training time so far
//! beside each checkpoint, so that a resumed run reports the time of all its steps.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result};
use burn::train::checkpoint::{Checkpoint, Checkpointer, CheckpointerError};

use super::failure::Failure;
use crate::run::run_dir::write_atomic;

/// A run's training time across its segments: the seconds recorded with the checkpoint it
/// resumed from, and this process's own since it started training.
#[derive(Clone, Copy, Debug)]
pub struct TrainingClock {
    /// `None` when a resumed checkpoint has no recorded time (written by an older `hla`).
    before: Option<f64>,
    started: Instant,
}

impl TrainingClock {
    /// Starts the clock of a run that trains from `epoch`'s checkpoint in `dir`, or from the
    /// start.
    pub fn start(dir: &Path, epoch: Option<usize>) -> Self {
        let before = match epoch {
            None => Some(0.0),
            Some(epoch) => std::fs::read_to_string(seconds_path(dir, epoch))
                .ok()
                .and_then(|s| s.trim().parse().ok()),
        };
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

fn seconds_path(dir: &Path, epoch: usize) -> PathBuf {
    dir.join(format!("seconds-{epoch}.txt"))
}

pub struct AtomicCheckpointer {
    dir: PathBuf,
    name: &'static str,
    /// Recorded beside each checkpoint, if given.
    clock: Option<TrainingClock>,
    /// Where a failed save is reported, if given.
    failure: Option<Failure>,
}

impl AtomicCheckpointer {
    pub fn new(dir: PathBuf, name: &'static str) -> Self {
        Self {
            dir,
            name,
            clock: None,
            failure: None,
        }
    }

    /// Also records the training time so far beside each checkpoint.
    pub fn with_clock(self, clock: TrainingClock) -> Self {
        Self {
            clock: Some(clock),
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
        // The time first: a checkpoint is complete once its record is, and then its
        // time is there too (a time without its checkpoint is never read).
        if let Some(seconds) = self.clock.and_then(|clock| clock.total()) {
            write_atomic(
                &seconds_path(&self.dir, epoch),
                seconds.to_string().as_bytes(),
            )?;
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
        if self.clock.is_some() {
            paths.push(seconds_path(&self.dir, epoch));
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
