//! Training a run: burn-train's `SupervisedTraining` and `Learner` over a config's model
//! and data, with checkpoints, resume, and a final validation by the recurrence
//! ([`finish`](crate::run::finish)).

use std::io::IsTerminal;
use std::path::Path;

use anyhow::{Context, Result, bail};
use burn::module::{Module, ModuleVisitor, Param};
use burn::prelude::*;
use burn::store::ModuleRecord;
use burn::train::checkpoint::{
    Checkpointer, ComposedCheckpointingStrategy, KeepLastNCheckpoints, MetricCheckpointingStrategy,
};
use burn::train::metric::store::{Aggregate, Direction, Split};
use burn::train::metric::{IterationSpeedMetric, LearningRateMetric, LossMetric};
use burn::train::{
    Interrupter, Learner, LearningResult, MetricEarlyStoppingStrategy, StoppingCondition,
    SupervisedTraining,
};
use hla_model::backend::{Kernels, kernels, set_kernels};
use hla_model::lm::Lm;

use crate::run::config::{Form, RunConfig, TrainSection};
use crate::run::data::Data;
use crate::run::devices;
use crate::run::finish::{self, Finished};
use crate::run::history::{Cadence, History};
use crate::run::identity;
use crate::run::run_dir::{RunDir, write_atomic};
use crate::run::usage::usage;
use checkpoint::{AtomicCheckpointer, CheckpointState, TrainingClock};
use failure::Failure;
use metrics::{AccuracyMetric, PerplexityMetric};
use renderer::QuietRenderer;
use trainee::{NanGuard, Trainee};

mod checkpoint;
mod failure;
mod metrics;
pub mod optim;
mod parallel;
mod renderer;
pub mod trainee;
mod writers;

/// One training run, as `hla train` and `hla compare` start it, on the devices of its
/// config (`train.devices`).
pub struct Job<'a> {
    pub config: &'a RunConfig,
    pub out: &'a Path,
    /// Continue from the last checkpoint in `out`.
    pub resume: bool,
    /// Start over in an existing run directory.
    pub force: bool,
    /// The only run of this process: burn-train's dashboard (on a terminal) and its
    /// `experiment.log`, whose logger is process-wide and so cannot follow a second run.
    pub standalone: bool,
}

/// Trains `job.config` into `job.out`; `metrics.json`, written last, marks the run finished.
pub fn train(job: &Job) -> Result<()> {
    let (config, out) = (job.config, job.out);
    let t = &config.train;
    let devices = devices::parse_all(&t.devices)?;
    let run = RunDir::new(out);
    let _lock = run.lock()?;
    let _form = FormGuard::set(t.form);
    // A resume that would change what the run is, or skip or repeat steps, is refused
    // before anything in the folder is touched.
    let Start {
        resume,
        cadence,
        history,
    } = start(&run, job)?;
    claim(&run, job)?;
    let data = Data::load(config)?;
    let items_per_step = t.grad_accumulation * t.batch_size;
    let lm = init_lm(job, &devices[0], &data);
    let interrupter = Interrupter::new();
    let batches_per_step = parallel::batches_per_step(t, devices.len());
    let model = Trainee {
        lm,
        guard: NanGuard::new(interrupter.clone(), cadence.first_step, batches_per_step),
        gradient_scale: 1.0 / batches_per_step as f64,
        global_clip: t.global_clip(),
    };
    let model = with_checkpoint_ids(model, &run, resume.as_ref().map(|r| r.epoch))?;
    let optimizer = optim::optimizer(t, &model);
    let scheduler = optim::scheduler(config)?;
    // Build the data first: a corpus too short for a window fails before anything is written.
    let train_loader = data.train_loader(
        config,
        t.eval_interval * items_per_step,
        (cadence.first_step * items_per_step) as u64,
        devices.len(),
    )?;
    let valid_loader = data.valid_loader(config, t.seed.wrapping_add(1))?;
    std::fs::create_dir_all(out)
        .with_context(|| format!("cannot create the run directory {}", out.display()))?;
    write_atomic(&run.config(), config.to_toml().as_bytes())?;
    history.save(&run.history())?;
    data.save_tokenizer(&run.tokenizer())?;
    data.save_meta(&run.data())?;
    let training = SupervisedTraining::new(run.path(), train_loader, valid_loader);
    let clock = TrainingClock::start(match &resume {
        Some(resume) => resume.seconds,
        None => Some(0.0),
    });
    let failure = Failure::default();
    let training = configure(training, job, data.is_mqar(), cadence);
    let mut training = writers::writers(
        training,
        &run,
        job.standalone,
        (clock, cadence),
        &failure,
        &interrupter,
    )?
    .with_interrupter(interrupter);
    if let Some(strategy) = parallel::execution(&devices, t.strategy) {
        training = training.with_training_strategy(strategy.into());
    }
    let result = training.launch(Learner::new(model, optimizer, scheduler));
    stopped(&run, &failure, &result)?;
    // Resumed from a checkpoint without a recorded time: this segment's steps only.
    let (seconds, steps_timed) = match clock.total() {
        Some(total) => (total, t.steps),
        None => (clock.own(), t.steps.saturating_sub(cadence.first_step)),
    };
    let finished = Finished {
        lm: result.model.lm,
        seconds,
        steps_timed,
        history,
    };
    finish::finish(config, &run, &devices[0], &data, finished)
}

