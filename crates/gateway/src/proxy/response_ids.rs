//! Stored responses isolated per tenant (docs/gateway.md, "Stored responses"):
//! every tenant calls OpenAI with the gateway's one key, so OpenAI would let any
//! tenant continue any stored response (`previous_response_id`) or conversation
//! (`conversation`) it names. The gateway remembers the ids it handed to each
//! tenant and refuses one it did not hand to the calling tenant, with the answer
//! OpenAI gives for an id it does not know (a 400 `previous_response_not_found`,
//! a 404 `conversation_not_found`), so the refusal tells nothing about whether
//! the id exists.
//!
//! Each server keeps the ids it handed in memory, per tenant. On TigerBeetle
//! the fleet shares them too ([`HandedIdStore`], one transfer per id in the
//! cluster): an id is recorded there before the answer that carries it ends for
//! the client, and an id missing from this server's memory is looked up there,
//! so a tenant's next turn is accepted on any server and another tenant's is
//! refused on every one.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::sync::Mutex;

use ratelimiter::handed_ids::{HandedIdStore, StoredKind, HANDED_ID_BYTES_MAX};
use serde_json::{Map, Value};

use crate::wire::call::Endpoint;
use crate::wire::error::{ErrorKind, GatewayError};

/// The most ids (responses and conversations) this server remembers per
/// tenant; past it the oldest are forgotten (on one server, a conversation
/// continued from one of those is refused; on a fleet, the cluster still
/// knows it). About 200 bytes each, so at most about 2 MB per tenant.
pub const RESPONSE_IDS_PER_TENANT_MAX: usize = 10_000;

/// The ids handed to each tenant (by its owner, `Caller::owner`: a tenant of
/// the file by its name, one of the directory by its id), each tenant bounded to
/// [`RESPONSE_IDS_PER_TENANT_MAX`] on its own: one tenant's calls never push
/// out another's ids.
#[derive(Default)]
pub struct ResponseIds {
    tenants: Mutex<HashMap<Arc<str>, TenantIds>>,
    /// The fleet's record in the cluster; `None`: this server's memory only.
    fleet: Option<Arc<dyn HandedIdStore>>,
}

/// One tenant's ids, oldest first.
#[derive(Default)]
struct TenantIds {
    known: HashSet<(StoredKind, Arc<str>)>,
    order: VecDeque<(StoredKind, Arc<str>)>,
}

impl ResponseIds {
    /// Ids shared by the servers of a fleet through `fleet`, and remembered by
    /// this server as well.
    pub fn shared(fleet: Arc<dyn HandedIdStore>) -> Self {
        Self {
            tenants: Mutex::default(),
            fleet: Some(fleet),
        }
    }

    /// Remembers on this server that `id` of `kind` was handed to `tenant`.
    pub fn remember(&self, tenant: &Arc<str>, kind: StoredKind, id: &str) {
        let mut tenants = self.tenants.lock().expect("response ids lock");
        let ids = tenants.entry(tenant.clone()).or_default();
        let entry = (kind, Arc::<str>::from(id));
        if ids.known.contains(&entry) {
            return;
        }
        if ids.order.len() >= RESPONSE_IDS_PER_TENANT_MAX {
            if let Some(oldest) = ids.order.pop_front() {
                ids.known.remove(&oldest);
            }
        }
        ids.known.insert(entry.clone());
        ids.order.push_back(entry);
    }

    /// Whether this server remembers handing `id` of `kind` to `tenant`.
    pub fn knows(&self, tenant: &str, kind: StoredKind, id: &str) -> bool {
        let tenants = self.tenants.lock().expect("response ids lock");
        tenants
            .get(tenant)
            .is_some_and(|ids| ids.known.contains(&(kind, Arc::from(id))))
    }

