//! The first failure of the writers that run inside burn-train (metric logs, checkpoints),
//! which cannot return it.

use std::sync::{Arc, Mutex};

/// The first failure, shared with the writers, read once training has stopped.
#[derive(Clone, Default)]
pub struct Failure(Arc<Mutex<Option<String>>>);

impl Failure {
    /// Records `message` unless a failure was recorded already (later ones follow from it).
    pub fn record(&self, message: String) {
        let mut slot = self.0.lock().unwrap_or_else(|e| e.into_inner());
        slot.get_or_insert(message);
    }

    pub fn get(&self) -> Option<String> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}
