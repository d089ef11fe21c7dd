//! `hla train`: burn-train's `SupervisedTraining` and `Learner` over a config's model and
//! data, with checkpoints, resume, and a final validation by the recurrence.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use burn::lr_scheduler::LrSchedulerConfig;
use burn::lr_scheduler::cosine::CosineAnnealingLrSchedulerConfig;
use burn::lr_scheduler::linear::LinearLrSchedulerConfig;
use burn::lr_scheduler::module_lr_scheduler::ModuleLrScheduler;
use burn::lr_scheduler::sequential::SequentialLrSchedulerConfig;
use burn::module::{Module, ModuleVisitor, Param, ParamGroup, ParamId};
use burn::optim::ModuleOptimizer;
use burn::prelude::*;
use burn::train::checkpoint::{
    ComposedCheckpointingStrategy, KeepLastNCheckpoints, MetricCheckpointingStrategy,
};
use burn::train::metric::store::{Aggregate, Direction, Split};
use burn::train::metric::{
    AccuracyMetric, IterationSpeedMetric, LearningRateMetric, LossMetric, PerplexityMetric,
};
use burn::train::{
    Interrupter, Learner, MetricEarlyStoppingStrategy, StoppingCondition, SupervisedTraining,
};
use hla_model::lm::MixerKind;
use hla_model::optim::AdamW;

use crate::checkpoint::AtomicCheckpointer;
use crate::config::{RunConfig, TrainSection};
use crate::data::Data;
use crate::eval::{self, Mode};
use crate::renderer::QuietRenderer;
use crate::run_dir::{RunDir, write_atomic};
use crate::trainee::{NanGuard, Trainee};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The run's config file (with --resume, the run's own config is used, with --set
    /// overrides applied).
    #[arg(long, required_unless_present = "resume")]
    config: Option<PathBuf>,
    /// Override a config value, e.g. `--set train.lr=3e-4` (repeatable).
    #[arg(long = "set", value_name = "SECTION.KEY=VALUE")]
    overrides: Vec<String>,
    /// Compute device: flex, ndarray or wgpu (if compiled in).
    #[arg(long, default_value = crate::device::default_name())]
    device: String,
    /// The run directory (default: runs/<config name>).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Continue the run in --out from its last checkpoint.
    #[arg(long)]
    resume: bool,
    /// Start over in an existing run directory.
    #[arg(long, conflicts_with = "resume")]
    force: bool,
}

pub fn run(args: &Args) -> Result<()> {
    let device = crate::device::parse(&args.device)?;
    let out = match (&args.out, &args.config) {
        (Some(out), _) => out.clone(),
        (None, Some(config)) => PathBuf::from("runs").join(config.file_stem().unwrap_or_default()),
        (None, None) => bail!("--resume needs --out (the run directory)"),
    };
    let config = if args.resume {
        // The run's own config, with any overrides (e.g. more steps).
        RunDir::new(&out).load_config(&args.overrides)?
    } else {
        let path = args
            .config
            .as_ref()
            .expect("clap requires --config without --resume");
        RunConfig::load(path, &args.overrides)?
    };
    train(&Job {
        config: &config,
        out: &out,
        device: &device,
        resume: args.resume,
        force: args.force,
        standalone: true,
    })
}