    /// Records that `id` of `kind` was handed to `tenant`: here, and in the
    /// fleet's record when there is one, awaited. A failed write is logged and
    /// the answer goes on: the id is then accepted on this server only.
    pub async fn record(&self, tenant: &Arc<str>, kind: StoredKind, id: &str) {
        if id.len() > HANDED_ID_BYTES_MAX {
            return; // no provider id is this long: never handed, never accepted
        }
        self.remember(tenant, kind, id);
        if let Some(fleet) = &self.fleet {
            if let Err(e) = fleet.record(tenant, kind, id).await {
                tracing::warn!(tenant = %tenant, %kind, error = %e,
                    "gateway: a handed id was not recorded in the cluster; other servers will refuse it");
            }
        }
    }

    /// Whether `id` of `kind` was handed to `tenant`: by this server, or by any
    /// server of the fleet (then remembered here too).
    async fn handed(&self, tenant: &Arc<str>, kind: StoredKind, id: &str) -> Result<bool, GatewayError> {
        if self.knows(tenant, kind, id) {
            return Ok(true);
        }
        let Some(fleet) = &self.fleet else {
            return Ok(false);
        };
        if id.len() > HANDED_ID_BYTES_MAX {
            return Ok(false);
        }
        let found = fleet.handed(tenant, kind, id).await.map_err(|e| {
            tracing::error!(error = %e, %kind, "gateway: looking up a handed id in the cluster failed");
            GatewayError::new(
                ErrorKind::Internal,
                "The rate limiter's backend failed; nothing was sent upstream.",
            )
        })?;
        if found {
            self.remember(tenant, kind, id);
        }
        Ok(found)
    }

    /// Refuses a Responses call of `tenant` that continues a stored response or
    /// a conversation the gateway did not hand to it, as OpenAI refuses an
    /// unknown id. Other endpoints, and a call without the fields (or `null`),
    /// pass; a field of the wrong type is a 400.
    pub async fn check(
        &self,
        endpoint: Endpoint,
        tenant: &Arc<str>,
        request: &Map<String, Value>,
    ) -> Result<(), GatewayError> {
        if endpoint != Endpoint::Responses {
            return Ok(());
        }
        match request.get("previous_response_id") {
            None | Some(Value::Null) => {}
            Some(Value::String(id)) => {
                if !self.handed(tenant, StoredKind::Response, id).await? {
                    return Err(GatewayError::previous_response_not_found(id));
                }
            }
            Some(_) => {
                return Err(GatewayError::new(
                    ErrorKind::InvalidRequest,
                    "previous_response_id: must be a string.",
                ))
            }
        }
        match request.get("conversation") {
            None | Some(Value::Null) => Ok(()),
            Some(value) => {
                let id = conversation_id(value).ok_or_else(|| {
                    GatewayError::new(
                        ErrorKind::InvalidRequest,
                        "conversation: must be a conversation id or an object with a string `id`.",
                    )
                })?;
                if self.handed(tenant, StoredKind::Conversation, id).await? {
                    Ok(())
                } else {
                    Err(GatewayError::conversation_not_found(id))
                }
            }
        }
    }
}

/// The id of a `conversation` value, as OpenAI accepts it in a request and
/// gives it in a response: the id itself, or an object with its `id`.
pub fn conversation_id(value: &Value) -> Option<&str> {
    match value {
        Value::String(id) => Some(id),
        Value::Object(object) => object.get("id").and_then(Value::as_str),
        _ => None,
    }
}

/// Where the ids of one tenant's answer are recorded when the answer ends whole.
#[derive(Clone)]
pub struct RememberResponseId {
    /// The gateway's ids.
    pub ids: Arc<ResponseIds>,
    /// The tenant answered.
    pub tenant: Arc<str>,
}

impl RememberResponseId {
    /// Records the answer's response id and its conversation's for the tenant.
    pub async fn record(&self, response_id: Option<&str>, conversation: Option<&Value>) {
        if let Some(id) = response_id {
            self.ids.record(&self.tenant, StoredKind::Response, id).await;
        }
        if let Some(id) = conversation.and_then(conversation_id) {
            self.ids.record(&self.tenant, StoredKind::Conversation, id).await;
        }
    }
}

#[cfg(test)]
#[path = "response_ids_tests.rs"]
mod tests;
