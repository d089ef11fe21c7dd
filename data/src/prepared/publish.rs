//! How a prepared folder is written: by one process at a time ([`lock`]), into a temporary
//! sibling published whole ([`Part`]).
//!
//! Both a lock and a temporary folder, because each guards against a different failure. The
//! lock (`flock` through `File::lock`) makes a second preparation of the same corpus wait for
//! the first and then re-use its work instead of tokenizing it again into the same files; the
//! kernel releases it when its process ends, however it ends, so no stale lock is ever left
//! behind (unlike a pid file). The temporary folder, synced and renamed into place only once
//! complete, means that a preparation that fails or is killed leaves nothing half-written and
//! never touches an earlier good folder, which a training run may have memory-mapped.

use std::fs::{File, TryLockError};
use std::path::{Path, PathBuf};

use crate::DataError;

/// `dir`'s sibling named `dir` + `suffix`.
fn sibling(dir: &Path, suffix: &str) -> PathBuf {
    let mut name = dir.file_name().unwrap_or_default().to_os_string();
    name.push(suffix);
    dir.with_file_name(name)
}

/// Holds the cache folder `dir` for this process until dropped (closing the file unlocks it).
pub struct Lock {
    _file: File,
}

/// Takes the lock of the cache folder `dir`, waiting (and saying so on stderr) while another
/// process holds it.
pub fn lock(dir: &Path) -> Result<Lock, DataError> {
    let path = sibling(dir, ".lock");
    let parent = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(parent).map_err(DataError::io(parent))?;
    // The lock file stays: removing it would let a third process lock a new file while a
    // second still waits on the old one.
    let file = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(DataError::io(&path))?;
    match file.try_lock() {
        Ok(()) => return Ok(Lock { _file: file }),
        Err(TryLockError::WouldBlock) => {
            eprintln!(
                "waiting for another process preparing {} to finish",
                dir.display()
            );
        }
        Err(TryLockError::Error(e)) => return Err(DataError::io(&path)(e)),
    }
    file.lock().map_err(DataError::io(&path))?;
    Ok(Lock { _file: file })
}

/// Removes what a killed preparation of `dir` left beside it (its temporary folder, or the
/// earlier folder it was replacing), whether or not `dir` is prepared again; the caller holds
/// `dir`'s lock, so no preparation is writing them.
pub fn remove_leftovers(dir: &Path) -> Result<(), DataError> {
    for leftover in [sibling(dir, ".part"), sibling(dir, ".old")] {
        remove_dir(&leftover)?;
    }
    Ok(())
}

/// A preparation being written into a temporary sibling of its folder; removed when dropped
/// unless [published](Part::publish).
pub struct Part {
    dir: PathBuf,
    path: PathBuf,
    published: bool,
}

impl Part {
    /// An empty temporary folder for `dir`, whose lock the caller holds; what a killed
    /// preparation left there goes first.
    pub fn create(dir: &Path) -> Result<Self, DataError> {
        remove_leftovers(dir)?;
        let part = Self {
            dir: dir.into(),
            path: sibling(dir, ".part"),
            published: false,
        };
        std::fs::create_dir_all(&part.path).map_err(DataError::io(&part.path))?;
        Ok(part)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Puts the complete preparation in place of `dir` (and of what was there), its files
    /// and folder on disk first.
    pub fn publish(mut self) -> Result<(), DataError> {
        for entry in std::fs::read_dir(&self.path).map_err(DataError::io(&self.path))? {
            let file = entry.map_err(DataError::io(&self.path))?.path();
            sync(&file)?;
        }
        sync(&self.path)?;
        if self.dir.exists() {
            // A folder cannot be renamed onto a non-empty one: the old one steps aside first.
            let old = sibling(&self.dir, ".old");
            std::fs::rename(&self.dir, &old).map_err(DataError::io(&self.dir))?;
            std::fs::rename(&self.path, &self.dir).map_err(DataError::io(&self.dir))?;
            remove_dir(&old)?;
        } else {
            std::fs::rename(&self.path, &self.dir).map_err(DataError::io(&self.dir))?;
        }
        self.published = true;
        sync(self.dir.parent().unwrap_or(Path::new(".")))
    }
}

impl Drop for Part {
    fn drop(&mut self) {
        if !self.published {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

fn remove_dir(path: &Path) -> Result<(), DataError> {
    match std::fs::remove_dir_all(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(DataError::io(path)(e)),
        _ => Ok(()),
    }
}

/// Flushes a file, or a folder's entries, to disk (folders on Unix only: elsewhere they
/// cannot be opened as files).
fn sync(path: &Path) -> Result<(), DataError> {
    if path.is_dir() && !cfg!(unix) {
        return Ok(());
    }
    File::open(path)
        .and_then(|f| f.sync_all())
        .map_err(DataError::io(path))
}
