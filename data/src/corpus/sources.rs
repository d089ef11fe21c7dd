//! The files of a corpus: one file, every corpus file under a folder, or a glob of shards;
//! each text (`.txt`), JSON lines (`.jsonl`) or Parquet (`.parquet`), optionally
//! compressed (`.gz`, `.zst`).

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::DataError;

/// How a file holds its documents.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// The whole file is one document.
    Text,
    /// One JSON object per line, the document in a text field.
    Jsonl,
    /// A table, the documents in a text column.
    Parquet,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    None,
    Gzip,
    Zstd,
}

/// One file of a corpus.
#[derive(Debug, Clone, PartialEq)]
pub struct SourceFile {
    /// The path it was found at (the first in path order, when several lead to it).
    pub path: PathBuf,
    /// Its real path, every symbolic link resolved: a file is read once whatever leads to it.
    pub real: PathBuf,
    pub format: Format,
    pub compression: Compression,
    /// Bytes on disk.
    pub size: u64,
}

/// Every file of a corpus, in path order (of several corpora: each in turn).
#[derive(Debug, Clone, PartialEq)]
pub struct Sources {
    /// What the user named: a file, a folder or a glob (several: joined by `, `).
    pub spec: String,
    pub files: Vec<SourceFile>,
    /// Paths passed over: links to a file or a folder read already.
    pub skipped: Vec<Skipped>,
}

/// A path the walk passed over, and why.
#[derive(Debug, Clone, PartialEq)]
pub struct Skipped {
    pub path: PathBuf,
    pub reason: String,
}

impl SourceFile {
    /// The format and compression of `path` by its name; `None` for other files.
    fn recognise(path: &Path) -> Option<(Format, Compression)> {
        let name = path.file_name()?.to_str()?.to_ascii_lowercase();
        let (stem, compression) = if let Some(stem) = name.strip_suffix(".gz") {
            (stem, Compression::Gzip)
        } else if let Some(stem) = name.strip_suffix(".zst") {
            (stem, Compression::Zstd)
        } else {
            (name.as_str(), Compression::None)
        };
        let format = match stem.rsplit_once('.')?.1 {
            "txt" => Format::Text,
            "jsonl" => Format::Jsonl,
            "parquet" => Format::Parquet,
            _ => return None,
        };
        Some((format, compression))
    }

    fn new(path: PathBuf, (format, compression): (Format, Compression)) -> Result<Self, DataError> {
        let size = std::fs::metadata(&path)
            .map_err(DataError::io(&path))?
            .len();
        let real = std::fs::canonicalize(&path).map_err(DataError::io(&path))?;
        Ok(Self {
            path,
            real,
            format,
            compression,
            size,
        })
    }
}

impl Sources {
    /// The files of `spec`: a file (of any name: its extensions say how to read it, `.txt`
    /// when they say nothing), a folder (every corpus file below it) or a glob pattern.
    pub fn find(spec: &Path) -> Result<Self, DataError> {
        let mut files = Vec::new();
        let mut skipped = Vec::new();
        let text = spec.to_string_lossy();
        if spec.is_file() {
            let kind = SourceFile::recognise(spec).unwrap_or((Format::Text, Compression::None));
            files.push(SourceFile::new(spec.into(), kind)?);
        } else if spec.is_dir() {
            let mut walk = Walk {
                files: &mut files,
                skipped: &mut skipped,
                entered: Vec::new(),
            };
            walk.folder(spec)?;
        } else if text.contains(['*', '?', '[']) {
            let paths = glob::glob(&text).map_err(|e| DataError::Invalid {
                key: "data.corpus",
                requirement: "a file, a folder or a valid glob pattern".into(),
                value: format!("{text:?} ({e})"),
            })?;
            for path in paths {
                let path = path.map_err(|e| {
                    let path = e.path().to_path_buf();
                    DataError::io(path)(e.into())
                })?;
                if let Some(kind) = SourceFile::recognise(&path).filter(|_| path.is_file()) {
                    files.push(SourceFile::new(path, kind)?);
                }
            }
        } else {
            return Err(DataError::MissingPath(spec.into()));
        }
        files.sort_by(|a, b| a.path.cmp(&b.path));
        let mut read = std::collections::HashSet::new();
        files.retain(|file| {
            let first = read.insert(file.real.clone());
            if !first {
                skipped.push(Skipped {
                    path: file.path.clone(),
                    reason: format!("the file {} is read already", file.real.display()),
                });
            }
            first
        });
        if files.is_empty() {
            return Err(DataError::EmptyCorpus(format!(
                "{} (no .txt, .jsonl or .parquet files, plain or .gz/.zst)",
                spec.display()
            )));
        }
        Ok(Self {
            spec: spec.display().to_string(),
            files,
            skipped,
        })
    }

