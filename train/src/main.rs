//! `hla`: train, evaluate and verify Higher-order Linear Attention models.

mod device;
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
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match &cli.command {
        Command::Verify(args) => verify::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::FAILURE
        }
    }
}
