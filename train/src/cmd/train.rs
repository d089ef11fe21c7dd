//! `hla train`: trains a config (or resumes a run) into a run directory.

use std::path::PathBuf;

use anyhow::Result;

use crate::run::config::RunConfig;
use crate::run::run_dir::RunDir;
use crate::run::trainer::{Job, train};
use crate::run::usage::usage;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The run's config file (with --resume, the run's own config is used, with --set
    /// overrides applied).
    #[arg(long, required_unless_present = "resume")]
    config: Option<PathBuf>,
    /// Override a config value, e.g. `--set train.lr=3e-4` (repeatable).
    #[arg(long = "set", value_name = "SECTION.KEY=VALUE")]
    overrides: Vec<String>,
    /// Compute device: flex (default), ndarray, wgpu[:N] or cuda[:N] (if compiled in);
    /// sets train.devices to this one device.
    #[arg(long, conflicts_with = "devices")]
    device: Option<String>,
    /// Train data-parallel on several devices, e.g. `cuda:0,cuda:1` or `flex,flex`;
    /// sets train.devices (each batch is split evenly between them).
    #[arg(long, value_delimiter = ',', num_args = 1..)]
    devices: Vec<String>,
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
    let out = match (&args.out, &args.config) {
        (Some(out), _) => out.clone(),
        (None, Some(config)) => PathBuf::from("runs").join(config.file_stem().unwrap_or_default()),
        (None, None) => return Err(usage("--resume needs --out (the run directory)")),
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
    let config = config.with_devices(args.device.as_deref(), &args.devices)?;
    train(&Job {
        config: &config,
        out: &out,
        resume: args.resume,
        force: args.force,
        standalone: true,
    })
}
