//! The export of a trained run (`hla export`): the weights for use elsewhere, with a
//! self-describing `config.json` ([`describe`], format in `docs/export.md`), the tokenizer and a
//! manifest of parameter names and shapes.

mod describe;

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use burn::store::{BurnpackStore, ModuleSnapshot, SafetensorsStore};
use hla_model::lm::Lm;

use super::config::RunConfig;
use super::run_dir::RunDir;

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// `model.safetensors`, loadable with Python's `safetensors` package.
    Safetensors,
    /// `model.bpk`, Burn's own format.
    Burnpack,
}

/// Writes the export of `run` (trained with `config`, its model `lm` of `vocab_size`
/// tokens) into `out`, the weights in `format`; returns the number of tensors.
pub fn write(
    run: &RunDir,
    config: &RunConfig,
    lm: &Lm,
    vocab_size: usize,
    out: &Path,
    format: Format,
) -> Result<usize> {
    std::fs::create_dir_all(out).with_context(|| format!("cannot create {}", out.display()))?;
    let weights = write_weights(config, lm, out, format)?;
    let description = describe::describe(config, vocab_size)?;
    std::fs::write(
        out.join("config.json"),
        serde_json::to_string_pretty(&description)?,
    )
    .context("cannot write config.json")?;
    let mut files = vec![weights.clone(), out.join("config.json")];
    if run.tokenizer().exists() {
        let tokenizer = out.join("tokenizer.json");
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
        "mixer": config.model.mixer_label(),
        "layers": config.model.mixers().iter().map(|kind| kind.name()).collect::<Vec<_>>(),
        "vocab_size": vocab_size,
        "parameters": parameters,
    });
    std::fs::write(
        out.join("manifest.json"),
        serde_json::to_string_pretty(&manifest)?,
    )?;
    files.push(out.join("manifest.json"));
    for file in &files {
        readable_by_all(file)?;
    }
    Ok(parameters.len())
}

/// Writes the weights into `out` in `format`; returns their file.
fn write_weights(config: &RunConfig, lm: &Lm, out: &Path, format: Format) -> Result<PathBuf> {
    match format {
        Format::Safetensors => {
            let path = out.join("model.safetensors");
            let mut store = SafetensorsStore::from_file(&path)
                .metadata("format", "hla")
                .metadata("mixer", config.model.mixer_label());
            lm.save_into(&mut store)
                .with_context(|| format!("cannot write {}", path.display()))?;
            Ok(path)
        }
        Format::Burnpack => {
            let path = out.join("model.bpk");
            let mut store = BurnpackStore::from_file(&path).metadata("format", "hla");
            lm.save_into(&mut store)
                .with_context(|| format!("cannot write {}", path.display()))?;
            Ok(path)
        }
    }
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
