//! The gateway's tenants and keys at runtime (docs/gateway.md, "Tenants and
//! keys"): created, scoped, rotated and revoked through the admin API, kept
//! durably in a [`DirectoryStore`], and looked up by the gateway by their
//! hash in one probe whatever their number.
//!
//! - [`TenantRecord`] (`tenant`), [`KeyRecord`] (`key`): the records.
//! - [`NewKey`], [`KeyHash`] (`secret`): keys generated from the operating
//!   system's generator, kept only as their SHA-256.
//! - [`Change`] (`change`): what the store records, in order.
//! - [`DirectoryIndex`] (`index`): every record in memory, and the lookup.
//! - [`DirectoryStore`] (`store`): the durable record; [`FileStore`]
//!   (`journal`) beside the memory backend's registry, and on TigerBeetle
//!   `crate::tigerbeetle::directory_log`, read by every server of a fleet.
//! - [`Directory`] (`service`): validation, writes, the store's reads and the
//!   forgetting of keys past their retention; what it shows (`reads`) and
//!   counts (`counters`) apart.
//! - `name`: the rules of names.

mod change;
mod counters;
mod error;
mod index;
mod journal;
mod key;
mod limits;
pub mod name;
mod reads;
mod secret;
mod service;
mod store;
mod tenant;

pub use change::{Change, Recorded, FORGET_KEYS_PER_CHANGE};
pub use error::DirectoryError;
pub use index::{Authenticated, DirectoryIndex, Refusal};
pub use journal::{journal_path, FileStore, COMPACT_CHANGES_MIN, JOURNAL_FILE_NAME};
pub use key::{
    KeyLimits, KeyRecord, KeySpec, KeyStatus, KeyView, DAY_WINDOW_SECONDS, EXPIRES_IN_SECONDS_MAX, GRACE_SECONDS_MAX,
    KEY_LIMIT_PREFIX, MINUTE_WINDOW_SECONDS,
};
pub use limits::LIMIT_VALUE_MAX;
pub use secret::{KeyHash, NewKey, KEY_HINT_CHARS, KEY_PREFIX, KEY_RANDOM_BYTES, PRESENTED_KEY_BYTES_MAX};
pub use service::{
    CreatedKey, Directory, DirectoryOptions, DIRECTORY_REFRESH_INTERVAL_MS, FORGET_INTERVAL_MS, KEYS_MAX,
    KEY_RETENTION_MS_DEFAULT, TENANTS_MAX, UNKNOWN_KEY_READ_INTERVAL_MS, WRITE_ATTEMPTS_MAX,
};
pub use store::{Appended, DirectoryStore};
pub use tenant::{Source, TenantFields, TenantPatch, TenantRecord, TENANT_CAP_MAX};