/// One training run, as `hla train` and `hla compare` start it.
pub struct Job<'a> {
    pub config: &'a RunConfig,
    pub out: &'a Path,
    pub device: &'a Device,
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
    let (config, out, device) = (job.config, job.out, job.device);
    let run = RunDir::new(out);
    let _lock = run.lock()?;
    run.remove_partial_files()?;
    if !job.resume {
        if run.config().exists() && !job.force {
            bail!(
                "{} already holds a run; pass --resume to continue it or --force to start over",
                out.display()
            );
        }
        if job.force {
            run.clear()?;
        }
    }
    let data = Data::load(config)?;

    let t = &config.train;
    let epochs = t.steps.div_ceil(t.eval_interval);
    let items_per_epoch = t.eval_interval * t.grad_accumulation * t.batch_size;
    let autodiff = device.clone().autodiff();
    autodiff.seed(t.seed);
    let lm = config.model.lm_config(data.vocab_size()).init(&autodiff);
    println!(
        "training {} ({} parameters) for {} steps on {:?}, into {}",
        config.model.mixer.name(),
        lm.num_params(),
        t.steps,
        device,
        out.display()
    );
    // Parameters initialise lazily; draw them now, in order, from the seeded generator.
    lm.visit(&mut Materialize);
    let resume_epoch = if job.resume {
        run.last_checkpoint()
    } else {
        None
    };
    if job.resume && resume_epoch.is_none() {
        println!(
            "no checkpoint in {} yet: starting from scratch",
            out.display()
        );
    }
    let done_epochs = resume_epoch.unwrap_or(0);
    let first_step = done_epochs * t.eval_interval;
    let interrupter = Interrupter::new();
    let model = Trainee {
        lm,
        guard: NanGuard::new(interrupter.clone(), first_step, t.grad_accumulation),
    };
    let optimizer = optimizer(&config.train, &model);
    let scheduler = scheduler(config)?;
    // Build the data first: a corpus too short for a window fails before anything is written.
    let train_loader = data.train_loader(
        config,
        items_per_epoch,
        (done_epochs * items_per_epoch) as u64,
    )?;
    let valid_loader = data.valid_loader(config, t.seed.wrapping_add(1))?;
    std::fs::create_dir_all(out)
        .with_context(|| format!("cannot create the run directory {}", out.display()))?;
    write_atomic(&run.config(), config.to_toml().as_bytes())?;
    data.save_tokenizer(&run.tokenizer())?;
    let mut training = SupervisedTraining::new(run.path(), train_loader, valid_loader)
        .metrics((LossMetric::new(),))
        .metric_train_numeric(LearningRateMetric::new())
        .metric_train_numeric(IterationSpeedMetric::new())
        .with_checkpointing_strategy(
            ComposedCheckpointingStrategy::builder()
                .add(KeepLastNCheckpoints::new(t.keep_checkpoints.max(1)))
                .add(MetricCheckpointingStrategy::new(
                    &LossMetric::new(),
                    Aggregate::Mean,
                    Direction::Lowest,
                    Split::Valid,
                ))
                .build(),
        )
        .with_custom_checkpointers(
            AtomicCheckpointer::new(run.checkpoints(), "model"),
            AtomicCheckpointer::new(run.checkpoints(), "optim"),
            AtomicCheckpointer::new(run.checkpoints(), "scheduler"),
        )
        .grads_accumulation(t.grad_accumulation)
        .num_epochs(epochs);
    // MQAR scores only the query positions: accuracy there; perplexity is for text.
    training = if data.is_mqar() {
        training.metrics((AccuracyMetric::new().with_pad_token(0),))
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
    training = training.with_interrupter(interrupter);
    if !job.standalone {
        training = training.with_application_logger(None);
    }
    if !(job.standalone && std::io::stdout().is_terminal()) {
        training = training.renderer(Box::new(QuietRenderer::new(t.eval_interval)));
    }
    let started = Instant::now();
    let result = training.launch(Learner::new(model, optimizer, scheduler));
    if let Some(error) = result.error {
        bail!("training stopped: {error}");
    }
    if let Some(stop) = result.interrupted {
        bail!(
            "training stopped: {}; the last good checkpoint stays in {} (continue with --resume, \
             perhaps with a lower --set train.lr)",
            stop.reason.unwrap_or_else(|| "interrupted".into()),
            run.checkpoints().display()
        );
    }
    let seconds = started.elapsed().as_secs_f64();
    let lm = result.model.lm;
    let weights = lm
        .clone()
        .into_record()
        .into_bytes()
        .context("cannot serialise the model")?;
    write_atomic(&run.model(), &weights)?;

    // The end-of-training validation uses the recurrence for HLA and linear attention.
    let mode = if config.model.mixer == MixerKind::Softmax {
        Mode::Chunked
    } else {
        Mode::Recurrent
    };
    let evaluation = eval::evaluate(&lm, &data.full_pass(config)?, data.is_mqar(), mode, device);
    evaluation.print();
    let estimate = random_batch_estimate(&lm, &data, config, device)?;
    let steps_run = t.steps.saturating_sub(first_step);
    let tokens =
        (steps_run * t.grad_accumulation * t.batch_size) as f64 * data.tokens_per_item(config);
    let context = config.sequence_length()?;
    let state_per_layer = lm.state_size(context);
    let summary = serde_json::json!({
        "mixer": config.model.mixer.name(),
        "parameters": lm.num_params(),
        "context": context,
        "state_floats_per_layer": state_per_layer,
        "state_floats_per_sequence": state_per_layer * config.model.n_layers,
        "steps": t.steps,
        "wall_seconds": seconds,
        "tokens_per_second": tokens / seconds,
        "validation": evaluation,
        "random_batch_estimate": estimate,
    });
    write_metrics_csv(&run, t.eval_interval)?;
    write_atomic(
        &run.metrics(),
        serde_json::to_string_pretty(&summary)?.as_bytes(),
    )?;
    println!(
        "{:.0} tokens/s; model and metrics in {}",
        tokens / seconds,
        out.display()
    );
    Ok(())
}

