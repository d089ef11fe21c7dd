//! `hla export`: a trained run's weights for use elsewhere, with a self-describing
//! `config.json`, the tokenizer and a manifest (see [`crate::run::export`]).

use std::path::PathBuf;

use anyhow::Result;
use hla_data::tokenizer::Tokenizer;

use crate::run::data::Data;
use crate::run::devices;
use crate::run::export::{self, Format};
use crate::run::run_dir::RunDir;
use crate::run::usage::usage;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The run directory.
    #[arg(long)]
    run: PathBuf,
    #[arg(long, value_enum, default_value_t = Format::Safetensors)]
    format: Format,
    /// Where to write the export.
    #[arg(long)]
    out: PathBuf,
}

pub fn run(args: &Args) -> Result<()> {
    let run = RunDir::new(&args.run);
    export::check_target(
        &args.out,
        &run,
        &[run.config(), run.model(), run.tokenizer()],
    )?;
    let config = run.load_config(&[])?;
    let vocab_size = if run.tokenizer().exists() {
        Tokenizer::load(&run.tokenizer())?.vocab_size()
    } else {
        Data::load(&config)?.vocab_size()
    };
    let device = devices::parse(devices::default_name())?;
    let lm = run.load_model(&config, vocab_size, &device)?;
    if args.out.join("manifest.json").exists() {
        return Err(usage(format!(
            "{} already holds an export; choose another --out",
            args.out.display()
        )));
    }
    let tensors = export::write(&run, &config, &lm, vocab_size, &args.out, args.format)?;
    println!("exported {tensors} tensors to {}", args.out.display());
    Ok(())
}
