//! The two interfaces every backend implements: [`Limiter`] for callers that
//! reserve and complete, [`Backend`] for the server that also defines limits.

use async_trait::async_trait;

use crate::model::definition::{LimitDefinition, LimitReport, LimitState};
use crate::model::error::LimiterError;
use crate::model::key::LimitKey;
use crate::model::wire::{CompleteRequest, ReserveOutcome, ReserveRequest};

/// Reserve capacity before a call and complete it after.
///
/// Implemented by the memory backend (single-binary mode), the TigerBeetle
/// backend and the HTTP client (distributed mode); usable as `Arc<dyn Limiter>`.
#[async_trait]
pub trait Limiter: Send + Sync {
    /// Reserves every requirement or none. A denial is `Ok(Denied(..))`; `Err` is
    /// an operating error (unknown key, backend down).
    async fn reserve(&self, request: &ReserveRequest) -> Result<ReserveOutcome, LimiterError>;

    /// Releases the lease's concurrency holds and reconciles rolling limits with
    /// the actual usage. Idempotent: an unknown or completed lease is `Ok`.
    async fn complete(&self, request: &CompleteRequest) -> Result<(), LimiterError>;
}

/// A store of limits: a [`Limiter`] whose limits are defined at runtime.
#[async_trait]
pub trait Backend: Limiter {
    /// Makes the backend hold exactly `state` for its key: creates the limit,
    /// changes its capacity, or starts a decrease. The caller computes `state`
    /// with [`LimitState::after_definition`], so a decrease is never applied at once.
    async fn apply_state(&self, state: &LimitState) -> Result<(), LimiterError>;

    /// The state and usage of one limit, `None` when the key is not defined.
    async fn limit_report(&self, key: &LimitKey) -> Result<Option<LimitReport>, LimiterError>;

    /// What a new reservation of `key` can take now, as its report says it
    /// ([`LimitReport::available`]); `None` when the key is not defined. A
    /// backend that can tell it without copying the limit's state says so
    /// here: a call with a budget reads it for its answer's headers.
    async fn limit_available(&self, key: &LimitKey) -> Result<Option<u64>, LimiterError> {
        Ok(self.limit_report(key).await?.map(|report| report.available()))
    }

    /// The states and usage of every limit, ordered by key.
    async fn limit_reports(&self) -> Result<Vec<LimitReport>, LimiterError>;

    /// Carries out every pending decrease that usage now allows and returns the
    /// states that changed, so the caller can persist them.
    async fn apply_pending_decreases(&self) -> Result<Vec<LimitState>, LimiterError>;

    /// Milliseconds until `key` next gets a held unit back (a hold ends, a
    /// bucket refills): what an operator watching a full limit waits for.
    /// `None` when nothing is held, the key is unknown, or the backend cannot
    /// tell without a costly read (the default).
    async fn next_release_ms(&self, _key: &LimitKey) -> Result<Option<u64>, LimiterError> {
        Ok(None)
    }

    /// Names this server to a backend shared by a fleet (its host `name` and the
    /// `address` its API listens on), so that the others list it; a backend that
    /// serves one process ignores it (the default).
    fn name_server(&self, _name: &str, _address: &str) -> Result<(), LimiterError> {
        Ok(())
    }

    /// The servers of the fleet as the backend saw them (on TigerBeetle, the
    /// servers that announced themselves or wrote definitions); `None` on a
    /// backend that serves one process (the default).
    async fn fleet_servers(&self) -> Result<Option<Vec<FleetServer>>, LimiterError> {
        Ok(None)
    }

    /// `Ok` when the backend answers.
    async fn health(&self) -> Result<(), LimiterError>;

    /// Why the backend is unhealthy now, in words for an operator (`/healthz`
    /// shows it with its 503); `None` when it has nothing to add to what its
    /// health check met (the default).
    fn unhealthy_reason(&self) -> Option<String> {
        None
    }

    /// Whether the backend keeps the definitions itself (the TigerBeetle
    /// backend keeps them in the cluster, shared by a fleet); when false, the
    /// caller persists them ([`crate::admin::Admin`] writes the registry file).
    fn keeps_definitions(&self) -> bool {
        false
    }

    /// Brings the backend's view of definitions kept elsewhere up to date;
    /// nothing to do for a backend that holds them in process.
    async fn refresh_definitions(&self) -> Result<(), LimiterError> {
        Ok(())
    }

    /// The state `definition` leads to from the key's current one: the one rule for every
    /// way of defining a limit (docs/decisions.md, "Limit definitions"). An invalid
    /// definition is `InvalidRequest`, a kind change `Conflict`.
    async fn next_state(&self, definition: LimitDefinition) -> Result<LimitState, LimiterError> {
        let previous = self.limit_report(definition.key()).await?.map(|r| r.state);
        Ok(LimitState::after_definition(previous.as_ref(), definition)?)
    }

    /// Defines `definition`: the state it leads to from the current one, applied.
    /// The server persists the state in between ([`crate::admin::Admin::define`]).
    async fn apply_definition(&self, definition: &LimitDefinition) -> Result<LimitState, LimiterError> {
        let next = self.next_state(definition.clone()).await?;
        self.apply_state(&next).await?;
        Ok(next)
    }
}

/// One server of a fleet as the shared backend saw it: what an operator reads
/// to know which servers share the limits (docs/tigerbeetle-backend.md,
/// "Servers of the fleet").
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct FleetServer {
    /// Its host's name (empty until its announce is read).
    pub name: String,
    /// The address of its API.
    pub address: String,
    /// Its version.
    pub version: String,
    /// When the cluster first saw it (its first announce or record), Unix ms.
    pub first_seen_unix_ms: u64,
    /// When the cluster last saw it (its last start or record), Unix ms.
    pub last_seen_unix_ms: u64,
    /// Its starts (announces).
    pub starts: u64,
    /// The definition records it wrote.
    pub records_written: u64,
}
