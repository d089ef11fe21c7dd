//! `history.json`: the segments a run trained in, one per process that trained it. A resume
//! may change the validation cadence (`train.eval_interval`), so burn-train's epochs (one
//! validation interval each, numbered on across a resume) stop being a fixed number of
//! steps; each segment says where its epochs start and how long they are, and which
//! settings its resume changed.

use std::path::Path;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use super::identity::Change;
use super::run_dir::write_atomic;

/// Where a segment's epochs start and how many steps each is.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cadence {
    /// The last epoch before the segment (the checkpoint it resumed from; 0 for the first).
    pub after_epoch: usize,
    /// Steps done before the segment.
    pub first_step: usize,
    /// Steps per epoch in the segment.
    pub eval_interval: usize,
}

impl Cadence {
    /// The step at the end of `epoch` (counted from 1), an epoch of this segment.
    pub fn step_at(&self, epoch: usize) -> usize {
        self.first_step + epoch.saturating_sub(self.after_epoch) * self.eval_interval
    }
}

/// A setting that a resume changed, with its value before and after.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct Changed {
    pub key: String,
    pub old: String,
    pub new: String,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct Segment {
    #[serde(flatten)]
    pub cadence: Cadence,
    /// The settings its resume changed (none for the first segment).
    #[serde(default)]
    pub changed: Vec<Changed>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct History {
    pub segments: Vec<Segment>,
}

impl History {
    /// A new run's history: one segment from step 0.
    pub fn new(eval_interval: usize) -> Self {
        let cadence = Cadence {
            after_epoch: 0,
            first_step: 0,
            eval_interval,
        };
        Self {
            segments: vec![Segment {
                cadence,
                changed: Vec::new(),
            }],
        }
    }

    /// The history in `path`, or, for a run written before histories were kept (or none at
    /// all), one segment of `eval_interval` steps per epoch from step 0.
    pub fn load(path: &Path, eval_interval: usize) -> Result<Self> {
        match std::fs::read_to_string(path) {
            Ok(text) => serde_json::from_str(&text)
                .with_context(|| format!("cannot read {} (damaged?)", path.display())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Self::new(eval_interval)),
            Err(e) => Err(e).with_context(|| format!("cannot read {}", path.display())),
        }
    }

    pub fn save(&self, path: &Path) -> Result<()> {
        let json = serde_json::to_string_pretty(self).expect("the history serialises");
        write_atomic(path, json.as_bytes())
    }

    /// The history of a run resumed at `cadence` with `changes`: the segments from before its
    /// checkpoint, whose later epochs it trains again, then its own.
    pub fn resumed(mut self, cadence: Cadence, changes: &[Change]) -> Self {
        self.segments
            .retain(|s| s.cadence.after_epoch < cadence.after_epoch);
        self.segments.push(Segment {
            cadence,
            changed: changes
                .iter()
                .map(|c| Changed {
                    key: c.key.clone(),
                    old: c.old.clone(),
                    new: c.new.clone(),
                })
                .collect(),
        });
        self
    }

    /// The step at the end of `epoch` (counted from 1): by the segment that trained it.
    pub fn step_at(&self, epoch: usize) -> usize {
        let segment = self
            .segments
            .iter()
            .rev()
            .find(|s| s.cadence.after_epoch < epoch)
            .or(self.segments.first());
        segment.map_or(0, |s| s.cadence.step_at(epoch))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cadence(after_epoch: usize, first_step: usize, eval_interval: usize) -> Cadence {
        Cadence {
            after_epoch,
            first_step,
            eval_interval,
        }
    }

    #[test]
    fn epochs_map_to_steps_through_every_cadence_change() {
        // 50 steps an epoch to step 100, then 25 to step 150, then 100.
        let history = History::new(50)
            .resumed(cadence(2, 100, 25), &[])
            .resumed(cadence(4, 150, 100), &[]);
        let steps: Vec<usize> = (1..=6).map(|e| history.step_at(e)).collect();
        assert_eq!(steps, [50, 100, 125, 150, 250, 350]);
    }

    #[test]
    fn a_resume_from_an_older_checkpoint_drops_the_segments_it_redoes() {
        let history = History::new(50)
            .resumed(cadence(2, 100, 25), &[])
            .resumed(cadence(1, 50, 10), &[]);
        assert_eq!(history.segments.len(), 2);
        assert_eq!(history.step_at(1), 50);
        assert_eq!(history.step_at(2), 60);
    }

    #[test]
    fn a_missing_history_is_one_segment_of_the_recorded_cadence() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("history.json");
        let history = History::load(&path, 40).unwrap();
        assert_eq!(history.step_at(3), 120);
        let resumed = history.resumed(cadence(3, 120, 20), &[]);
        resumed.save(&path).unwrap();
        assert_eq!(History::load(&path, 40).unwrap(), resumed);
    }
}
