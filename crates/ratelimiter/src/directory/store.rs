//! Where the directory's changes are kept: the trait both backends implement.
//! The memory backend's is a file beside the registry ([`super::FileStore`]);
//! TigerBeetle's is a log in the cluster every server of a fleet reads
//! (`crate::tigerbeetle::directory_log`).

use async_trait::async_trait;

use super::change::{Change, Recorded};
use super::DirectoryError;

/// What became of an append.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Appended {
    /// The change is recorded, durably.
    Written,
    /// Another change follows the same version of the subject: the writer's
    /// view was stale, nothing was written.
    Superseded,
}

/// The durable, ordered record of the directory's changes.
#[async_trait]
pub trait DirectoryStore: Send + Sync + std::fmt::Debug {
    /// The changes recorded since the last call (every one at the first), in
    /// the store's order. Calls are serialized by the caller.
    async fn read_new(&self) -> Result<Vec<Recorded>, DirectoryError>;

    /// Records `change`, which follows the version `previous_version` of its
    /// subject ([`Change::subject`]; 0: its first change), durably before it
    /// returns [`Appended::Written`]. The reader sees it at its next
    /// [`DirectoryStore::read_new`].
    async fn append(&self, change: &Change, previous_version: u64) -> Result<Appended, DirectoryError>;

    /// True when other servers write to it too: the directory then reads it
    /// periodically, and at once (rate-limited) for a key it does not know.
    fn shared(&self) -> bool;

    /// Replaces the whole record by `changes` when the store finds it worth it
    /// (the memory backend's file after many changes); the default keeps it.
    async fn compact(&self, _changes: Vec<Change>) -> Result<(), DirectoryError> {
        Ok(())
    }
}
