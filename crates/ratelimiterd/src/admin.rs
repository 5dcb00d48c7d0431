//! The admin routes: define, list and get limits. The domain (validate,
//! persist, apply, decreases) is the library's [`ratelimiter::admin::Admin`];
//! these handlers only move JSON in and out.

use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use ratelimiter::{LimitDefinition, LimitKey, LimitReport};

use crate::body::JsonBody;
use crate::error::ApiError;
use crate::state::AppState;

/// Refuses a definition of a budget in money (`tenant:<name>:usd:<span>`,
/// `key:<id>:usd:<span>`, a model's, the gateway's: the gateway's
/// [`gateway::limits::budgets::is_budget_key`], the one predicate of the
/// server and the CLI): a budget is its owner's record (its period, its
/// alerts), and a limit written beside it would disagree with it.
pub fn refuse_budget_key(key: &LimitKey) -> Result<(), String> {
    if !gateway::limits::budgets::is_budget_key(key.as_str()) {
        return Ok(());
    }
    Err(owner_budget_refusal(key))
}

/// The refusal of a budget in money whose owner's record holds it: where it
/// changes instead.
fn owner_budget_refusal(key: &LimitKey) -> String {
    format!(
        "{key} is a budget in money, its owner's: a definition here would disagree with the tenant's or key's \
         record (its period, its alerts); change it with PATCH /v1/admin/gateway/tenants/<name> or \
         PATCH /v1/admin/gateway/keys/<id> and their `budgets` (the CLI's `ratelimiterd tenants update NAME --budget \
         USD/PERIOD` or `ratelimiterd keys update ID --budget USD/PERIOD`, PERIOD day, week, month or a window such \
         as 3600s), or in the configuration's budgets"
    )
}

/// A definition of a budget in money through `PUT /v1/admin/limits`, as it is
/// applied: a budget of the directory (a key's, or a tenant's made through the
/// admin API, `directory_tenant` says which names are) is its record's, and is
/// refused ([`refuse_budget_key`]); a budget of the configuration (the
/// gateway's, a model's, a configured tenant's) changes at runtime like any
/// limit, until the configuration is applied again, as long as it keeps the
/// span its key names (`usd:day` a calendar day, `usd:window3600` a rolling
/// hour), and it owes what it cannot hold (`overage: owe`) as every budget
/// does. Any other definition is returned as given.
pub fn budget_put(
    definition: LimitDefinition,
    directory_tenant: impl Fn(&str) -> bool,
) -> Result<LimitDefinition, String> {
    let key = definition.key().as_str();
    if !gateway::limits::budgets::is_budget_key(key) {
        return Ok(definition);
    }
    let tenant = key.strip_prefix("tenant:").and_then(|rest| rest.split(":usd:").next());
    if key.starts_with("key:") || tenant.is_some_and(&directory_tenant) {
        return Err(owner_budget_refusal(definition.key()));
    }
    let span = match definition.period() {
        Some(period) => ratelimiter::price::budget::BudgetSpan::Period(period),
        None => ratelimiter::price::budget::BudgetSpan::WindowSeconds(definition.window_seconds()),
    };
    let named =
        definition.kind() == ratelimiter::LimitKind::Rolling && key.ends_with(&format!(":{}", span.key_suffix()));
    if !named {
        return Err(format!(
            "{key} is a budget in money over the span its key names: give it `kind: rolling` with that period \
             (`period: day`, `week` or `month`) or window (`window_seconds` for `usd:window<seconds>`); it was \
             given a {} {span:?}",
            definition.kind()
        ));
    }
    Ok(gateway::limits::budget_key::as_budget(definition).expect("its key was found a budget's above"))
}

