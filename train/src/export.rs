//! `hla export`: the trained weights for use elsewhere, with the model config, the tokenizer
//! and a manifest of parameter names and shapes.

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use burn::config::Config;
use burn::store::{BurnpackStore, ModuleSnapshot, SafetensorsStore};
use hla_data::tokenizer::Tokenizer;

use crate::data::Data;
use crate::run_dir::RunDir;

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// `model.safetensors`, loadable with Python's `safetensors` package.
    Safetensors,
    /// `model.bpk`, Burn's own format.
    Burnpack,
}

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
    let config = run.load_config(&[])?;
    let vocab_size = if run.tokenizer().exists() {
        Tokenizer::load(&run.tokenizer())?.vocab_size()
    } else {
        Data::load(&config)?.vocab_size()
    };
    let device = crate::device::parse(crate::device::default_name())?;
    let lm = run.load_model(&config, vocab_size, &device)?;
    if args.out.join("manifest.json").exists() {
        bail!(
            "{} already holds an export; choose another --out",
            args.out.display()
        );
    }
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("cannot create {}", args.out.display()))?;

    let lm_config = config.model.lm_config(vocab_size);
    let weights = match args.format {
        Format::Safetensors => {
            let path = args.out.join("model.safetensors");
            let mut store = SafetensorsStore::from_file(&path)
                .metadata("format", "hla")
                .metadata("mixer", config.model.mixer.name());
            lm.save_into(&mut store)
                .with_context(|| format!("cannot write {}", path.display()))?;
            path
        }
        Format::Burnpack => {
            let path = args.out.join("model.bpk");
            let mut store = BurnpackStore::from_file(&path).metadata("format", "hla");
            lm.save_into(&mut store)
                .with_context(|| format!("cannot write {}", path.display()))?;
            path
        }
    };
    lm_config
        .save(args.out.join("config.json"))
        .context("cannot write config.json")?;
    if run.tokenizer().exists() {
        std::fs::copy(run.tokenizer(), args.out.join("tokenizer.json"))
            .context("cannot copy the tokenizer")?;
    }
    let parameters: Vec<serde_json::Value> = lm
        .collect(None, None, true)
        .iter()
        .map(|t| serde_json::json!({ "name": t.name, "shape": t.shape.to_vec(), "dtype": format!("{:?}", t.dtype) }))
        .collect();
    let manifest = serde_json::json!({
        "weights": weights.file_name().map(|n| n.to_string_lossy().into_owned()),
        "mixer": config.model.mixer.name(),
        "vocab_size": vocab_size,
        "parameters": parameters,
    });
    std::fs::write(
        args.out.join("manifest.json"),
        serde_json::to_string_pretty(&manifest)?,
    )?;
    println!(
        "exported {} tensors to {}",
        parameters.len(),
        args.out.display()
    );
    Ok(())
}
