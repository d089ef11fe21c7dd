//! `hla prepare`: tokenize a config's corpus once into a memory-mapped token file.

use std::path::PathBuf;

use anyhow::Result;
use hla_data::config::Task;
use hla_data::prepared::Split;

use crate::run::config::RunConfig;
use crate::run::data;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The run's config file (only `[data]` matters here).
    #[arg(long)]
    config: PathBuf,
    /// Override a config value, e.g. `--set data.tokenizer=byte` (repeatable).
    #[arg(long = "set", value_name = "SECTION.KEY=VALUE")]
    overrides: Vec<String>,
    /// Tokenize again even where the cache holds a preparation of the same files (compared
    /// by path, size and modification time) and settings.
    #[arg(long)]
    force: bool,
}

/// Held-out documents listed by name; `meta.json` has them all.
const SHOWN: usize = 20;

pub fn run(args: &Args) -> Result<()> {
    let config = RunConfig::load(&args.config, &args.overrides)?;
    match config.data.task()? {
        Task::Text { corpus } => {
            let (prepared, reused) = data::prepare(&config, corpus, args.force)?;
            let m = &prepared.meta;
            println!(
                "{} {} ({} tokenizer, vocabulary {})",
                if reused { "re-using" } else { "prepared" },
                prepared.dir.display(),
                m.tokenizer,
                m.vocab_size
            );
            // A re-used preparation's hash is the one computed then: the files were compared
            // by path, size and modification time only, and say so.
            let when = if reused {
                ", computed when prepared; unchanged since by path, size and modification time"
            } else {
                ""
            };
            println!("source   {} (sha256 {}{when})", m.source, m.source_sha256);
            println!(
                "         {} documents in {} files{}",
                m.documents,
                m.files,
                m.end_of_text.map_or(String::new(), |id| format!(
                    ", end-of-text token {id} between them"
                ))
            );
            if m.split == Split::Documents {
                println!(
                    "split    documents (seed {}): {} of {} held out for validation",
                    m.split_seed,
                    m.valid_documents.len(),
                    m.documents
                );
                for held in m.valid_documents.iter().take(SHOWN) {
                    println!("           {}", held.source);
                }
                if m.valid_documents.len() > SHOWN {
                    println!(
                        "           … and {} more (meta.json lists them all)",
                        m.valid_documents.len() - SHOWN
                    );
                }
            }
            for (split, tokens, bytes) in [
                ("train", m.train_tokens, m.train_bytes),
                ("valid", m.valid_tokens, m.valid_bytes),
            ] {
                println!(
                    "{split}    {tokens:>12} tokens  {:>6.3} bytes per token",
                    bytes as f64 / tokens.max(1) as f64
                );
            }
        }
        Task::Mqar(mqar) => {
            println!("MQAR is generated at training time (nothing to prepare):");
            for s in &mqar.settings {
                println!(
                    "T {:>5}  N {:>4}  train {:>7}  test {:>6}",
                    s.seq_len, s.num_kv_pairs, s.train_examples, s.test_examples
                );
            }
        }
    }
    Ok(())
}
