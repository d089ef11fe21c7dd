//! `hla`: train, evaluate and verify Higher-order Linear Attention models.

mod config;
mod device;
mod info;
mod prepare;
mod verify;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

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
    /// Check that the reference, recurrent and chunked forms of every HLA operator agree
    /// on a device (outputs and final states), and print the errors.
    Verify(verify::Args),
    /// Tokenize a config's corpus once into a token file (re-used while the source is
    /// unchanged) and print the token counts per split.
    Prepare(prepare::Args),
    /// Print the resolved config, the parameter count and the recurrent state size.
    Info(info::Args),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match &cli.command {
        Command::Verify(args) => verify::run(args),
        Command::Prepare(args) => prepare::run(args),
        Command::Info(args) => info::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::FAILURE
        }
    }
}
