//! Limit definitions at runtime (docs/decisions.md, "Definitions"): validate,
//! compute the next state, persist it, then apply it to the backend, one change
//! at a time; and the periodic step that carries out pending decreases.
//!
//! One async mutex serializes every change, the decrease step included, so the
//! state a change starts from is the one the backend holds. The registry is
//! written before the backend changes and before the caller is answered, so an
//! answered definition survives a crash.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use tokio::sync::Mutex as AsyncMutex;

use crate::definition::{LimitDefinition, LimitReport, LimitState};
use crate::error::LimiterError;
use crate::key::LimitKey;
use crate::limiter::Backend;
use crate::registry::Registry;

/// Why a definition or a decrease step failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AdminError {
    /// The backend refused or did not answer; mapped like any limiter error.
    #[error(transparent)]
    Limiter(#[from] LimiterError),
    /// The registry could not be written; nothing was applied. The detail is
    /// for logs only.
    #[error("registry: {0}")]
    Persist(String),
}

/// The registry and the backend together, and the changes applied to the
/// backend but not yet persisted.
pub struct Admin {
    backend: Arc<dyn Backend>,
    /// Written only from blocking tasks, under `unpersisted`'s lock.
    registry: Arc<Mutex<Registry>>,
    /// Serializes changes. Holds decreases the backend carried out whose
    /// persistence failed, retried on every decrease step.
    unpersisted: AsyncMutex<BTreeMap<LimitKey, LimitState>>,
}

impl std::fmt::Debug for Admin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Admin").finish_non_exhaustive()
    }
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
    pub async fn restore(&self) -> Result<usize, AdminError> {
        let _changes = self.unpersisted.lock().await;
        let states: Vec<LimitState> = self.registry.lock().expect("registry lock").states().cloned().collect();
        for state in &states {
            self.backend.apply_state(state).await?;
        }
        Ok(states.len())
    }

    /// Defines a limit: the state it leads to is persisted, then applied, then
    /// reported with its usage.
    pub async fn define(&self, definition: LimitDefinition) -> Result<LimitReport, AdminError> {
        let mut unpersisted = self.unpersisted.lock().await;
        let key = definition.key().clone();
        let next = self.backend.next_state(definition).await?;
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
    pub async fn apply_pending_decreases(&self) -> Result<usize, AdminError> {
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
    async fn persist(&self, state: LimitState) -> Result<(), AdminError> {
        let registry = self.registry.clone();
        let result = tokio::task::spawn_blocking(move || registry.lock().expect("registry lock").put(state))
            .await
            .map_err(|e| AdminError::Persist(format!("registry task failed: {e}")))?;
        result.map_err(|e| AdminError::Persist(e.to_string()))
    }
}
