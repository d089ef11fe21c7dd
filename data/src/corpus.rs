//! Text corpora: a file, a directory of `*.txt` files, or a named corpus looked up in the
//! data directory and downloaded there once (with a checksum) when it is missing.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::DataError;

/// A corpus known by name.
pub struct NamedCorpus {
    pub name: &'static str,
    /// File name in the data directory.
    pub file: &'static str,
    pub url: &'static str,
    pub sha256: &'static str,
}

/// Karpathy's tiny-shakespeare (char-rnn), as nanoGPT downloads it.
pub const TINYSHAKESPEARE: NamedCorpus = NamedCorpus {
    name: "tinyshakespeare",
    file: "tinyshakespeare.txt",
    url: "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt",
    sha256: "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed",
};

pub const NAMED: [NamedCorpus; 1] = [TINYSHAKESPEARE];

/// Where named corpora are looked up and downloaded to: `$HLA_DATA_DIR`, else
/// [`cache_dir`].
pub fn data_dir() -> PathBuf {
    std::env::var_os("HLA_DATA_DIR").map_or_else(cache_dir, PathBuf::from)
}

/// Where prepared token files are written: `$HLA_CACHE_DIR`, else the user's cache
/// directory (`~/.cache/hla` on Linux). Kept apart from the data directory, which may be
/// read-only.
pub fn cache_dir() -> PathBuf {
    match std::env::var_os("HLA_CACHE_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => dirs::cache_dir()
            .unwrap_or_else(std::env::temp_dir)
            .join("hla"),
    }
}

/// The path of `source`: a named corpus (fetched into `data_dir` if missing) or a path.
pub fn resolve(source: &str, data_dir: &Path) -> Result<PathBuf, DataError> {
    if let Some(named) = NAMED.iter().find(|c| c.name == source) {
        return fetch(named, data_dir, named.url);
    }
    let path = PathBuf::from(source);
    if path.exists() {
        Ok(path)
    } else {
        Err(DataError::MissingPath(path))
    }
}

/// `corpus` from `dir`, downloading it from `url` first when it is not there.
pub fn fetch(corpus: &NamedCorpus, dir: &Path, url: &str) -> Result<PathBuf, DataError> {
    let path = dir.join(corpus.file);
    if path.exists() {
        return Ok(path);
    }
    download(url, corpus.sha256, &path).map_err(|err| DataError::Unavailable {
        name: corpus.name.into(),
        dir: dir.into(),
        file: corpus.file.into(),
        reason: err.to_string(),
    })?;
    Ok(path)
}

/// Downloads `url` to `dest` through a temporary file, checking its sha256, with a
/// progress bar on stderr.
pub fn download(url: &str, sha256: &str, dest: &Path) -> Result<(), DataError> {
    let dir = dest.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(DataError::io(dir))?;
    let failed = |reason: String| DataError::Io {
        path: dest.into(),
        source: std::io::Error::other(reason),
    };
    let response = ureq::get(url).call().map_err(|e| failed(e.to_string()))?;
    let total: Option<u64> = response
        .headers()
        .get("content-length")
        .and_then(|v| v.to_str().ok()?.parse().ok());
    let mut reader = response.into_body().into_reader();
    let part = dest.with_extension("part");
    let mut file = std::fs::File::create(&part).map_err(DataError::io(&part))?;
    let (mut hasher, mut done, mut buf) = (Sha256::new(), 0u64, vec![0u8; 1 << 16]);
    loop {
        let n = reader.read(&mut buf).map_err(|e| failed(e.to_string()))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        file.write_all(&buf[..n]).map_err(DataError::io(&part))?;
        done += n as u64;
        progress(url, done, total);
    }
    eprintln!();
    file.sync_all().map_err(DataError::io(&part))?;
    let got = hex(&hasher.finalize());
    if got != sha256 {
        let _ = std::fs::remove_file(&part);
        return Err(DataError::Checksum {
            url: url.into(),
            expected: sha256.into(),
            got,
        });
    }
    std::fs::rename(&part, dest).map_err(DataError::io(dest))
}

fn progress(url: &str, done: u64, total: Option<u64>) {
    let mb = |b: u64| b as f64 / 1e6;
    match total {
        Some(total) if total > 0 => {
            let filled = (30 * done / total.max(1)) as usize;
            eprint!(
                "\rdownloading {url} [{}{}] {:.1}/{:.1} MB",
                "#".repeat(filled.min(30)),
                " ".repeat(30 - filled.min(30)),
                mb(done),
                mb(total)
            );
        }
        _ => eprint!("\rdownloading {url} {:.1} MB", mb(done)),
    }
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The bytes of a file, or of every `*.txt` file under a directory (recursively, in
/// path order), concatenated.
pub fn read_bytes(path: &Path) -> Result<Vec<u8>, DataError> {
    if !path.exists() {
        return Err(DataError::MissingPath(path.into()));
    }
    let mut files = Vec::new();
    collect_files(path, &mut files)?;
    files.sort();
    let mut bytes = Vec::new();
    for file in files {
        bytes.extend(std::fs::read(&file).map_err(DataError::io(&file))?);
    }
    if bytes.is_empty() {
        return Err(DataError::EmptyCorpus(path.display().to_string()));
    }
    Ok(bytes)
}

fn collect_files(path: &Path, out: &mut Vec<PathBuf>) -> Result<(), DataError> {
    if path.is_file() {
        out.push(path.into());
        return Ok(());
    }
    for entry in std::fs::read_dir(path).map_err(DataError::io(path))? {
        let entry = entry.map_err(DataError::io(path))?.path();
        if entry.is_dir() {
            collect_files(&entry, out)?;
        } else if entry.extension().is_some_and(|e| e == "txt") {
            out.push(entry);
        }
    }
    Ok(())
}

/// The UTF-8 text of `path` (see [`read_bytes`]).
pub fn read_text(path: &Path) -> Result<String, DataError> {
    utf8(read_bytes(path)?, path)
}

/// `bytes` read from `path` as UTF-8 text.
pub fn utf8(bytes: Vec<u8>, path: &Path) -> Result<String, DataError> {
    String::from_utf8(bytes).map_err(|e| DataError::InvalidUtf8 {
        path: path.into(),
        offset: e.utf8_error().valid_up_to(),
    })
}

/// The sha256 of `bytes`, as hex.
pub fn sha256(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}
