//! Limit definitions at runtime (`decisions.md` §6): validate, compute the next
//! state, persist it, then apply it to the backend, one change at a time.
//!
//! One async mutex serializes every change, the periodic decrease task included,
//! so the state a change starts from is the one the backend holds. The registry is
//! written before the backend changes and before the answer, so an answered PUT
//! survives a crash.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use ratelimiter::registry::Registry;
use ratelimiter::{Backend, DefinitionError, LimitDefinition, LimitKey, LimitReport, LimitState, LimiterError};
use tokio::sync::Mutex as AsyncMutex;

use crate::body::JsonBody;
use crate::error::ApiError;
use crate::state::AppState;

/// The registry and the changes applied to the backend but not yet persisted.
pub struct Admin {
    backend: Arc<dyn Backend>,
    /// Written only from blocking tasks, under `unpersisted`'s lock.
    registry: Arc<Mutex<Registry>>,
    /// Serializes changes. Holds decreases the backend carried out whose
    /// persistence failed, retried on every decrease check.
    unpersisted: AsyncMutex<BTreeMap<LimitKey, LimitState>>,
}

impl Admin {
    /// Wraps the opened registry.
    pub fn new(backend: Arc<dyn Backend>, registry: Registry) -> Self {
        Self {
            backend,
            registry: Arc::new(Mutex::new(registry)),
            unpersisted: AsyncMutex::new(BTreeMap::new()),
        }
    }

    /// Applies every persisted state to the backend, decreasing ones included: the
    /// startup step that makes limits survive a restart. Returns how many.
    pub async fn restore(&self) -> Result<usize, LimiterError> {
        let _changes = self.unpersisted.lock().await;
        let states: Vec<LimitState> = self.registry.lock().expect("registry lock").states().cloned().collect();
        for state in &states {
            self.backend.apply_state(state).await?;
        }
        Ok(states.len())
    }

    /// Defines a limit: the state it leads to is persisted, then applied.
    pub async fn define(&self, definition: LimitDefinition) -> Result<LimitReport, ApiError> {
        let mut unpersisted = self.unpersisted.lock().await;
        let key = definition.key().clone();
        let previous = self.backend.limit_report(&key).await?.map(|r| r.state);
        let next = LimitState::after_definition(previous.as_ref(), definition).map_err(|e| match e {
            DefinitionError::KindChange { .. } => ApiError::Conflict(e.to_string()),
            DefinitionError::Invalid(message) => ApiError::InvalidRequest(message),
        })?;
        let persisted = self.registry.lock().expect("registry lock").get(&key) == Some(&next);
        if !persisted {
            self.persist(next.clone()).await?;
        }
        // The persisted state supersedes any decrease still waiting to be persisted.
        unpersisted.remove(&key);
        self.backend.apply_state(&next).await?;
        tracing::info!(%key, status = ?next.status(), capacity = next.definition().capacity(),
            pending_decrease_to = next.pending_decrease_to(), "limit defined");
        let report = self.backend.limit_report(&key).await?;
        Ok(report.unwrap_or(LimitReport {
            state: next,
            in_use: 0,
            debt: 0,
        }))
    }

    /// Carries out the pending decreases usage now allows and persists them.
    /// Returns how many decreases were carried out.
    pub async fn apply_pending_decreases(&self) -> Result<usize, ApiError> {
        let mut unpersisted = self.unpersisted.lock().await;
        let changed = self.backend.apply_pending_decreases().await?;
        let count = changed.len();
        for state in changed {
            tracing::info!(key = %state.definition().key(), capacity = state.definition().capacity(),
                "capacity decrease carried out");
            unpersisted.insert(state.definition().key().clone(), state);
        }
        while let Some((key, state)) = unpersisted.pop_first() {
            if let Err(e) = self.persist(state.clone()).await {
                tracing::error!(%key, error = %e, "could not persist a carried-out decrease; will retry");
                unpersisted.insert(key, state);
                break;
            }
        }
        Ok(count)
    }

    /// Writes one state to the registry file on a blocking thread.
    async fn persist(&self, state: LimitState) -> Result<(), ApiError> {
        let registry = self.registry.clone();
        let result = tokio::task::spawn_blocking(move || registry.lock().expect("registry lock").put(state))
            .await
            .map_err(|e| ApiError::Internal(format!("registry task failed: {e}")))?;
        result.map_err(|e| ApiError::Internal(e.to_string()))
    }
}

/// `PUT /v1/admin/limits`: 200 with the stored state and its usage.
///
/// The change runs in its own task, so a request timeout or a client that hangs
/// up cannot stop it between persisting and applying.
pub async fn put_limit(State(state): State<AppState>, JsonBody(definition): JsonBody<LimitDefinition>) -> Response {
    let key = definition.key().clone();
    let change = tokio::spawn(async move { state.admin().define(definition).await });
    match change.await {
        Ok(Ok(report)) => Json(report).into_response(),
        Ok(Err(e)) => e.into_response(),
        Err(e) => ApiError::Internal(format!("defining {key} failed: {e}")).into_response(),
    }
}

/// `GET /v1/admin/limits`: every state, ordered by key.
pub async fn list_limits(State(state): State<AppState>) -> Result<Json<Vec<LimitReport>>, ApiError> {
    Ok(Json(state.backend().limit_reports().await?))
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