/// `PUT /v1/admin/limits`: 200 with the stored state and its usage; a budget
/// in money is refused when its owner's record holds it, and must keep its
/// span otherwise ([`budget_put`]), a 400 before anything changes.
///
/// The change runs in its own task, so a request timeout or a client that hangs
/// up cannot stop it between persisting and applying.
///
/// A model limit of the gateway carries its classes' ceilings with it
/// (docs/gateway.md, "Classes"): they are checked before anything changes (a
/// capacity whose ceiling would hold nothing is a 400) and defined after it.
pub async fn put_limit(State(state): State<AppState>, JsonBody(definition): JsonBody<LimitDefinition>) -> Response {
    let key = definition.key().clone();
    let directory = state.directory().cloned();
    let directory_tenant = |name: &str| {
        let tenant = directory.as_ref().and_then(|d| d.tenant(name));
        tenant.is_some_and(|t| t.source == ratelimiter::directory::Source::Api)
    };
    let definition = match budget_put(definition, directory_tenant) {
        Ok(definition) => definition,
        Err(message) => return ApiError::InvalidRequest(message).into_response(),
    };
    let ceilings = match state.gateway().map(|g| g.ceilings_over(&definition)) {
        Some(Err(message)) => return ApiError::InvalidRequest(message).into_response(),
        Some(Ok(ceilings)) => ceilings,
        None => Vec::new(),
    };
    let change = tokio::spawn(async move {
        let report = state.admin().define(definition).await?;
        for ceiling in ceilings {
            state.admin().define(ceiling).await?;
        }
        Ok::<_, ratelimiter::admin::AdminError>(report)
    });
    match change.await {
        Ok(Ok(report)) => Json(report).into_response(),
        Ok(Err(e)) => ApiError::from(e).into_response(),
        Err(e) => ApiError::Internal(format!("defining {key} failed: {e}")).into_response(),
    }
}

/// `GET /v1/admin/gateway/classes`: per model and class, calls admitted, denied
/// and queued and the wait's 99th percentile (docs/gateway.md, "Classes"); an
/// empty list without a gateway.
pub async fn gateway_classes(State(state): State<AppState>) -> Json<serde_json::Value> {
    let reports = state.gateway_metrics().map(|m| m.classes.reports()).unwrap_or_default();
    Json(serde_json::to_value(reports).expect("class reports serialize"))
}

/// `GET /v1/admin/servers`: the fleet's servers as the shared backend saw them
/// (docs/tigerbeetle-backend.md, "Servers of the fleet"): `{"servers": [...]}`,
/// first seen first; `{"servers": null}` on a backend that serves this process only.
pub async fn fleet_servers(State(state): State<AppState>) -> Result<Json<serde_json::Value>, ApiError> {
    let servers = state.backend().fleet_servers().await?;
    Ok(Json(serde_json::json!({ "servers": servers })))
}

/// `GET /v1/admin/limits`: every state, ordered by key.
pub async fn list_limits(State(state): State<AppState>) -> Result<Json<Vec<LimitReport>>, ApiError> {
    Ok(Json(state.backend().limit_reports().await?))
}

/// `GET /v1/admin/gateway/deployments`: every deployment of the gateway's models
/// (docs/gateway.md, "Pools"): calls admitted, denied and failed over, its breaker
/// and this server's pause; an empty list without a gateway.
pub async fn gateway_deployments(State(state): State<AppState>) -> Json<serde_json::Value> {
    Json(
        state
            .gateway_metrics()
            .map_or_else(|| serde_json::Value::Array(Vec::new()), |m| m.deployments_json()),
    )
}

/// `GET /v1/admin/limits/{key}`: one state, or 404.
///
/// A path that does not decode (`%FF`, an escape of invalid UTF-8) is a JSON
/// `invalid_request` like any other bad key, not axum's plain-text rejection.
pub async fn get_limit(
    State(state): State<AppState>,
    key: Result<Path<String>, PathRejection>,
) -> Result<Json<LimitReport>, ApiError> {
    let Path(key) = key.map_err(|e| ApiError::InvalidRequest(e.body_text()))?;
    let key = LimitKey::new(key).map_err(|e| ApiError::InvalidRequest(e.to_string()))?;
    match state.backend().limit_report(&key).await? {
        Some(report) => Ok(Json(report)),
        None => Err(ApiError::UnknownKey(key)),
    }
}