/// The error of a run that stopped before its last step: a writer's failure (a full disk)
/// first, as it is the cause of what burn-train then reports.
fn stopped(run: &RunDir, failure: &Failure, result: &LearningResult<Trainee>) -> Result<()> {
    let last = run.checkpoints();
    if let Some(message) = failure.get() {
        bail!(
            "training stopped: {message}; the last complete checkpoint stays in {} (continue \
             with --resume)",
            last.display()
        );
    }
    if let Some(error) = &result.error {
        bail!("training stopped: {error}");
    }
    if let Some(stop) = &result.interrupted {
        bail!(
            "training stopped: {}; the last good checkpoint stays in {} (continue with --resume, \
             perhaps with a lower --set train.lr)",
            stop.reason.as_deref().unwrap_or("interrupted"),
            last.display()
        );
    }
    Ok(())
}

/// Takes the run directory for this job: a directory that already holds a run needs
/// `--resume` or `--force` (which clears it); files a killed run left half-written go.
fn claim(run: &RunDir, job: &Job) -> Result<()> {
    run.remove_partial_files()?;
    if job.resume {
        return Ok(());
    }
    if run.config().exists() && !job.force {
        return Err(usage(format!(
            "{} already holds a run; pass --resume to continue it or --force to start over",
            job.out.display()
        )));
    }
    if job.force {
        run.clear()?;
    }
    Ok(())
}

/// `train.form`'s kernels while a run trains, the kernels before it afterwards (`hla
/// compare` trains several runs in one process).
struct FormGuard(Kernels);

impl FormGuard {
    fn set(form: Form) -> Self {
        let before = kernels();
        set_kernels(form.kernels());
        Self(before)
    }
}

impl Drop for FormGuard {
    fn drop(&mut self) {
        set_kernels(self.0);
    }
}

/// The seeded model on the (main) device's autodiff device, every parameter drawn now.
fn init_lm(job: &Job, device: &Device, data: &Data) -> Lm {
    let (config, t) = (job.config, &job.config.train);
    let autodiff = device.clone().autodiff();
    autodiff.seed(t.seed);
    let lm = config.lm_config(data.vocab_size()).init(&autodiff);
    let on = if t.devices.len() > 1 {
        t.describe_devices()
    } else {
        format!("{device:?}{}", t.form_note())
    };
    println!(
        "training {} ({} parameters) for {} steps on {on}, into {}",
        config.model.mixer_label(),
        lm.num_params(),
        t.steps,
        job.out.display()
    );
    // Parameters initialise lazily; draw them now, in order, from the seeded generator.
    lm.visit(&mut Materialize);
    lm
}

/// The model with the weights and parameter ids of checkpoint `epoch`, when resuming: the
/// optimizer's groups (no weight decay on vectors) go by parameter id, and burn-train
/// gives the model the checkpoint's ids when it loads the checkpoint, so the groups must
/// be built from those ids, not from the fresh model's random ones.
fn with_checkpoint_ids(model: Trainee, run: &RunDir, epoch: Option<usize>) -> Result<Trainee> {
    let Some(epoch) = epoch else {
        return Ok(model);
    };
    let checkpointer = AtomicCheckpointer::new(run.checkpoints(), "model");
    let record: ModuleRecord = checkpointer
        .restore(epoch)
        .with_context(|| format!("cannot read checkpoint {epoch} in {}", run.path().display()))?;
    Ok(model.load_record(record))
}

/// Where this process's training starts.
struct Start {
    /// The checkpoint it resumes from, if any.
    resume: Option<Resume>,
    cadence: Cadence,
    /// The run's history, this process's segment included.
    history: History,
}

