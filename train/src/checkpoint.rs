//! Checkpoints written atomically: burn-train's file checkpointer writes in place, so a run
//! killed mid-write would leave an unreadable file; this one writes a temporary file, syncs
//! it and renames it.

use std::path::PathBuf;

use burn::train::checkpoint::{Checkpoint, Checkpointer, CheckpointerError};

pub struct AtomicCheckpointer {
    dir: PathBuf,
    name: &'static str,
}

impl AtomicCheckpointer {
    pub fn new(dir: PathBuf, name: &'static str) -> Self {
        Self { dir, name }
    }

    fn path(&self, epoch: usize) -> PathBuf {
        self.dir.join(format!("{}-{epoch}.bpk", self.name))
    }
}

impl<R: Checkpoint> Checkpointer<R> for AtomicCheckpointer {
    fn save(&self, epoch: usize, record: R) -> Result<(), CheckpointerError> {
        std::fs::create_dir_all(&self.dir).map_err(CheckpointerError::IOError)?;
        let (tmp, path) = (self.path(epoch).with_extension("tmp"), self.path(epoch));
        record.save(tmp.clone())?;
        std::fs::File::open(&tmp)
            .and_then(|file| file.sync_all())
            .and_then(|()| std::fs::rename(&tmp, &path))
            .map_err(CheckpointerError::IOError)
    }

    fn delete(&self, epoch: usize) -> Result<(), CheckpointerError> {
        match std::fs::remove_file(self.path(epoch)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(CheckpointerError::IOError(e))
            }
            _ => Ok(()),
        }
    }

    fn restore(&self, epoch: usize) -> Result<R, CheckpointerError> {
        R::load(self.path(epoch))
    }
}
