//! `hla info`: the resolved config, parameter count and recurrent state size.

use std::path::PathBuf;

use anyhow::Result;
use burn::module::Module;
use hla_data::config::Task;
use hla_data::corpus;
use hla_model::lm::MixerKind;

use crate::config::RunConfig;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The run's config file.
    #[arg(long)]
    config: PathBuf,
    /// Override a config value, e.g. `--set model.mixer=linear` (repeatable).
    #[arg(long = "set", value_name = "SECTION.KEY=VALUE")]
    overrides: Vec<String>,
}

pub fn run(args: &Args) -> Result<()> {
    let config = RunConfig::load(&args.config, &args.overrides)?;
    let vocab_size = match config.data.task()? {
        Task::Text { corpus } => {
            config
                .data
                .prepare_text(corpus, &corpus::data_dir())?
                .0
                .meta
                .vocab_size
        }
        Task::Mqar(mqar) => mqar.vocab_size,
    };
    let lm = config.model.lm_config(vocab_size);
    let model = lm.init(&crate::device::parse(crate::device::default_name())?);
    print!("{}", config.to_toml());
    println!();
    println!("# vocabulary        {vocab_size}");
    println!("# parameters        {}", model.num_params());
    let context = config.train.context;
    println!(
        "# state per layer   {} floats per sequence{}",
        model.state_size(context),
        if lm.mixer == MixerKind::Softmax {
            format!(" (KV cache at {context} tokens)")
        } else {
            String::new()
        }
    );
    Ok(())
}
