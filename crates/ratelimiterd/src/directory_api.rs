//! The admin routes of the gateway's tenants and keys (docs/http-api.md,
//! "Tenants and keys"). The domain (validation, durability, the fleet) is the
//! library's [`ratelimiter::directory::Directory`]; these handlers read the
//! fields, check them against the gateway's configuration, define a key's own
//! limits, and shape the answers. Served only where the console would be:
//! with `server.admin_token`, or on a loopback listener (nobody on the
//! network mints keys on a server without a token).

use axum::extract::rejection::PathRejection;
use axum::extract::{Path, Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;
use ratelimiter::directory::{
    CreatedKey, Directory, KeyLimits, KeySpec, KeyStatus, TenantFields, TenantPatch, TenantRecord,
};
use ratelimiter::price::budget::BudgetConfig;
use serde_json::{json, Value};

use crate::console::access::Access;
use crate::directory_body::Fields;
use crate::error::ApiError;
use crate::state::AppState;

/// Refuses every tenant and key route where the console is off (no admin
/// token on a listener beyond loopback), and before the directory is open.
pub async fn served(State(state): State<AppState>, request: Request, next: Next) -> Response {
    if state.console().access() == Access::Off || state.directory().is_none() {
        let path = request.uri().path().to_owned();
        return ApiError::RouteNotFound(format!(
            "{path} (tenants and keys are served with server.admin_token set, or on a loopback listener)"
        ))
        .into_response();
    }
    next.run(request).await
}

fn directory(state: &AppState) -> &std::sync::Arc<Directory> {
    state.directory().expect("checked by `served`")
}

fn path_name(path: Result<Path<String>, PathRejection>) -> Result<String, ApiError> {
    path.map(|Path(name)| name)
        .map_err(|e| ApiError::InvalidRequest(e.body_text()))
}

/// A tenant as the API shows it; times in Unix seconds, `null` for the YAML's.
pub fn tenant_json(tenant: &TenantRecord) -> Value {
    let f = &tenant.fields;
    let seconds = |ms: u64| (ms > 0).then_some(ms / 1_000);
    json!({
        "name": tenant.name,
        "source": tenant.source,
        "class": f.class,
        "rpm": f.rpm,
        "concurrency": f.concurrency,
        "daily_tokens": f.daily_tokens,
        "connections_max": f.connections_max,
        "queued_max": f.queued_max,
        "models": f.models,
        "budgets": f.budgets,
        "created_at": seconds(tenant.created_at_unix_ms),
        "updated_at": seconds(tenant.updated_at_unix_ms),
    })
}

fn tenant_fields(fields: &mut Fields) -> Result<TenantFields, ApiError> {
    Ok(TenantFields {
        class: fields.take("class")?,
        rpm: fields.take("rpm")?,
        concurrency: fields.take("concurrency")?,
        daily_tokens: fields.take("daily_tokens")?,
        connections_max: fields.take("connections_max")?,
        queued_max: fields.take("queued_max")?,
        models: fields.take("models")?,
        budgets: fields.take("budgets")?,
    })
}

/// `POST /v1/admin/gateway/tenants`: 201 with the tenant; 409 for a name in use.
pub async fn create_tenant(State(state): State<AppState>, mut fields: Fields) -> Result<Response, ApiError> {
    let name: String = fields.require("name")?;
    let tenant = tenant_fields(&mut fields)?;
    fields.finish()?;
    state.gateway_scope().check_class(tenant.class.as_deref())?;
    state.gateway_scope().check_models(tenant.models.as_deref(), None)?;
    check_priced(&state, "budgets", tenant.budgets.as_deref(), tenant.models.as_deref())?;
    // In its own task: a client hanging up cannot stop it between the tenant and its limits.
    let change = tokio::spawn(async move {
        let directory = directory(&state).clone();
        let created = directory.create_tenant(&name, tenant).await?;
        if let Err(e) = define_tenant_limits(&state, &created).await {
            let _ = directory.delete_tenant(&created.name).await;
            return Err(e);
        }
        Ok::<_, ApiError>(created)
    });
    let created = change
        .await
        .map_err(|e| ApiError::Internal(format!("creating a tenant failed: {e}")))??;
    Ok((StatusCode::CREATED, Json(tenant_json(&created))).into_response())
}

/// Refuses budgets on a tenant or key that may call a model without a price
/// (`models`; `None`: every model): a budget counts each call's cost, and a
/// call of an unpriced model under a budget could only fail. A 400 naming
/// the model, before anything changes.
/// `field` names the budgets in the answer (`budgets`, `key <id>: budgets`).
fn check_priced(
    state: &AppState,
    field: &str,
    budgets: Option<&[BudgetConfig]>,
    models: Option<&[String]>,
) -> Result<(), ApiError> {
    let (Some(gateway), false) = (state.gateway(), budgets.unwrap_or_default().is_empty()) else {
        return Ok(());
    };
    let unpriced = (gateway.prices().into_iter())
        .filter(|d| d.price.is_none())
        .find(|d| models.is_none_or(|m| m.contains(&d.model)));
    match unpriced {
        None => Ok(()),
        Some(d) => Err(ApiError::InvalidRequest(format!(
            "{field}: model {} (deployment {}) has no price: a budget counts every call's cost, so each model \
             the tenant or key may call needs one; give it a price in gateway.models, or narrow `models`",
            d.model, d.deployment
        ))),
    }
}

/// [`check_priced`] of each working key of `tenant` with budgets and no
/// models of its own: the tenant's `models` are its, so a change of them may
/// widen what such a key's budget counts.
fn check_keys_priced(state: &AppState, tenant: &TenantRecord) -> Result<(), ApiError> {
    let keys = directory(state).keys(Some(&tenant.name));
    let working = keys
        .iter()
        .filter(|k| k.status == KeyStatus::Active && k.models.is_none());
    for key in working {
        let field = format!("key {}: budgets", key.id);
        check_priced(
            state,
            &field,
            key.limits.budgets.as_deref(),
            tenant.fields.models.as_deref(),
        )?;
    }
    Ok(())
}

/// Defines the tenant's own limits (`tenant:<name>:llm:rpm`, …) as a
/// configured tenant's are: the gateway reserves them on its every call.
async fn define_tenant_limits(state: &AppState, tenant: &TenantRecord) -> Result<(), ApiError> {
    let hold_seconds = state.gateway_scope().concurrency_hold_seconds();
    for definition in gateway::limits::directory_tenant_definitions(tenant, hold_seconds) {
        state.admin().define(definition).await?;
    }
    Ok(())
}

/// `GET /v1/admin/gateway/tenants`: every live tenant, the YAML's included, by name.
pub async fn list_tenants(State(state): State<AppState>) -> Json<Value> {
    Json(directory(&state).tenants().iter().map(tenant_json).collect())
}

/// `GET /v1/admin/gateway/tenants/{name}`.
pub async fn get_tenant(
    State(state): State<AppState>,
    name: Result<Path<String>, PathRejection>,
) -> Result<Json<Value>, ApiError> {
    let name = path_name(name)?;
    let tenant = directory(&state).tenant(&name);
    tenant
        .map(|t| Json(tenant_json(&t)))
        .ok_or_else(|| unknown_tenant(&name))
}

fn unknown_tenant(name: &str) -> ApiError {
    ApiError::UnknownRecord(format!("unknown tenant {name}"))
}

/// `PATCH /v1/admin/gateway/tenants/{name}`: the fields given replace, `null` clears.
pub async fn update_tenant(
    State(state): State<AppState>,
    name: Result<Path<String>, PathRejection>,
    mut fields: Fields,
) -> Result<Json<Value>, ApiError> {
    let name = path_name(name)?;
    let patch = TenantPatch {
        class: fields.take_patch("class")?,
        rpm: fields.take_patch("rpm")?,
        concurrency: fields.take_patch("concurrency")?,
        daily_tokens: fields.take_patch("daily_tokens")?,
        connections_max: fields.take_patch("connections_max")?,
        queued_max: fields.take_patch("queued_max")?,
        models: fields.take_patch("models")?,
        budgets: fields.take_patch("budgets")?,
    };
    fields.finish()?;
    state
        .gateway_scope()
        .check_class(patch.class.clone().flatten().as_deref())?;
    state
        .gateway_scope()
        .check_models(patch.models.clone().flatten().as_deref(), None)?;
    // The limits the change sets are defined before the tenant names them, so
    // no call meets a limit not defined yet.
    let current = directory(&state).tenant(&name).ok_or_else(|| unknown_tenant(&name))?;
    if current.source == ratelimiter::directory::Source::Api {
        let next = TenantRecord {
            fields: patch.applied_to(&current.fields)?,
            ..current
        };
        check_priced(
            &state,
            "budgets",
            next.fields.budgets.as_deref(),
            next.fields.models.as_deref(),
        )?;
        check_keys_priced(&state, &next)?;
        define_tenant_limits(&state, &next).await?;
    }
    let updated = directory(&state).update_tenant(&name, &patch).await?;
    define_tenant_limits(&state, &updated).await?;
    Ok(Json(tenant_json(&updated)))
}

/// `DELETE /v1/admin/gateway/tenants/{name}`: the tenant and its keys, revoked with it.
pub async fn delete_tenant(
    State(state): State<AppState>,
    name: Result<Path<String>, PathRejection>,
) -> Result<Json<Value>, ApiError> {
    let name = path_name(name)?;
    let (tenant, keys_revoked) = directory(&state).delete_tenant(&name).await?;
    Ok(Json(
        json!({"deleted": tenant_json(&tenant), "keys_revoked": keys_revoked}),
    ))
}

/// The 201 of a key created or rotated: the key's text, this once.
fn created_json(created: &CreatedKey) -> Value {
    let record = &created.record;
    json!({
        "id": record.id,
        "key": created.key.text,
        "tenant": record.tenant,
        "name": record.name,
        "models": record.models,
        "rpm": record.limits.rpm,
        "concurrency": record.limits.concurrency,
        "daily_tokens": record.limits.daily_tokens,
        "budgets": record.limits.budgets,
        "hint": format!("…{}", record.hint),
        "created_at": record.created_at_unix_ms / 1_000,
        "expires_at": record.expires_at_unix_ms.map(|ms| ms / 1_000),
    })
}

/// `POST /v1/admin/gateway/keys`: 201 with the key, shown this once; 404
/// for an unknown tenant. The key's own limits are defined right after it
/// (`key:<id>:llm:rpm`, …; `key_limits.rs`: from its record, with no write
/// of the registry file on the memory backend); if that fails, the key is
/// revoked and the answer is the failure.
pub async fn create_key(State(state): State<AppState>, mut fields: Fields) -> Result<Response, ApiError> {
    let spec = KeySpec {
        tenant: fields.require("tenant")?,
        name: fields.take("name")?.unwrap_or_default(),
        models: fields.take("models")?,
        expires_in_seconds: fields.take("expires_in_seconds")?,
        limits: KeyLimits {
            rpm: fields.take("rpm")?,
            concurrency: fields.take("concurrency")?,
            daily_tokens: fields.take("daily_tokens")?,
            budgets: fields.take("budgets")?,
        },
    };
    fields.finish()?;
    spec.validate()?;
    let directory = directory(&state).clone();
    let tenant = directory
        .tenant(&spec.tenant)
        .ok_or_else(|| unknown_tenant(&spec.tenant))?;
    state
        .gateway_scope()
        .check_models(spec.models.as_deref(), tenant.fields.models.as_deref())?;
    let key_models = spec.models.as_deref().or(tenant.fields.models.as_deref());
    check_priced(&state, "budgets", spec.limits.budgets.as_deref(), key_models)?;
    // In its own task: a client hanging up cannot stop it between the key and its limits.
    let change = tokio::spawn(async move {
        let created = directory.create_key(&spec).await?;
        if let Err(e) = crate::key_limits::define_new(&state, &created.record).await {
            let _ = directory.revoke_key(&created.record.id).await;
            return Err(e);
        }
        Ok::<_, ApiError>(created)
    });
    let created = change
        .await
        .map_err(|e| ApiError::Internal(format!("creating a key failed: {e}")))??;
    Ok((StatusCode::CREATED, Json(created_json(&created))).into_response())
}

/// The `tenant` of a key list's query (`?tenant=<name>`), the only parameter
/// known. Tenant names need no escaping, so the value is taken as written (a
/// name with escapes names no tenant).
fn tenant_filter(query: Option<&str>) -> Result<Option<&str>, ApiError> {
    let mut tenant = None;
    for pair in query.unwrap_or_default().split('&').filter(|p| !p.is_empty()) {
        match pair.split_once('=') {
            Some(("tenant", value)) if tenant.is_none() => tenant = Some(value),
            _ => {
                let name = pair.split('=').next().unwrap_or_default();
                return Err(ApiError::InvalidRequest(format!(
                    "{name}: unknown or repeated query parameter"
                )));
            }
        }
    }
    Ok(tenant)
}

/// `GET /v1/admin/gateway/keys[?tenant=]`: keys by id, never their text or hash.
pub async fn list_keys(State(state): State<AppState>, uri: axum::http::Uri) -> Result<Json<Value>, ApiError> {
    let tenant = tenant_filter(uri.query())?;
    let keys = directory(&state).keys(tenant);
    Ok(Json(serde_json::to_value(keys).expect("key views serialize")))
}

/// `GET /v1/admin/gateway/keys/{id}`.
pub async fn get_key(
    State(state): State<AppState>,
    id: Result<Path<String>, PathRejection>,
) -> Result<Json<Value>, ApiError> {
    let id = path_name(id)?;
    let view = directory(&state).key_view(&id).ok_or_else(|| unknown_key(&id))?;
    Ok(Json(serde_json::to_value(view).expect("a key view serializes")))
}

/// The length of a key's id: a ULID (`directory/service.rs`, `new_id`).
const KEY_ID_CHARS: usize = 26;
/// The characters of a key's text shown, at most, where it was given in
/// place of an id: as many as the key's hint shows.
const SHOWN_SECRET_CHARS: usize = 4;

/// Whether `id` is shaped as a key's id (a ULID), so it may be shown and sent.
pub fn is_key_id(id: &str) -> bool {
    id.len() == KEY_ID_CHARS && id.bytes().all(|b| b.is_ascii_digit() || b.is_ascii_uppercase())
}

/// `id` as an answer may show it: a key's id as it is; anything else (a
/// key's secret text given in place of its id, most likely) never whole,
/// only its last [`SHOWN_SECRET_CHARS`] characters.
pub fn shown_key_id(id: &str) -> String {
    if is_key_id(id) {
        return id.to_owned();
    }
    let chars: Vec<char> = id.chars().collect();
    let last: String = chars[chars.len().saturating_sub(SHOWN_SECRET_CHARS)..].iter().collect();
    format!("…{last} (not a key id: a key is named by its id, as `GET /v1/admin/gateway/keys` lists them, never by its text)")
}

/// The 404 of a key id no key has; its text never echoed ([`shown_key_id`]).
fn unknown_key(id: &str) -> ApiError {
    ApiError::UnknownRecord(format!("unknown key {}", shown_key_id(id)))
}

/// The library's refusal of a key operation on `id`, its unknown key's
/// message built here so that a key's text given as `id` is never echoed.
fn key_refusal(id: &str, error: ratelimiter::directory::DirectoryError) -> ApiError {
    match error {
        ratelimiter::directory::DirectoryError::UnknownKey(_) => unknown_key(id),
        other => other.into(),
    }
}

/// `DELETE /v1/admin/gateway/keys/{id}`: revokes; 200 with the key, revoked.
pub async fn revoke_key(
    State(state): State<AppState>,
    id: Result<Path<String>, PathRejection>,
) -> Result<Json<Value>, ApiError> {
    let id = path_name(id)?;
    let directory = directory(&state);
    directory.revoke_key(&id).await.map_err(|e| key_refusal(&id, e))?;
    let view = directory.key_view(&id).ok_or_else(|| unknown_key(&id))?;
    Ok(Json(serde_json::to_value(view).expect("a key view serializes")))
}

/// The fields a key is created with that its PATCH does not change: they
/// make another key (its tenant, scope, life) or are its rates, set once.
const KEY_FIELDS_SET_AT_CREATION: [&str; 7] = [
    "tenant",
    "name",
    "models",
    "expires_in_seconds",
    "rpm",
    "concurrency",
    "daily_tokens",
];

/// `PATCH /v1/admin/gateway/keys/{id}` `{"budgets": [...]}`: replaces the
/// key's budgets (`null` or `[]`: none); 200 with the key. The budgets'
/// limits are defined before the key names them, so no call meets one
/// undefined; a bad budget, a model without a price, or another field is a
/// 400 naming it, and nothing changes.
pub async fn update_key(
    State(state): State<AppState>,
    id: Result<Path<String>, PathRejection>,
    mut fields: Fields,
) -> Result<Json<Value>, ApiError> {
    let id = path_name(id)?;
    let budgets: Option<Option<Vec<BudgetConfig>>> = fields.take_patch("budgets")?;
    for name in KEY_FIELDS_SET_AT_CREATION {
        if fields.take_patch::<Value>(name)?.is_some() {
            return Err(ApiError::InvalidRequest(format!(
                "{name}: set at the key's creation; a key's PATCH changes its budgets only (rotate or create a key \
                 for another scope or life)"
            )));
        }
    }
    fields.finish()?;
    let budgets = budgets.ok_or_else(|| {
        ApiError::InvalidRequest("budgets: is required (a key's PATCH changes its budgets only)".to_owned())
    })?;
    let directory = directory(&state).clone();
    let key = directory.key(&id).ok_or_else(|| unknown_key(&id))?;
    match directory.key_view(&id).map(|v| v.status) {
        Some(KeyStatus::Active) => {}
        status => {
            let status = serde_json::to_value(status).expect("a status serializes");
            return Err(ApiError::from(ratelimiter::directory::DirectoryError::Conflict(
                format!("key {id} is {status}: only a working key's budgets are changed"),
            )));
        }
    }
    let limits = KeyLimits {
        budgets: budgets.filter(|b| !b.is_empty()),
        ..key.limits.clone()
    };
    KeySpec {
        limits: limits.clone(),
        ..Default::default()
    }
    .validate()?;
    let tenant_models = directory.tenant(&key.tenant).and_then(|t| t.fields.models);
    let key_models = key.models.as_deref().or(tenant_models.as_deref());
    check_priced(&state, "budgets", limits.budgets.as_deref(), key_models)?;
    // In its own task: a client hanging up cannot stop it between the limits and the key.
    let change = tokio::spawn(async move {
        let next = ratelimiter::directory::KeyRecord {
            limits: limits.clone(),
            ..key.clone()
        };
        crate::key_limits::define_budgets(&state, &next).await?;
        if let Err(e) = directory.update_key_limits(&id, &limits).await {
            // The record did not change: its budgets are defined back as it says.
            if let Err(undo) = crate::key_limits::define_budgets(&state, &key).await {
                tracing::error!(key_id = %key.id, error = %undo,
                    "gateway: a key's budgets could not be defined back after its change failed; the next start does");
            }
            return Err(key_refusal(&id, e));
        }
        directory.key_view(&id).ok_or_else(|| unknown_key(&id))
    });
    let view = change
        .await
        .map_err(|e| ApiError::Internal(format!("changing a key failed: {e}")))??;
    Ok(Json(serde_json::to_value(view).expect("a key view serializes")))
}

/// `POST /v1/admin/gateway/keys/{id}/rotate` `{"grace_seconds"}` (default 0):
/// 201 with the new key; the old one works until the grace ends.
pub async fn rotate_key(
    State(state): State<AppState>,
    id: Result<Path<String>, PathRejection>,
    mut fields: Fields,
) -> Result<Response, ApiError> {
    let id = path_name(id)?;
    let grace_seconds: u64 = fields.take("grace_seconds")?.unwrap_or(0);
    fields.finish()?;
    let created = (directory(&state).rotate_key(&id, grace_seconds).await).map_err(|e| key_refusal(&id, e))?;
    let mut body = created_json(&created);
    let old = directory(&state).key(&id).ok_or_else(|| unknown_key(&id))?;
    body["replaces"] = json!({"id": id, "expires_at": old.expires_at_unix_ms.map(|ms| ms / 1_000)});
    Ok((StatusCode::CREATED, Json(body)).into_response())
}
