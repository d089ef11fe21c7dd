//! `hla info`: the resolved config, parameter count and recurrent state size.

use std::path::PathBuf;

use anyhow::Result;
use burn::module::Module;
use hla_data::config::Task;
use hla_model::lm::MixerKind;

use crate::run::config::RunConfig;
use crate::run::data;
use crate::run::devices;
use crate::run::run_dir::RunDir;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// A config file.
    #[arg(long, required_unless_present = "run", conflicts_with = "run")]
    config: Option<PathBuf>,
    /// A run directory (its resolved config).
    #[arg(long)]
    run: Option<PathBuf>,
    /// Override a config value, e.g. `--set model.mixer=linear` (repeatable).
    #[arg(long = "set", value_name = "SECTION.KEY=VALUE")]
    overrides: Vec<String>,
    /// The devices to describe the run on, e.g. `flex,flex` (as `hla train --devices`).
    #[arg(long, value_delimiter = ',', num_args = 1..)]
    devices: Vec<String>,
}

pub fn run(args: &Args) -> Result<()> {
    let config = match (&args.config, &args.run) {
        (Some(path), _) => RunConfig::load(path, &args.overrides)?,
        (None, Some(run)) => RunDir::new(run).load_config(&args.overrides)?,
        (None, None) => unreachable!("clap requires --config or --run"),
    };
    let config = config.with_devices(None, &args.devices)?;
    let vocab_size = match config.data.task()? {
        Task::Text { corpus } => data::prepare(&config, corpus, false)?.0.meta.vocab_size,
        Task::Mqar(mqar) => mqar.vocab_size,
    };
    let lm = config.lm_config(vocab_size);
    let model = lm.init(&devices::parse(devices::default_name())?);
    print!("{}", config.to_toml());
    println!();
    println!("# vocabulary        {vocab_size}");
    println!("# parameters        {}", model.num_params());
    println!("# devices           {}", config.train.describe_devices());
    let context = config.train.context;
    let sizes = model.state_sizes(context);
    let cache = |kind: MixerKind| {
        if kind == MixerKind::Softmax {
            format!(" (KV cache at {context} tokens)")
        } else {
            String::new()
        }
    };
    if lm.is_hybrid() {
        println!("# state per layer   floats per sequence");
        for (i, (size, kind)) in sizes.iter().zip(lm.mixers()).enumerate() {
            println!("#   layer {i:<2} {:<7} {size}{}", kind.name(), cache(kind));
        }
        println!("#   total            {}", sizes.iter().sum::<usize>());
    } else {
        println!(
            "# state per layer   {} floats per sequence{}",
            sizes[0],
            cache(lm.mixers()[0])
        );
    }
    Ok(())
}
