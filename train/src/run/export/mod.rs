//! `hla export`: the trained weights for use elsewhere, with a self-describing `config.json`
//! ([`describe`], format in `FORMAT.md`), the tokenizer and a manifest of parameter names
//! and shapes.

mod describe;

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
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
        return Err(crate::config::usage(format!(
            "{} already holds an export; choose another --out",
            args.out.display()
        )));
    }
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("cannot create {}", args.out.display()))?;

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
    let description = describe::describe(&config, vocab_size)?;
    std::fs::write(
        args.out.join("config.json"),
        serde_json::to_string_pretty(&description)?,
    )
    .context("cannot write config.json")?;
    let mut files = vec![weights.clone(), args.out.join("config.json")];
    if run.tokenizer().exists() {
        let tokenizer = args.out.join("tokenizer.json");
        std::fs::copy(run.tokenizer(), &tokenizer).context("cannot copy the tokenizer")?;
        files.push(tokenizer);
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
    files.push(args.out.join("manifest.json"));
    for file in &files {
        readable_by_all(file)?;
    }
    println!(
        "exported {} tensors to {}",
        parameters.len(),
        args.out.display()
    );
    Ok(())
}

/// Mode 0644: Burn's stores create their files readable by the owner only.
fn readable_by_all(path: &Path) -> Result<()> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o644))
            .with_context(|| format!("cannot make {} readable", path.display()))?;
    }
    #[cfg(not(unix))]
    let _ = path;
    Ok(())
}
