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

use std::path::PathBuf;

use anyhow::{Result, bail};

use crate::run::config::RunConfig;
use crate::run::devices;
use crate::run::experiment::{Experiment, Metric, PlannedRun};
use crate::run::identity::{Change, Changes};
use crate::run::plots;
use crate::run::report::{self, Row};
use crate::run::run_dir::RunDir;
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
