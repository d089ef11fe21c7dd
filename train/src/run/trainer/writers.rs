//! What burn-train writes for a run, none of it by panicking: checkpoints (atomically,
//! [`AtomicCheckpointer`]), the metric logs ([`RunLogger`]) and `experiment.log`.
//!
//! burn-train's own metric logger writes from a thread per metric and panics when a write
//! fails: a full disk then panicked in several threads and aborted the process. [`RunLogger`]
//! writes the same files in the same format from the event thread; on a failure it records
//! it ([`Failure`]) and stops training, so the run ends with one message and its last
//! complete checkpoint.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result};
use burn::train::logger::MetricLogger;
use burn::train::metric::store::{EpochSummary, MetricsUpdate, Split};
use burn::train::metric::{MetricDefinition, MetricId, NumericEntry};
use burn::train::{ApplicationLoggerInstaller, Interrupter, SupervisedTraining};
use tracing_core::{Level, LevelFilter};
use tracing_subscriber::filter::filter_fn;
use tracing_subscriber::prelude::*;
use tracing_subscriber::registry;

use super::checkpoint::{AtomicCheckpointer, TrainingClock};
use super::failure::Failure;
use super::trainee::Trainee;
use crate::run::history::Cadence;
use crate::run::run_dir::RunDir;

/// `training` with this run's writers, whose failures go to `failure`.
pub fn writers(
    training: SupervisedTraining<Trainee>,
    run: &RunDir,
    standalone: bool,
    progress: (TrainingClock, Cadence),
    failure: &Failure,
    interrupter: &Interrupter,
) -> Result<SupervisedTraining<Trainee>> {
    let checkpointer =
        |name| AtomicCheckpointer::new(run.checkpoints(), name).with_failure(failure.clone());
    let training = training
        .with_custom_checkpointers(
            checkpointer("model").with_progress(progress.0, progress.1),
            checkpointer("optim"),
            checkpointer("scheduler"),
        )
        .with_metric_logger(RunLogger::new(
            run.path(),
            failure.clone(),
            interrupter.clone(),
        ));
    if !standalone {
        // The application logger is process-wide: only a process's one run has it.
        return Ok(training.with_application_logger(None));
    }
    let log = ApplicationLog::open(run.path().join("experiment.log"), failure, interrupter)?;
    Ok(training.with_application_logger(Some(Box::new(log))))
}

/// burn-train's `experiment.log`: its `tracing` events from INFO up, as its
/// `FileApplicationLoggerInstaller` writes them, through a writer whose failure (a full disk)
/// stops the run with the file's path, where `tracing` would drop it. `hla`'s panic hook
/// stays (burn-train's would print a banner before `hla`'s one message).
#[derive(Clone)]
struct ApplicationLog {
    path: PathBuf,
    file: Arc<Mutex<File>>,
    failure: Failure,
    interrupter: Interrupter,
}

impl ApplicationLog {
    fn open(path: PathBuf, failure: &Failure, interrupter: &Interrupter) -> Result<Self> {
        let file = File::options()
            .create(true)
            .append(true)
            .open(&path)
            .with_context(|| format!("cannot create {}", path.display()))?;
        Ok(Self {
            path,
            file: Arc::new(Mutex::new(file)),
            failure: failure.clone(),
            interrupter: interrupter.clone(),
        })
    }
}

impl Write for ApplicationLog {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let mut file = self.file.lock().unwrap_or_else(|e| e.into_inner());
        file.write_all(buf).inspect_err(|e| {
            self.failure
                .record(format!("cannot write {}: {e}", self.path.display()));
            self.interrupter
                .stop(Some("the experiment log could not be written"));
        })?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.file.lock().unwrap_or_else(|e| e.into_inner()).flush()
    }
}

