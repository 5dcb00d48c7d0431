//! Limit definitions at runtime (docs/decisions.md, "Limit definitions"): validate,
//! compute the next state, persist it, then apply it to the backend, one change at a
//! time; and the periodic step that carries out pending decreases.
//!
//! One async mutex serializes every change, the decrease step included, so the
//! state a change starts from is the one the backend holds. The registry is
//! written before the backend changes and before the caller is answered, so an
//! answered definition survives a crash.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::Mutex as AsyncMutex;

use crate::base::metrics::{Metric, MetricValue};
use crate::limiting::limiter::Backend;
use crate::model::definition::{LimitDefinition, LimitReport, LimitState};
use crate::model::error::LimiterError;
use crate::model::key::LimitKey;
use crate::model::registry::Registry;

/// Why a definition or a decrease step failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AdminError {
    /// The backend refused or did not answer; mapped like any limiter error.
    #[error(transparent)]
    Limiter(#[from] LimiterError),
    /// The registry could not be written (a full or read-only disk);
    /// nothing was applied.
    #[error("registry: {detail}")]
    Persist {
        /// Why, short and without paths: a client may be told it.
        reason: String,
        /// The whole error, file included: for logs only.
        detail: String,
    },
}

/// The registry and the backend together, and the changes applied to the
/// backend but not yet persisted.
pub struct Admin {
    backend: Arc<dyn Backend>,
    /// Written only from blocking tasks, under `unpersisted`'s lock. `None`
    /// for a backend that keeps the definitions itself (TigerBeetle keeps
    /// them in the cluster, shared by a fleet): a file of one server's would
    /// only go stale.
    registry: Option<Arc<Mutex<Registry>>>,
    /// Serializes changes. Holds decreases the backend carried out whose
    /// persistence failed, retried on every decrease step.
    unpersisted: AsyncMutex<BTreeMap<LimitKey, LimitState>>,
    /// Registry writes that failed, definitions and decreases alike (a metric:
    /// a full or read-only disk shows here before anyone reads the logs).
    persist_failures: AtomicU64,
}

impl std::fmt::Debug for Admin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Admin").finish_non_exhaustive()
    }
}

impl Admin {
    /// Wraps the opened registry; pass `None` exactly when the backend keeps
    /// the definitions itself ([`Backend::keeps_definitions`]).
    pub fn new(backend: Arc<dyn Backend>, registry: Option<Registry>) -> Self {
        assert_eq!(
            registry.is_none(),
            backend.keeps_definitions(),
            "a registry file exactly for backends that do not keep definitions"
        );
        Self {
            backend,
            registry: registry.map(|r| Arc::new(Mutex::new(r))),
            unpersisted: AsyncMutex::new(BTreeMap::new()),
            persist_failures: AtomicU64::new(0),
        }
    }

    /// The registry's metrics: none for a backend that keeps the definitions.
    pub fn metrics(&self) -> Vec<Metric> {
        if self.registry.is_none() {
            return Vec::new();
        }
        vec![Metric {
            name: "registry_persist_failures_total",
            help: "Registry file writes that failed (full or read-only disk): the PUT was refused, or a carried-out decrease waits to be written.",
            value: MetricValue::Counter(self.persist_failures.load(Ordering::Relaxed)),
        }]
    }

    /// The startup step that makes limits survive a restart: applies every
    /// persisted state to the backend, decreasing ones included, or brings a
    /// backend that keeps the definitions up to date. Returns how many limits
    /// are defined.
    pub async fn restore(&self) -> Result<usize, AdminError> {
        let _changes = self.unpersisted.lock().await;
        let Some(registry) = &self.registry else {
            return match self.backend.refresh_definitions().await {
                Ok(()) => Ok(self.backend.limit_reports().await?.len()),
                // The cluster may come up after the server: requests answer 503
                // until it does, and the definitions are read on the way.
                Err(LimiterError::Unavailable { .. }) => {
                    tracing::warn!("the definitions could not be read yet; they will be on the next refresh");
                    Ok(0)
                }
                Err(e) => Err(e.into()),
            };
        };
        let states: Vec<LimitState> = registry.lock().expect("registry lock").states().cloned().collect();
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
        let persisted = match &self.registry {
            Some(registry) => registry.lock().expect("registry lock").get(&key) == Some(&next),
            None => false,
        };
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
            owing: false,
        }))
    }

    /// Defines every state of a registry file written before the backend kept
    /// the definitions itself, for keys the backend does not know: the one-time
    /// move of a server's limits into a fleet's cluster. Returns how many.
    pub async fn import(&self, states: Vec<LimitState>) -> Result<usize, AdminError> {
        let _changes = self.unpersisted.lock().await;
        let mut imported = 0;
        for state in states {
            if self.backend.limit_report(state.definition().key()).await?.is_some() {
                continue;
            }
            if state.status() == crate::model::definition::LimitStatus::Decreasing {
                // The capacity in force first, so that the decrease stays one.
                let in_force = LimitState::active(state.definition().clone());
                self.backend.apply_state(&in_force).await?;
            }
            self.backend.apply_state(&state).await?;
            imported += 1;
        }
        Ok(imported)
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

    /// Writes one state to the registry file on a blocking thread; nothing
    /// to do for a backend that keeps the definitions itself.
    async fn persist(&self, state: LimitState) -> Result<(), AdminError> {
        let Some(registry) = self.registry.clone() else {
            return Ok(());
        };
        let result = tokio::task::spawn_blocking(move || registry.lock().expect("registry lock").put(state))
            .await
            .map_err(|e| AdminError::Persist {
                reason: "the write failed".to_owned(),
                detail: format!("registry task failed: {e}"),
            })
            .and_then(|written| {
                written.map_err(|e| AdminError::Persist {
                    reason: e.reason(),
                    detail: e.to_string(),
                })
            });
        if result.is_err() {
            self.persist_failures.fetch_add(1, Ordering::Relaxed);
        }
        result
    }
}
