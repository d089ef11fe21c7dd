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
use super::usage::usage;

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// `model.safetensors`, loadable with Python's `safetensors` package.
    Safetensors,
    /// `model.bpk`, Burn's own format.
    Burnpack,
}

/// The files an export writes, whatever its format.
const FILES: [&str; 5] = [
    "model.safetensors",
    "model.bpk",
    "config.json",
    "tokenizer.json",
    "manifest.json",
];

/// Refuses (a usage error) an output folder that would overwrite what the export reads:
/// the run folder itself, a folder holding any of `reads`, or one whose files link to them.
pub fn check_target(out: &Path, run: &RunDir, reads: &[PathBuf]) -> Result<()> {
    let Ok(folder) = std::fs::canonicalize(out) else {
        return Ok(()); // not there yet: nothing in it can be read
    };
    let read: Vec<PathBuf> = reads
        .iter()
        .filter_map(|p| std::fs::canonicalize(p).ok())
        .collect();
    let written: Vec<PathBuf> = FILES
        .iter()
        .filter_map(|name| std::fs::canonicalize(out.join(name)).ok())
        .collect();
    let clash = read
        .iter()
        .find(|r| r.parent() == Some(folder.as_path()) || written.contains(r));
    if std::fs::canonicalize(run.path()).ok().as_ref() == Some(&folder) || clash.is_some() {
        let what = clash.map_or("the run folder".to_string(), |r| {
            format!("{}, which the export reads", r.display())
        });
        return Err(usage(format!(
            "cannot export into {}: it holds {what}; choose another --out",
            out.display()
        )));
    }
    Ok(())
}

/// Writes the export of `run` (trained with `config`, its model `lm` of `vocab_size`
/// tokens) into `out`, the weights in `format`; returns the number of tensors. Files of an
/// export cut short (no `manifest.json`, written last) are overwritten.
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
    let write = |name: &str, text: String| {
        let path = out.join(name);
        std::fs::write(&path, text).with_context(|| format!("cannot write {}", path.display()))?;
        anyhow::Ok(path)
    };
    let mut files = vec![
        weights.clone(),
        write("config.json", serde_json::to_string_pretty(&description)?)?,
    ];
    if run.tokenizer().exists() {
        let tokenizer = out.join("tokenizer.json");
        std::fs::copy(run.tokenizer(), &tokenizer)
            .with_context(|| format!("cannot write {}", tokenizer.display()))?;
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
    // The manifest last: an export is complete once it is there.
    for file in &files {
        readable_by_all(file)?;
    }
    let manifest = write("manifest.json", serde_json::to_string_pretty(&manifest)?)?;
    readable_by_all(&manifest)?;
    Ok(parameters.len())
}

/// Writes the weights into `out` in `format`; returns their file.
fn write_weights(config: &RunConfig, lm: &Lm, out: &Path, format: Format) -> Result<PathBuf> {
    match format {
        Format::Safetensors => {
            let path = out.join("model.safetensors");
            let mut store = SafetensorsStore::from_file(&path)
                .overwrite(true)
                .metadata("format", "hla")
                .metadata("mixer", config.model.mixer_label());
            lm.save_into(&mut store)
                .with_context(|| format!("cannot write {}", path.display()))?;
            Ok(path)
        }
        Format::Burnpack => {
            let path = out.join("model.bpk");
            let mut store = BurnpackStore::from_file(&path)
                .overwrite(true)
                .metadata("format", "hla");
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
