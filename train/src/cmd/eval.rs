//! `hla eval`: validation loss, perplexity and (MQAR) accuracy of a trained run over the
//! whole validation split, with the serial recurrence (default) or the chunked form.

use std::path::PathBuf;

use anyhow::Result;

use crate::run::data::Data;
use crate::run::devices;
use crate::run::evaluate::{Mode, evaluate};
use crate::run::run_dir::RunDir;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The run directory.
    #[arg(long)]
    run: PathBuf,
    #[arg(long, value_enum, default_value_t = Mode::Recurrent)]
    mode: Mode,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
    /// Compute device: flex, ndarray or wgpu (if compiled in).
    #[arg(long, default_value = devices::default_name())]
    device: String,
}

pub fn run(args: &Args) -> Result<()> {
    let device = devices::parse(&args.device)?;
    let run = RunDir::new(&args.run);
    let config = run.load_config(&[])?;
    let data = Data::load(&config)?;
    let lm = run.load_model(&config, data.vocab_size(), &device)?;
    let label = format!("{:?} validation", args.mode);
    let result = evaluate(
        &lm,
        &data.full_pass(&config)?,
        data.is_mqar(),
        args.mode,
        &device,
        &label,
    );
    if args.json {
        println!("{}", serde_json::to_string_pretty(&result)?);
    } else {
        result.print();
    }
    Ok(())
}