    /// The files of every corpus of `specs` ([`Sources::find`]), one corpus after another.
    pub fn find_all(specs: &[PathBuf]) -> Result<Self, DataError> {
        let mut all = Self {
            spec: String::new(),
            files: Vec::new(),
            skipped: Vec::new(),
        };
        let mut read = std::collections::HashSet::new();
        for spec in specs {
            let one = Self::find(spec)?;
            all.spec = match all.spec.is_empty() {
                true => one.spec,
                false => format!("{}, {}", all.spec, one.spec),
            };
            all.skipped.extend(one.skipped);
            // A file that two corpora of the list share is read once, in the first.
            for file in one.files {
                if read.insert(file.real.clone()) {
                    all.files.push(file);
                } else {
                    all.skipped.push(Skipped {
                        reason: format!("the file {} is read already", file.real.display()),
                        path: file.path,
                    });
                }
            }
        }
        if all.files.is_empty() {
            return Err(DataError::EmptyCorpus("[] (a list of no corpora)".into()));
        }
        Ok(all)
    }

    /// Whether the corpus can hold more than one document (it then needs an end-of-text
    /// token between them): anything but a single text file.
    pub fn several_documents(&self) -> bool {
        !(self.files.len() == 1 && self.files[0].format == Format::Text)
    }

    pub fn total_bytes(&self) -> u64 {
        self.files.iter().map(|f| f.size).sum()
    }

    /// A hash of every file's path, size and modification time: a preparation is re-used
    /// while it is unchanged.
    pub fn fingerprint(&self) -> Result<String, DataError> {
        let mut hasher = Sha256::new();
        for file in &self.files {
            let meta = std::fs::metadata(&file.path).map_err(DataError::io(&file.path))?;
            let modified = meta
                .modified()
                .ok()
                .and_then(|m| m.duration_since(std::time::UNIX_EPOCH).ok())
                .map_or(0, |d| d.as_nanos());
            hasher.update(file.path.to_string_lossy().as_bytes());
            hasher.update(meta.len().to_le_bytes());
            hasher.update(modified.to_le_bytes());
        }
        Ok(super::hex(&hasher.finalize()))
    }
}

/// A walk of a corpus folder: links followed, each real folder entered once (a link to a
/// folder being walked would loop), entries in name order so that the first path to a file
/// is always the same one.
struct Walk<'a> {
    files: &'a mut Vec<SourceFile>,
    skipped: &'a mut Vec<Skipped>,
    /// The real paths of the folders entered so far.
    entered: Vec<PathBuf>,
}

impl Walk<'_> {
    fn folder(&mut self, dir: &Path) -> Result<(), DataError> {
        let real = std::fs::canonicalize(dir).map_err(DataError::io(dir))?;
        if self.entered.contains(&real) {
            self.skipped.push(Skipped {
                path: dir.into(),
                reason: format!("the folder {} is read already", real.display()),
            });
            return Ok(());
        }
        self.entered.push(real);
        let mut paths = Vec::new();
        for entry in std::fs::read_dir(dir).map_err(DataError::io(dir))? {
            paths.push(entry.map_err(DataError::io(dir))?.path());
        }
        paths.sort();
        for path in paths {
            if path.is_dir() {
                self.folder(&path)?;
            } else if let Some(kind) = SourceFile::recognise(&path).filter(|_| path.is_file()) {
                self.files.push(SourceFile::new(path, kind)?);
            }
        }
        Ok(())
    }
}