/// nanoGPT's validation estimate, the mean loss over `eval_batches` batches of random
/// windows (the windows of the validations during training), for text tasks.
fn random_batch_estimate(
    lm: &hla_model::lm::Lm,
    data: &Data,
    config: &RunConfig,
    device: &Device,
) -> Result<Option<serde_json::Value>> {
    let Some(items) = data.random_windows(config, config.train.seed.wrapping_add(1))? else {
        return Ok(None);
    };
    let estimate = eval::evaluate(lm, &items, false, Mode::Chunked, device);
    println!(
        "Random-batch estimate: loss {:.4}  ({} batches of random windows)",
        estimate.loss, config.train.eval_batches
    );
    Ok(Some(serde_json::json!({
        "loss": estimate.loss,
        "batches": config.train.eval_batches,
        "batch_size": config.train.batch_size,
    })))
}

/// AdamW with weight decay on matrices only (norm gains and other vectors are not decayed,
/// as nanoGPT), each parameter's gradient clipped to the `grad_clip` norm first: Burn's
/// AdamW and clipping, fused into one kernel per parameter on CPU devices
/// (`hla_model::optim`).
pub fn optimizer(t: &TrainSection, model: &impl Module) -> ModuleOptimizer {
    let adamw = |weight_decay: f64| AdamW {
        beta_1: t.beta1 as f32,
        beta_2: t.beta2 as f32,
        epsilon: AdamW::EPSILON,
        weight_decay: weight_decay as f32,
        clip_norm: (t.grad_clip > 0.0).then_some(t.grad_clip as f32),
    };
    let mut vectors = Vectors(Vec::new());
    model.visit(&mut vectors);
    ModuleOptimizer::from(adamw(t.weight_decay)).with_group(
        ParamGroup::from_ids(vectors.0),
        adamw(0.0),
        None,
    )
}

/// Initialises every parameter (they are lazy) by reading it.
struct Materialize;

impl ModuleVisitor for Materialize {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        param.val();
    }
}

/// Collects the ids of one-dimensional parameters.
struct Vectors(Vec<ParamId>);

impl ModuleVisitor for Vectors {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        if D == 1 {
            self.0.push(param.id);
        }
    }
}

/// Linear warm-up to `lr`, then cosine decay to `min_lr` (nanoGPT).
fn scheduler(config: &RunConfig) -> Result<ModuleLrScheduler> {
    let t = &config.train;
    let warmup = t.warmup_steps.min(t.steps.saturating_sub(1));
    let cosine = CosineAnnealingLrSchedulerConfig::new(t.lr, (t.steps - warmup).max(1))
        .with_min_lr(t.min_lr);
    let schedule = if warmup == 0 {
        cosine.init()
    } else {
        let warm = LinearLrSchedulerConfig::new(t.lr / warmup as f64, t.lr, warmup);
        SequentialLrSchedulerConfig::new(
            vec![
                LrSchedulerConfig::Linear(warm),
                LrSchedulerConfig::Cosine(cosine),
            ],
            vec![warmup],
        )
        .init()
    };
    schedule.map_err(|e| anyhow::anyhow!("the learning-rate schedule: {e}"))
}

/// `metrics.csv` (step, split, metric, value) from burn-train's per-epoch logs, whose last
/// line holds the epoch's aggregate: one row per metric and validation interval.
fn write_metrics_csv(run: &RunDir, eval_interval: usize) -> Result<()> {
    let mut rows = vec!["step,split,metric,value".to_string()];
    for split in ["train", "valid"] {
        let Ok(epochs) = std::fs::read_dir(run.path().join(split)) else {
            continue;
        };
        let mut epochs: Vec<(usize, PathBuf)> = epochs
            .filter_map(|e| {
                let path = e.ok()?.path();
                let n = path
                    .file_name()?
                    .to_str()?
                    .strip_prefix("epoch-")?
                    .parse()
                    .ok()?;
                Some((n, path))
            })
            .collect();
        epochs.sort();
        for (epoch, dir) in epochs {
            let mut logs: Vec<PathBuf> = std::fs::read_dir(&dir)?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .collect();
            logs.sort();
            for log in logs {
                let metric = log
                    .file_stem()
                    .and_then(|s| s.to_str())
                    .unwrap_or_default()
                    .to_lowercase();
                let text = std::fs::read_to_string(&log)?;
                if let Some(value) = text.lines().rev().find_map(|l| l.strip_suffix(",final")) {
                    rows.push(format!(
                        "{},{split},{metric},{value}",
                        epoch * eval_interval
                    ));
                }
            }
        }
    }
    let path = run.path().join("metrics.csv");
    write_atomic(&path, (rows.join("\n") + "\n").as_bytes())
}
