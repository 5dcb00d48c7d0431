//! Ids of stored provider objects handed to a gateway tenant, shared by a fleet
//! (docs/gateway.md, "Stored responses"): every tenant calls the provider with the
//! gateway's one key, so the provider would let any tenant continue any stored
//! response or conversation it names. The gateway accepts such an id only from
//! the tenant it was handed to. One server remembers that in its memory; the
//! servers of a fleet on TigerBeetle share it through the cluster
//! (`crate::tigerbeetle::handed_id_log`), so a tenant's next turn is accepted on
//! whichever server it reaches, and refused on every server for another tenant.

use std::fmt;

use async_trait::async_trait;

use crate::model::error::LimiterError;

/// The longest id recorded or looked up, in bytes: the provider's ids are tens
/// of bytes (`resp_` or `conv_` and about 50 hex digits); a longer one is never
/// handed, so it is never looked up either.
pub const HANDED_ID_BYTES_MAX: usize = 256;

/// What kind of stored object an id names: one tenant's response id is not a
/// conversation id of the same tenant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StoredKind {
    /// A stored response, continued with `previous_response_id`.
    Response,
    /// A conversation, continued with `conversation`.
    Conversation,
}

impl StoredKind {
    /// The kind's name in records and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            StoredKind::Response => "response",
            StoredKind::Conversation => "conversation",
        }
    }
}

impl fmt::Display for StoredKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The fleet's record of which tenant each stored id was handed to.
#[async_trait]
pub trait HandedIdStore: Send + Sync + fmt::Debug {
    /// Records that `id` of `kind` was handed to `tenant`; recording it again
    /// changes nothing. Done before the answer that carries the id ends for
    /// the client, so the client's next call finds it on any server.
    async fn record(&self, tenant: &str, kind: StoredKind, id: &str) -> Result<(), LimiterError>;

    /// Whether `id` of `kind` was handed to `tenant` by any server of the fleet.
    async fn handed(&self, tenant: &str, kind: StoredKind, id: &str) -> Result<bool, LimiterError>;
}
