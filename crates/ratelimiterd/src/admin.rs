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
    Err(format!(
        "{key} is a budget in money, its owner's: a definition here would disagree with the tenant's or key's \
         record (its period, its alerts); change it with PATCH /v1/admin/gateway/tenants/<name> or \
         PATCH /v1/admin/gateway/keys/<id> and their `budgets` (the CLI's `ratelimiterd tenants update NAME --budget \
         USD/PERIOD` or `ratelimiterd keys update ID --budget USD/PERIOD`, PERIOD day, week, month or a window such \
         as 3600s), or in the configuration's budgets"
    ))
}

/// `PUT /v1/admin/limits`: 200 with the stored state and its usage; a budget
/// in money is refused ([`refuse_budget_key`]), a 400 before anything changes.
///
/// The change runs in its own task, so a request timeout or a client that hangs
/// up cannot stop it between persisting and applying.
///
/// A model limit of the gateway carries its classes' ceilings with it
/// (docs/gateway.md, "Classes"): they are checked before anything changes (a
/// capacity whose ceiling would hold nothing is a 400) and defined after it.
pub async fn put_limit(State(state): State<AppState>, JsonBody(definition): JsonBody<LimitDefinition>) -> Response {
    let key = definition.key().clone();
    if let Err(message) = refuse_budget_key(&key) {
        return ApiError::InvalidRequest(message).into_response();
    }
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
