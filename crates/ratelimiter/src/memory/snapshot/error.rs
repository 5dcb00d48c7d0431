//! Why a snapshot cannot be read, written or restored.

use std::path::PathBuf;

/// Why a snapshot cannot be read or restored. Every message names the file.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    /// The file could not be read or written.
    #[error("memory snapshot {path}: {source}")]
    Io {
        /// The snapshot file.
        path: PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// The file is not a whole snapshot of this format: nothing was restored.
    #[error("memory snapshot {path} is damaged: {reason}")]
    Damaged {
        /// The snapshot file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// A restore into a backend that already settled or holds leases: their
    /// fingerprints and memories would mix with the snapshot's.
    #[error("memory snapshot: a restore needs a backend that has served no request yet")]
    NotFresh,
}
