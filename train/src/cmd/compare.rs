//! `hla compare`: trains the runs of an experiment file one after another (see
//! `experiment` for the format) into `runs/<name>/` beside it, then writes results.md,
//! results.csv and charts there.
//!
//! The runs train in this process, through the same entry point as `hla train`: configs
//! are resolved and checked once, before anything trains, and a config mistake exits with
//! status 2 like `hla train`'s. A finished run (its `metrics.json` exists) is skipped, a
//! partial one resumed from its last checkpoint, one given more steps extended; one whose
//! identity changed since ([`identity`](crate::run::identity)) is an error unless `--force`
//! starts it over.

use std::collections::BTreeSet;
use std::path::PathBuf;

use anyhow::{Result, bail};

use crate::run::config::RunConfig;
use crate::run::devices;
use crate::run::evaluate::Mode;
use crate::run::experiment::{Experiment, Metric, PlannedRun};
use crate::run::identity::{Change, Changes};
use crate::run::plots;
use crate::run::report::{self, Row};
use crate::run::run_dir::{RunDir, write_atomic};
use crate::run::run_eval::{Options, by_position_chart, by_position_series, kept_by_position};
use crate::run::trainer::{Job, train};
use crate::run::usage::UsageError;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The experiment file, e.g. experiments/NAME/experiment.toml; runs and results go
    /// into its folder.
    #[arg(long)]
    experiment: PathBuf,
    /// Train only this run (repeatable); the results cover every finished run.
    #[arg(long, value_name = "RUN")]
    only: Vec<String>,
    /// List the runs and what would be done to each; train nothing.
    #[arg(long)]
    dry_run: bool,
    /// Write the results of the runs finished so far; train nothing.
    #[arg(long, conflicts_with = "dry_run")]
    no_train: bool,
    /// Start over the runs whose config changed since they were trained.
    #[arg(long)]
    force: bool,
    /// Compute device of every run: flex (default), ndarray, wgpu[:N] or cuda[:N] (if
    /// compiled in); sets train.devices.
    #[arg(long, conflicts_with = "devices")]
    device: Option<String>,
    /// Train every run data-parallel on these devices, e.g. `flex,flex`; sets train.devices.
    #[arg(long, value_delimiter = ',', num_args = 1..)]
    devices: Vec<String>,
    /// Then evaluate every finished run by position (as `hla eval --by-position`) and draw
    /// all of them on one chart, `loss-by-position-<context>.png` and `.svg`, with their
    /// buckets in `by-position-<context>.json`, in the experiment's folder. Each run's
    /// evaluation is kept in its folder (`by-position-<context>-<mode>.json`) and read
    /// back where its weights are not (they are not committed).
    #[arg(long)]
    by_position: bool,
    /// With --by-position: tokens per window (default: each run's training context).
    #[arg(long, requires = "by_position")]
    context: Option<usize>,
    /// With --by-position: the form that evaluates.
    #[arg(long, value_enum, default_value_t = Mode::Recurrent, requires = "by_position")]
    mode: Mode,
}

/// What a run needs.
#[derive(Debug, PartialEq)]
enum Action {
    Train,
    Resume,
    Skip,
    /// Its config changed: the differences, `key: old → new`.
    Changed(Vec<String>),
}

struct Plan {
    run: PlannedRun,
    config: RunConfig,
    action: Action,
}

pub fn run(args: &Args) -> Result<()> {
    let experiment = Experiment::load(&args.experiment)?;
    let plans = plan(&experiment, &args.only, args)?;
    let changed: Vec<String> = plans
        .iter()
        .filter_map(|p| match &p.action {
            Action::Changed(diff) => Some(format!("{}: {}", p.run.name, diff.join(", "))),
            _ => None,
        })
        .collect();
    if args.dry_run {
        print_plan(&experiment, &plans);
        return Ok(());
    }
    if !changed.is_empty() && !args.force && !args.no_train {
        let error = anyhow::anyhow!(
            "these runs were trained with another config; delete them or pass --force to \
             start them over:\n  {}",
            changed.join("\n  ")
        );
        return Err(UsageError::from(error).into());
    }
    let mut failed = Vec::new();
    if !args.no_train {
        for (i, p) in plans.iter().enumerate() {
            let out = experiment.run_dir(&p.run.name);
            let position = format!("[{}/{}] {}", i + 1, plans.len(), p.run.name);
            if p.action == Action::Skip {
                println!("{position}: finished already, skipped");
                continue;
            }
            println!("{position}: {}", describe(&p.action));
            let job = Job {
                config: &p.config,
                out: &out,
                resume: p.action == Action::Resume,
                force: matches!(p.action, Action::Changed(_)),
                standalone: false,
            };
            if let Err(error) = train(&job) {
                eprintln!("{position} failed: {error:#}");
                failed.push(p.run.name.clone());
            }
        }
    }
    write_results(&experiment)?;
    if args.by_position {
        by_position(&experiment, args)?;
    }
    if !failed.is_empty() {
        bail!(
            "{} of {} runs failed: {}",
            failed.len(),
            plans.len(),
            failed.join(", ")
        );
    }
    Ok(())
}

