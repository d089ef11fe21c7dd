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
use hla_model::lm::Lm;

use crate::run::config::RunConfig;
use crate::run::data::Data;
use crate::run::devices;
use crate::run::finish::{self, Finished};
use crate::run::run_dir::{RunDir, write_atomic};
use crate::run::usage::usage;
use checkpoint::{AtomicCheckpointer, TrainingClock};
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
    claim(&run, job)?;
    let data = Data::load(config)?;
    let items_per_epoch = t.eval_interval * t.grad_accumulation * t.batch_size;
    let lm = init_lm(job, &devices[0], &data);
    let resume_epoch = resume_epoch(&run, job);
    let done_epochs = resume_epoch.unwrap_or(0);
    let first_step = done_epochs * t.eval_interval;
    let interrupter = Interrupter::new();
    let batches_per_step = parallel::batches_per_step(t, devices.len());
    let model = Trainee {
        lm,
        guard: NanGuard::new(interrupter.clone(), first_step, batches_per_step),
        gradient_scale: 1.0 / batches_per_step as f64,
    };
    let model = with_checkpoint_ids(model, &run, resume_epoch)?;
    let optimizer = optim::optimizer(t, &model);
    let scheduler = optim::scheduler(config)?;
    // Build the data first: a corpus too short for a window fails before anything is written.
    let train_loader = data.train_loader(
        config,
        items_per_epoch,
        (done_epochs * items_per_epoch) as u64,
        devices.len(),
    )?;
    let valid_loader = data.valid_loader(config, t.seed.wrapping_add(1))?;
    std::fs::create_dir_all(out)
        .with_context(|| format!("cannot create the run directory {}", out.display()))?;
    write_atomic(&run.config(), config.to_toml().as_bytes())?;
    data.save_tokenizer(&run.tokenizer())?;
    data.save_meta(&run.data())?;
    let training = SupervisedTraining::new(run.path(), train_loader, valid_loader);
    let clock = TrainingClock::start(&run.checkpoints(), resume_epoch);
    let failure = Failure::default();
    let training = configure(training, job, data.is_mqar(), resume_epoch);
    let mut training = writers::writers(
        training,
        &run,
        job.standalone,
        clock,
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
        None => (clock.own(), t.steps.saturating_sub(first_step)),
    };
    let finished = Finished {
        lm: result.model.lm,
        seconds,
        steps_timed,
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

/// The seeded model on the (main) device's autodiff device, every parameter drawn now.
fn init_lm(job: &Job, device: &Device, data: &Data) -> Lm {
    let (config, t) = (job.config, &job.config.train);
    let autodiff = device.clone().autodiff();
    autodiff.seed(t.seed);
    let lm = config.lm_config(data.vocab_size()).init(&autodiff);
    let on = if t.devices.len() > 1 {
        t.describe_devices()
    } else {
        format!("{device:?}")
    };
    println!(
        "training {} ({} parameters) for {} steps on {on}, into {}",
        config.model.mixer.name(),
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

/// The epoch of the checkpoint to resume from, if resuming and one exists.
fn resume_epoch(run: &RunDir, job: &Job) -> Option<usize> {
    if !job.resume {
        return None;
    }
    let epoch = run.last_checkpoint();
    if epoch.is_none() {
        println!(
            "no checkpoint in {} yet: starting from scratch",
            job.out.display()
        );
    }
    epoch
}

/// burn-train's metrics, checkpointing, early stopping and output for this job.
fn configure(
    training: SupervisedTraining<Trainee>,
    job: &Job,
    mqar: bool,
    resume_epoch: Option<usize>,
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
        .num_epochs(t.steps.div_ceil(t.eval_interval));
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
    if let Some(epoch) = resume_epoch {
        training = training.checkpoint(epoch);
    }
    if !(job.standalone && std::io::stdout().is_terminal()) {
        training = training.renderer(Box::new(QuietRenderer::new(t.eval_interval)));
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
