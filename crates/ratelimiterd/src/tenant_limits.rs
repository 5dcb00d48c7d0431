//! The own limits of the tenants made through the admin API
//! (`tenant:<name>:llm:rpm`, `...:concurrency`, `...:daily_tokens`; docs/gateway.md,
//! "Tenants and keys"). Creating a tenant writes it, then defines its limits:
//! two writes, and a crash between them leaves a tenant whose calls would meet
//! undefined limits. So the server defines whichever are missing at every start
//! (one read of every limit, then a definition per missing one: a no-op when
//! none is), and the gateway asks for the same before it serves a tenant's
//! first call ([`MissingTenantLimits`]). Only missing limits are defined: one
//! an operator changed by hand is left as it is.

use std::collections::HashSet;

use gateway::proxy::key_callers::TenantLimits;
use ratelimiter::directory::{Source, TenantRecord};
use ratelimiter::LimitKey;

use crate::state::{AppState, WeakAppState};

/// Defines the missing limits of `tenant`, a tenant of the API (the file's
/// tenants' are the gateway's, defined at its start); `known` holds the keys
/// the backend has, when already read. Returns how many were defined.
pub async fn define_missing(
    state: &AppState,
    tenant: &TenantRecord,
    known: Option<&HashSet<LimitKey>>,
) -> Result<usize, String> {
    if tenant.source != Source::Api {
        return Ok(0);
    }
    let hold_seconds = state.gateway_scope().concurrency_hold_seconds();
    let mut defined = 0;
    for definition in gateway::limits::directory_tenant_definitions(tenant, hold_seconds) {
        let present = match known {
            Some(known) => known.contains(definition.key()),
            None => (state.backend().limit_report(definition.key()).await)
                .map_err(|e| e.to_string())?
                .is_some(),
        };
        if !present {
            let key = definition.key().clone();
            state
                .admin()
                .define(definition)
                .await
                .map_err(|e| format!("{key}: {e}"))?;
            tracing::warn!(tenant = %tenant.name, %key,
                "gateway: a tenant's limit was missing (a stop between writing the tenant and defining it); defined");
            defined += 1;
        }
    }
    Ok(defined)
}

/// At start: the missing limits of every tenant of the API, after one read of
/// every limit the backend has. Returns how many were defined.
pub async fn define_missing_at_start(state: &AppState) -> Result<usize, String> {
    let Some(directory) = state.directory() else {
        return Ok(0);
    };
    let tenants: Vec<TenantRecord> = (directory.tenants().into_iter())
        .filter(|t| t.source == Source::Api)
        .collect();
    if tenants.is_empty() {
        return Ok(0);
    }
    let reports = state.backend().limit_reports().await.map_err(|e| e.to_string())?;
    let known: HashSet<LimitKey> = (reports.into_iter())
        .map(|r| r.state.definition().key().clone())
        .collect();
    let mut defined = 0;
    for tenant in &tenants {
        defined += define_missing(state, tenant, Some(&known)).await?;
    }
    Ok(defined)
}

/// The gateway's check before a tenant's first call on this server: its
/// missing limits defined (a few reads when none is missing, once per
/// tenant and change of its record).
pub struct MissingTenantLimits(pub WeakAppState);

#[async_trait::async_trait]
impl TenantLimits for MissingTenantLimits {
    async fn ensure(&self, tenant: &TenantRecord) -> Result<(), String> {
        let state = self.0.upgrade().ok_or("the server is stopping")?;
        define_missing(&state, tenant, None).await.map(|_| ())
    }
}