/// Resolves and checks every selected run's config and its devices, and decides what each
/// needs.
fn plan(experiment: &Experiment, only: &[String], args: &Args) -> Result<Vec<Plan>> {
    for name in only {
        if !experiment.runs.iter().any(|r| r.name == *name) {
            let error =
                anyhow::anyhow!("--only {name}: the experiment has no such run (see --dry-run)");
            return Err(UsageError::from(error).into());
        }
    }
    experiment
        .runs
        .iter()
        .filter(|r| only.is_empty() || only.contains(&r.name))
        .map(|run| {
            let config = RunConfig::load(&run.config, &run.set)
                .and_then(|c| c.with_devices(args.device.as_deref(), &args.devices))
                .map_err(|e| {
                    let error = e.context(format!("run {:?}", run.name));
                    anyhow::Error::from(UsageError::from(error))
                })?;
            let action = action(&RunDir::new(experiment.run_dir(&run.name)), &config)?;
            Ok(Plan {
                run: run.clone(),
                config,
                action,
            })
        })
        .collect::<Result<Vec<Plan>>>()
        .and_then(check_devices)
}

/// Starts each distinct device list of the plans once, so that a device this machine
/// lacks fails before anything trains.
fn check_devices(plans: Vec<Plan>) -> Result<Vec<Plan>> {
    let lists: std::collections::BTreeSet<&Vec<String>> =
        plans.iter().map(|p| &p.config.train.devices).collect();
    for names in lists {
        devices::parse_all(names)?;
    }
    Ok(plans)
}

fn action(run: &RunDir, config: &RunConfig) -> Result<Action> {
    if !run.config().exists() {
        return Ok(Action::Train);
    }
    let trained = run.load_config(&[])?;
    let changes = Changes::between(&trained, config);
    Ok(if !changes.identity.is_empty() {
        Action::Changed(changes.all().map(Change::to_string).collect())
    } else if run.metrics().exists() && config.train.steps <= trained.train.steps {
        Action::Skip
    } else {
        // Unfinished, or extended: the schedule may change on resume (recorded in the run).
        Action::Resume
    })
}

fn describe(action: &Action) -> &'static str {
    match action {
        Action::Train => "training",
        Action::Resume => "resuming",
        Action::Skip => "finished already",
        Action::Changed(_) => "config changed: starting over",
    }
}

fn print_plan(experiment: &Experiment, plans: &[Plan]) {
    println!("{} runs of {}:", plans.len(), experiment.title);
    for p in plans {
        let detail = match &p.action {
            Action::Changed(diff) => format!(" ({})", diff.join(", ")),
            _ => String::new(),
        };
        println!(
            "  {:<32} {}{detail}\n    {} {}",
            p.run.name,
            describe(&p.action),
            p.run.config.display(),
            p.run
                .set
                .iter()
                .map(|s| format!("--set {s}"))
                .collect::<Vec<_>>()
                .join(" ")
        );
    }
}

/// Every finished run's loss by position, on one chart and in one JSON file.
fn by_position(experiment: &Experiment, args: &Args) -> Result<()> {
    let device = devices::parse(args.device.as_deref().unwrap_or(devices::default_name()))?;
    let options = Options {
        mode: args.mode,
        context: args.context,
        by_position: true,
    };
    let (mut series, mut buckets, mut contexts) = (Vec::new(), Vec::new(), BTreeSet::new());
    let mut elsewhere = Vec::new();
    for planned in &experiment.runs {
        let run = RunDir::new(experiment.run_dir(&planned.name));
        if !run.metrics().exists() {
            continue;
        }
        let Some((evaluation, context)) = kept_by_position(&run, options, &device)? else {
            elsewhere.push(planned.name.as_str());
            continue;
        };
        series.push(by_position_series(&planned.name, &evaluation));
        buckets.push(serde_json::json!({
            "run": planned.name,
            "context": context,
            "loss": evaluation.loss,
            "by_position": evaluation.by_position,
        }));
        contexts.insert(context);
    }
    if !elsewhere.is_empty() {
        eprintln!(
            "not by position (no weights here, nor a stored evaluation at this context: \
             trained on another machine?): {}",
            elsewhere.join(", ")
        );
    }
    let label = match (args.context, contexts.len()) {
        (Some(context), _) => context.to_string(),
        (None, 1) => contexts.first().expect("one").to_string(),
        (None, _) => "training".to_string(),
    };
    let context = contexts.last().copied().unwrap_or_default();
    let json = experiment.dir.join(format!("by-position-{label}.json"));
    let text =
        serde_json::to_string_pretty(&serde_json::json!({ "mode": args.mode, "runs": buckets }))?;
    write_atomic(&json, text.as_bytes())?;
    let name = format!("loss-by-position-{label}");
    let charts = by_position_chart(&experiment.dir, &name, context, &series)?;
    println!(
        "loss by position of {} runs: {} and {}",
        series.len(),
        json.display(),
        charts
            .iter()
            .map(|c| c.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    );
    Ok(())
}

/// results.md, results.csv and the charts, from the runs finished so far.
fn write_results(experiment: &Experiment) -> Result<()> {
    let rows = report::rows(experiment)?;
    let metric = experiment
        .results
        .metric
        .unwrap_or_else(|| Metric::default_for(&rows));
    report::write(experiment, &rows, metric)?;
    // With `mean_over`, the charts show each group's means (one line, one point).
    let charted: Vec<Row> = if experiment.results.mean_over.is_empty() {
        rows.clone()
    } else {
        report::means(&rows).into_iter().map(|m| m.row).collect()
    };
    let best: Vec<Row> = report::best_of_groups(&charted, metric)
        .into_iter()
        .map(|(row, _)| row)
        .collect();
    let charts = plots::draw_all(&experiment.dir, &charted, &best, metric)?;
    println!(
        "{} of {} runs finished; results.md, results.csv and {} charts in {}",
        rows.len(),
        experiment.runs.len(),
        charts.len(),
        experiment.dir.display()
    );
    Ok(())
}