impl ApplicationLoggerInstaller for ApplicationLog {
    fn install(&self) -> Result<(), String> {
        let log = self.clone();
        let layer = tracing_subscriber::fmt::layer()
            .with_ansi(false)
            .with_writer(move || log.clone())
            .with_filter(LevelFilter::INFO)
            // As burn-train: wgpu's own INFO events would drown the rest.
            .with_filter(filter_fn(|m| {
                !(m.module_path().is_some_and(|p| p.starts_with("wgpu"))
                    && *m.level() >= Level::INFO)
            }));
        registry()
            .with(layer)
            .try_init()
            .map_err(|e| format!("cannot install the logger of {}: {e}", self.path.display()))
    }
}

/// Writes every metric entry of a run as burn-train's `FileMetricLogger` does:
/// `DIR/<split>/epoch-<n>/<Name>.log`, one serialized entry a line.
pub struct RunLogger {
    dir: PathBuf,
    names: HashMap<MetricId, String>,
    /// The files of the current epoch, open.
    open: HashMap<PathBuf, File>,
    /// Files this process has started: a later opening appends, the first one truncates
    /// what a killed run left.
    started: HashSet<PathBuf>,
    epoch: Option<usize>,
    failure: Failure,
    interrupter: Interrupter,
}

impl RunLogger {
    pub fn new(dir: &Path, failure: Failure, interrupter: Interrupter) -> Self {
        Self {
            dir: dir.into(),
            names: HashMap::new(),
            open: HashMap::new(),
            started: HashSet::new(),
            epoch: None,
            failure,
            interrupter,
        }
    }

    fn path(&self, name: &str, epoch: usize, split: &Split) -> PathBuf {
        self.dir
            .join(split.to_string())
            .join(format!("epoch-{epoch}"))
            .join(format!("{}.log", name.replace(' ', "_")))
    }

    fn append(&mut self, path: &Path, line: &str) -> std::io::Result<()> {
        let file = match self.open.entry(path.into()) {
            std::collections::hash_map::Entry::Occupied(file) => file.into_mut(),
            std::collections::hash_map::Entry::Vacant(entry) => {
                std::fs::create_dir_all(path.parent().unwrap_or(Path::new(".")))?;
                let first = self.started.insert(path.into());
                let file = File::options()
                    .create(true)
                    .write(true)
                    .truncate(first)
                    .append(!first)
                    .open(path)?;
                entry.insert(file)
            }
        };
        file.write_all(format!("{line}\n").as_bytes())
    }
}

impl MetricLogger for RunLogger {
    fn log(&mut self, update: MetricsUpdate, epoch: usize, split: &Split) {
        if self.epoch != Some(epoch) {
            self.open.clear();
            self.epoch = Some(epoch);
        }
        if self.failure.get().is_some() {
            return;
        }
        let numeric = update.entries_numeric.into_iter().map(|u| u.entry);
        for entry in update.entries.into_iter().chain(numeric) {
            let value = &entry.serialized_entry;
            let Some(name) = self.names.get(&entry.metric_id) else {
                continue;
            };
            if value.is_not_available() {
                continue;
            }
            let path = self.path(name, epoch, split);
            if let Err(e) = self.append(&path, &value.serialized) {
                self.failure
                    .record(format!("cannot write {}: {e}", path.display()));
                self.interrupter
                    .stop(Some("a metric log could not be written"));
                return;
            }
        }
    }

    fn read_numeric(
        &mut self,
        name: &str,
        epoch: usize,
        split: &Split,
    ) -> Result<Vec<NumericEntry>, String> {
        let text = std::fs::read_to_string(self.path(name, epoch, split)).unwrap_or_default();
        text.lines()
            .filter(|line| !line.is_empty())
            .map(NumericEntry::deserialize)
            .collect()
    }

    fn log_metric_definition(&mut self, definition: MetricDefinition) {
        self.names
            .insert(definition.metric_id, definition.name.to_string());
    }

    fn log_epoch_summary(&mut self, _summary: EpochSummary) {
        self.open.clear();
    }
}
