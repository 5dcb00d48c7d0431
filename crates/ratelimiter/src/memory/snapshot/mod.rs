//! Saving and restoring the memory backend's live state: held
//! units per limit, live leases with what Complete needs to reconcile them,
//! and the settled- and failed-lease memories, so a restart neither hands out
//! capacity the provider still counts nor forgets an idempotent answer.
//!
//! A snapshot is copied under the backend's lock (plain copies, no encoding)
//! and encoded outside it. Every instant in it is wall time (Unix ms) as the
//! writing process's clock read it, with the boot clock read at the same
//! moment: the next process of the same boot moves every instant by what its
//! own wall clock says minus the real time that passed, so a wall-clock step
//! between the two (NTP, an operator) neither ends holds early (over-admission)
//! nor makes them last longer. Across a reboot the wall clock is
//! all there is.
//!
//! The file format, all integers little-endian:
//!
//! ```text
//! magic "RLMEMSNP" | version u32 | body length u64 | body | SHA-256 of all before it
//! body: taken_at u64, fingerprint_seed u64,
//!       (version 2) boot id u128 (0: unknown), taken at since boot µs u64, taken at Unix µs u64,
//!       limits u32 × (key length u16, key, kind u8, debt u64,
//!                     (version 2) streak denials u32, streak updated_at u64,
//!                     (version 3) owed until u64 (0: never owed),
//!                     holds u32 × (expires_at u64, units u64),
//!                     (kind 2, a bucket: no holds, then level u64, refilled_at u64)),
//!       leases u32 × (id u128, reserved_at u64, holds u8 × (limit u32, amount u64, expires_at u64)),
//!       settled groups u32 × (settled_at u64, leases u32 × (id u128, reserved_at u64, fingerprint u64)),
//!       failed u32 × (id u128, failed_at u64)
//! ```
//!
//! A lease's holds name limits by their position in the snapshot's own limit
//! list, and a restore maps them by key, since indices differ between
//! processes. Decoding checks everything before anything is restored, so a
//! damaged file is rejected whole, never half-loaded.

mod content;
mod error;
mod file;
mod format;
mod restore;
#[cfg(test)]
mod tests;

pub use content::{MemorySnapshot, RestoreReport};
pub use error::SnapshotError;
pub use format::{SNAPSHOT_FORMAT_VERSION, SNAPSHOT_FORMAT_VERSION_OLDEST, SNAPSHOT_MAGIC};
