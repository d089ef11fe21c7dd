//! `hla eval`: validation loss, perplexity and (MQAR) accuracy of a trained run over the
//! whole validation split, with the serial recurrence (default) or the chunked form; the
//! loss on recall tokens and the rest; in windows of the training context or another
//! (`--context`), and by position in the window (`--by-position`).

use std::path::PathBuf;

use anyhow::Result;

use crate::run::devices;
use crate::run::evaluate::Mode;
use crate::run::run_dir::RunDir;
use crate::run::run_eval::{Options, by_position_chart, by_position_series, evaluate_run};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The run directory.
    #[arg(long)]
    run: PathBuf,
    #[arg(long, value_enum, default_value_t = Mode::Recurrent)]
    mode: Mode,
    /// Tokens per window (default: the training context); longer windows measure the
    /// model past its training length (text only; learned positions end at
    /// model.max_seq_len).
    #[arg(long)]
    context: Option<usize>,
    /// Also the loss by position in the window, in buckets of powers of two, as a table and
    /// a chart (`eval-by-position-<context>.png` and `.svg` in the run directory).
    #[arg(long)]
    by_position: bool,
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
    let options = Options {
        mode: args.mode,
        context: args.context,
        by_position: args.by_position,
    };
    let (result, context) = evaluate_run(&run, options, &device)?;
    let charts = if args.by_position {
        let series = by_position_series(&format!("{:?}", args.mode).to_lowercase(), &result);
        let name = format!("eval-by-position-{context}");
        by_position_chart(run.path(), &name, context, &[series])?
    } else {
        Vec::new()
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&result)?);
    } else {
        result.print();
        for chart in charts {
            println!("chart: {}", chart.display());
        }
    }
    Ok(())
}