/// Where `job` starts: from scratch, or, resuming, from the last checkpoint with settings
/// that keep the run's identity ([`identity::check_resume`]) and a whole number of
/// validation intervals left.
fn start(run: &RunDir, job: &Job) -> Result<Start> {
    let t = &job.config.train;
    let recorded = job.resume.then(|| run.load_config(&[])).transpose()?;
    let Some(recorded) = recorded else {
        return Ok(Start {
            resume: None,
            cadence: cadence(run, t, None)?,
            history: History::new(t.eval_interval),
        });
    };
    let changes = identity::check_resume(run, &recorded, job.config)?;
    let history = History::load(&run.history(), recorded.train.eval_interval)?;
    let resume = resume_point(run, job, &history);
    let cadence = cadence(run, t, resume.as_ref())?;
    let history = match &resume {
        Some(_) => history.resumed(cadence, &changes),
        None => History::new(t.eval_interval),
    };
    Ok(Start {
        resume,
        cadence,
        history,
    })
}

/// The checkpoint a run resumes from.
struct Resume {
    epoch: usize,
    /// The step it was taken at.
    step: usize,
    /// The run's training time until then, if known.
    seconds: Option<f64>,
}

/// The checkpoint to resume from, if one exists: its step as recorded with it (by
/// `history` for a checkpoint of an older `hla`, which recorded none).
fn resume_point(run: &RunDir, job: &Job, history: &History) -> Option<Resume> {
    let Some(epoch) = run.last_checkpoint() else {
        println!(
            "no checkpoint in {} yet: starting from scratch",
            job.out.display()
        );
        return None;
    };
    let state = CheckpointState::read(&run.checkpoints(), epoch);
    Some(Resume {
        epoch,
        step: state
            .and_then(|s| s.step)
            .unwrap_or_else(|| history.step_at(epoch)),
        seconds: state.and_then(|s| s.seconds),
    })
}

/// The cadence of the epochs this process trains: from the checkpoint's step, in epochs of
/// `train.eval_interval` steps up to `train.steps`, which must be a whole number of them
/// away.
fn cadence(run: &RunDir, t: &TrainSection, resume: Option<&Resume>) -> Result<Cadence> {
    let (after_epoch, first_step) = resume.map_or((0, 0), |r| (r.epoch, r.step));
    if first_step > t.steps {
        return Err(usage(format!(
            "{} is at step {first_step} already, past train.steps ({}): set train.steps to \
             {first_step} or more",
            run.path().display(),
            t.steps
        )));
    }
    let left = t.steps - first_step;
    if !left.is_multiple_of(t.eval_interval) {
        return Err(usage(format!(
            "{} resumes at step {first_step}: the {left} steps left to train.steps ({}) must be \
             a whole number of train.eval_interval ({}) steps",
            run.path().display(),
            t.steps,
            t.eval_interval
        )));
    }
    Ok(Cadence {
        after_epoch,
        first_step,
        eval_interval: t.eval_interval,
    })
}

/// burn-train's metrics, checkpointing, early stopping and output for this job.
fn configure(
    training: SupervisedTraining<Trainee>,
    job: &Job,
    mqar: bool,
    cadence: Cadence,
) -> SupervisedTraining<Trainee> {
    let t = &job.config.train;
    let lowest_valid_loss = || {
        MetricCheckpointingStrategy::new(
            &LossMetric::new(),
            Aggregate::Mean,
            Direction::Lowest,
            Split::Valid,
        )
    };
    let mut training = training
        .metrics((LossMetric::new(),))
        .metric_train_numeric(LearningRateMetric::new())
        .metric_train_numeric(IterationSpeedMetric::new())
        .with_checkpointing_strategy(
            ComposedCheckpointingStrategy::builder()
                .add(KeepLastNCheckpoints::new(t.keep_checkpoints))
                .add(lowest_valid_loss())
                .build(),
        )
        .grads_accumulation(t.grad_accumulation)
        .num_epochs(cadence.after_epoch + (t.steps - cadence.first_step) / t.eval_interval);
    // MQAR scores only the query positions: accuracy there; perplexity is for text.
    training = if mqar {
        training.metrics((AccuracyMetric::new(),))
    } else {
        training.metrics((PerplexityMetric::new(),))
    };
    if t.early_stopping > 0 {
        training = training.early_stopping(MetricEarlyStoppingStrategy::new(
            &LossMetric::new(),
            Aggregate::Mean,
            Direction::Lowest,
            Split::Valid,
            StoppingCondition::NoImprovementSince {
                n_epochs: t.early_stopping,
            },
        ));
    }
    if cadence.after_epoch > 0 {
        training = training.checkpoint(cadence.after_epoch);
    }
    if !(job.standalone && std::io::stdout().is_terminal()) {
        training = training.renderer(Box::new(QuietRenderer::new(cadence)));
    }
    training
}

/// Initialises every parameter (they are lazy) by reading it.
struct Materialize;

impl ModuleVisitor for Materialize {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        param.val();
    }
}
