//! `hla`: train, evaluate and verify Higher-order Linear Attention models.

mod alloc;
mod cmd;
mod output;
mod run;

use std::io::Write;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use cmd::{bench, compare, eval, export, generate, info, prepare, train, verify};
use run::usage::UsageError;

#[global_allocator]
static ALLOCATOR: alloc::Counting = alloc::Counting;

#[derive(Parser, Debug)]
#[command(
    name = "hla",
    version,
    about = "Higher-order Linear Attention language models on Burn"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Train a model from a config file (burn-train), with checkpoints and resume.
    Train(train::Args),
    /// Validation loss, perplexity (and MQAR accuracy) of a trained run over the whole
    /// validation split.
    Eval(eval::Args),
    /// Prefill a prompt with the chunked form, then stream tokens from the recurrent state.
    Generate(generate::Args),
    /// Export a trained run: weights (safetensors or burnpack), config.json, tokenizer and
    /// a manifest of parameter names and shapes.
    Export(export::Args),
    /// Check that the reference, recurrent and chunked forms of every HLA operator agree
    /// on a device (outputs and final states), and print the errors.
    Verify(verify::Args),
    /// Tokenize a config's corpus once into a token file (re-used while the source is
    /// unchanged) and print the token counts per split.
    Prepare(prepare::Args),
    /// Print the resolved config, the parameter count and the recurrent state size.
    Info(info::Args),
    /// Train the runs of an experiment file one after another (finished runs are skipped,
    /// partial ones resumed), then write results.md, results.csv and charts beside it.
    Compare(compare::Args),
    /// Time and memory of the operators against sequence length, decode latency against
    /// position, achieved GFLOP/s and a chunk-size sweep.
    Bench(bench::Args),
}

/// A reader that stops early (`hla compare --dry-run | head`) ends `hla` quietly, as it
/// does other Unix tools: Rust ignores SIGPIPE, which turns the next print into a panic.
fn default_sigpipe() {
    #[cfg(unix)]
    // SAFETY: restores one signal's default action, before any other thread starts.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

fn main() -> ExitCode {
    alloc::keep_freed_buffers();
    default_sigpipe();
    output::exit_on_failed_prints();
    let cli = Cli::parse();
    let result = match &cli.command {
        Command::Train(args) => train::run(args),
        Command::Eval(args) => eval::run(args),
        Command::Generate(args) => generate::run(args),
        Command::Export(args) => export::run(args),
        Command::Verify(args) => verify::run(args),
        Command::Prepare(args) => prepare::run(args),
        Command::Info(args) => info::run(args),
        Command::Compare(args) => compare::run(args),
        Command::Bench(args) => bench::run(args),
    };
    let code = match result {
        Ok(()) => 0,
        Err(err) => {
            // Not `eprintln!`, which panics when stderr cannot be written.
            let _ = writeln!(std::io::stderr(), "error: {err:#}");
            // Usage and config mistakes exit with 2, as clap's own do; failures with 1.
            if err.is::<UsageError>() { 2 } else { 1 }
        }
    };
    output::exit(code)
}
