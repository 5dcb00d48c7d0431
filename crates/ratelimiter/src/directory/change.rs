//! One change of the directory: what the store records, in order, and what
//! every reader applies with the same rules ([`super::DirectoryIndex::apply`]),
//! so every server of a fleet, reading the same changes in the same order,
//! holds the same tenants and keys.

use serde::{Deserialize, Serialize};

use super::{KeyRecord, TenantRecord};

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
}

impl Change {
    /// The record a change follows the latest version of: at most one change
    /// follows each version of a subject, so two servers changing the same
    /// tenant or key at once cannot both succeed on a stale view.
    pub fn subject(&self) -> String {
        match self {
            Change::PutTenant { tenant } => format!("tenant:{}", tenant.name),
            Change::DeleteTenant { name, .. } => format!("tenant:{name}"),
            Change::CreateKey { key } => format!("key:{}", key.id),
            Change::RevokeKey { id, .. } | Change::RotateKey { id, .. } => format!("key:{id}"),
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
