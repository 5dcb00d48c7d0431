//! One change of the directory: what the store records, in order, and what
//! every reader applies with the same rules ([`super::DirectoryIndex::apply`]),
//! so every server of a fleet, reading the same changes in the same order,
//! holds the same tenants and keys.

use serde::{Deserialize, Serialize};

use super::{KeyLimits, KeyRecord, TenantRecord};

/// One change, as the store carries it (JSON, one object per change).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "change", rename_all = "snake_case")]
pub enum Change {
    /// A tenant created or updated: the whole record.
    PutTenant {
        /// The record in force from now on.
        tenant: TenantRecord,
    },
    /// A tenant deleted: its keys are revoked with it.
    DeleteTenant {
        /// Its name.
        name: String,
        /// The incarnation deleted: a later tenant of the name is untouched.
        id: String,
        /// When, ms since the Unix epoch.
        at_unix_ms: u64,
    },
    /// A key created.
    CreateKey {
        /// The new key.
        key: KeyRecord,
    },
    /// A key revoked.
    RevokeKey {
        /// Its id.
        id: String,
        /// When, ms since the Unix epoch.
        at_unix_ms: u64,
    },
    /// A key rotated: `key` is created and the old one expires at
    /// `expires_at_unix_ms` (the grace's end), in one change.
    RotateKey {
        /// The old key's id.
        id: String,
        /// When the old key stops working.
        expires_at_unix_ms: u64,
        /// The new key.
        key: KeyRecord,
    },
    /// A key's own limits changed (its budgets, through the key's PATCH).
    UpdateKey {
        /// Its id.
        id: String,
        /// Its limits in force from now on, whole.
        limits: KeyLimits,
        /// When, ms since the Unix epoch.
        at_unix_ms: u64,
    },
    /// Keys forgotten: revoked or expired longer than the retention, they
    /// leave the lists and the bound on keys (docs/gateway.md, "Tenants and keys").
    ForgetKeys {
        /// Their ids, at most [`FORGET_KEYS_PER_CHANGE`].
        ids: Vec<String>,
        /// When, ms since the Unix epoch.
        at_unix_ms: u64,
    },
}

/// The most keys one [`Change::ForgetKeys`] names: 500 ids of 26 characters
/// make about 15 KB of JSON, within the half of the largest change the
/// cluster's log carries (32 KiB), so a forgetting never has to be split.
pub const FORGET_KEYS_PER_CHANGE: usize = 500;

impl Change {
    /// The record a change follows the latest version of: at most one change
    /// follows each version of a subject, so two servers changing the same
    /// tenant or key at once cannot both succeed on a stale view.
    pub fn subject(&self) -> String {
        match self {
            Change::PutTenant { tenant } => format!("tenant:{}", tenant.name),
            Change::DeleteTenant { name, .. } => format!("tenant:{name}"),
            Change::CreateKey { key } => format!("key:{}", key.id),
            Change::RevokeKey { id, .. } | Change::RotateKey { id, .. } | Change::UpdateKey { id, .. } => {
                format!("key:{id}")
            }
            // Two servers forgetting the same keys at once claim the same
            // subject: one writes, the other reads the keys gone.
            Change::ForgetKeys { ids, .. } => format!("forget:{}", ids.first().map_or("", String::as_str)),
        }
    }

    /// Its kind, as logs and metrics name it.
    pub fn kind(&self) -> &'static str {
        match self {
            Change::PutTenant { .. } => "put_tenant",
            Change::DeleteTenant { .. } => "delete_tenant",
            Change::CreateKey { .. } => "create_key",
            Change::RevokeKey { .. } => "revoke_key",
            Change::RotateKey { .. } => "rotate_key",
            Change::UpdateKey { .. } => "update_key",
            Change::ForgetKeys { .. } => "forget_keys",
        }
    }
}

/// A change and its place in the store's order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recorded {
    /// Increases with every change: the store's order (a line number of the
    /// memory backend's file, a cluster timestamp on TigerBeetle).
    pub version: u64,
    /// The change.
    pub change: Change,
}
