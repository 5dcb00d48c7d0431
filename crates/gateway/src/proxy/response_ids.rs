//! Stored responses isolated per tenant (docs/gateway.md, "Stored responses"):
//! every tenant calls OpenAI with the gateway's one key, so OpenAI would let any
//! tenant continue any stored response it names (`previous_response_id`). The
//! gateway remembers the response ids it handed to each tenant and refuses a
//! `previous_response_id` it did not hand to the calling tenant, with the answer
//! OpenAI gives for an id it does not know (400 `previous_response_not_found`), so
//! the refusal tells nothing about whether the id exists.
//!
//! Per server: a fleet's servers do not share these ids, so a tenant's next turn
//! must reach the server that answered its previous one (a balancer's affinity
//! per tenant key), else it is refused as unknown.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};

use serde_json::{Map, Value};

use crate::wire::call::Endpoint;
use crate::wire::error::{ErrorKind, GatewayError};

/// The most response ids remembered per tenant; past it the oldest are
/// forgotten (a conversation continued from one of those is refused). About
/// 200 bytes each, so at most about 2 MB per tenant.
pub const RESPONSE_IDS_PER_TENANT_MAX: usize = 10_000;

/// The response ids handed to each tenant (by tenant name), each tenant bounded
/// to [`RESPONSE_IDS_PER_TENANT_MAX`] on its own: one tenant's calls never push
/// out another's ids.
#[derive(Default)]
pub struct ResponseIds {
    tenants: Mutex<HashMap<Arc<str>, TenantIds>>,
}

/// One tenant's ids, oldest first.
#[derive(Default)]
struct TenantIds {
    known: HashSet<Arc<str>>,
    order: VecDeque<Arc<str>>,
}

impl ResponseIds {
    /// Remembers `id` as handed to `tenant`.
    pub fn remember(&self, tenant: &Arc<str>, id: &str) {
        let mut tenants = self.tenants.lock().expect("response ids lock");
        let ids = tenants.entry(tenant.clone()).or_default();
        if ids.known.contains(id) {
            return;
        }
        if ids.order.len() >= RESPONSE_IDS_PER_TENANT_MAX {
            if let Some(oldest) = ids.order.pop_front() {
                ids.known.remove(&oldest);
            }
        }
        let id: Arc<str> = Arc::from(id);
        ids.known.insert(id.clone());
        ids.order.push_back(id);
    }

    /// Whether `id` was handed to `tenant` (and not forgotten since).
    pub fn knows(&self, tenant: &str, id: &str) -> bool {
        let tenants = self.tenants.lock().expect("response ids lock");
        tenants.get(tenant).is_some_and(|ids| ids.known.contains(id))
    }

    /// Refuses a Responses call of `tenant` whose `previous_response_id` the
    /// gateway did not hand to it, as OpenAI refuses an unknown id. Other
    /// endpoints, and a call without the field (or `null`), pass.
    pub fn check(&self, endpoint: Endpoint, tenant: &str, request: &Map<String, Value>) -> Result<(), GatewayError> {
        if endpoint != Endpoint::Responses {
            return Ok(());
        }
        match request.get("previous_response_id") {
            None | Some(Value::Null) => Ok(()),
            Some(Value::String(id)) if self.knows(tenant, id) => Ok(()),
            Some(Value::String(id)) => Err(GatewayError::previous_response_not_found(id)),
            Some(_) => Err(GatewayError::new(
                ErrorKind::InvalidRequest,
                "previous_response_id: must be a string.",
            )),
        }
    }
}

/// Where the id of one tenant's answer is remembered when the answer ends whole.
#[derive(Clone)]
pub struct RememberResponseId {
    /// The gateway's ids.
    pub ids: Arc<ResponseIds>,
    /// The tenant answered.
    pub tenant: Arc<str>,
}

impl RememberResponseId {
    /// Remembers `id` for the tenant.
    pub fn remember(&self, id: &str) {
        self.ids.remember(&self.tenant, id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn request(value: Value) -> Map<String, Value> {
        value.as_object().unwrap().clone()
    }

    #[test]
    fn each_tenant_continues_only_its_own_responses() {
        let ids = ResponseIds::default();
        let (acme, beta): (Arc<str>, Arc<str>) = (Arc::from("acme"), Arc::from("beta"));
        ids.remember(&acme, "resp_a");
        let follow = request(json!({"previous_response_id": "resp_a"}));
        assert!(ids.check(Endpoint::Responses, "acme", &follow).is_ok());
        let refused = ids.check(Endpoint::Responses, "beta", &follow).unwrap_err();
        assert_eq!(refused.status().as_u16(), 400);
        let unknown = request(json!({"previous_response_id": "resp_never"}));
        let unknown = ids.check(Endpoint::Responses, "acme", &unknown).unwrap_err();
        let body = |e: &GatewayError| e.body(crate::wire::error::Format::OpenAi)["error"]["code"].clone();
        assert_eq!(
            body(&refused),
            body(&unknown),
            "another's id answers like an unknown one"
        );
        assert!(ids
            .check(
                Endpoint::Responses,
                "beta",
                &request(json!({"previous_response_id": null}))
            )
            .is_ok());
        assert!(ids.check(Endpoint::ChatCompletions, "beta", &follow).is_ok());
        assert!(ids
            .check(
                Endpoint::Responses,
                "beta",
                &request(json!({"previous_response_id": 5}))
            )
            .is_err());
        // One tenant's flood of answers never pushes out another's ids.
        for i in 0..RESPONSE_IDS_PER_TENANT_MAX + 1 {
            ids.remember(&beta, &format!("resp_b{i}"));
        }
        assert!(ids.knows("acme", "resp_a"));
        assert!(!ids.knows("beta", "resp_b0"), "the tenant's oldest id is forgotten");
        assert!(ids.knows("beta", &format!("resp_b{RESPONSE_IDS_PER_TENANT_MAX}")));
    }
}
