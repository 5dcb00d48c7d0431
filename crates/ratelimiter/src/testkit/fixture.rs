//! One scenario's backend, keys and the helpers the scenarios share.

use std::sync::Arc;

use crate::base::id::LeaseId;
use crate::limiting::limiter::Backend;
use crate::model::definition::{LimitDefinition, LimitReport, LimitState, Overage};
use crate::model::error::LimiterError;
use crate::model::key::LimitKey;
use crate::model::wire::{Actual, CompleteRequest, Requirement, ReserveOutcome, ReserveRequest};

use super::Harness;

/// How often a scenario polls a backend whose expiry lags, in ms.
const POLL_MS: u64 = 100;

/// A scenario's view of the backend: keys under a unique prefix, shorthand for
/// requests, and waits bounded by the harness's expiry slack.
pub struct Fixture<'h> {
    harness: &'h dyn Harness,
    /// The backend under test.
    pub backend: Arc<dyn Backend>,
    prefix: String,
}

impl<'h> Fixture<'h> {
    /// A fixture on a fresh backend and prefix from `harness`.
    pub async fn new(harness: &'h dyn Harness) -> Self {
        Self {
            backend: harness.backend().await,
            prefix: harness.unique_prefix(),
            harness,
        }
    }

    /// A fixture on `backend` (a backend the caller built, to inspect it beyond
    /// the trait) with a fresh prefix from `harness`, whose clock it must share.
    pub fn with_backend(harness: &'h dyn Harness, backend: Arc<dyn Backend>) -> Self {
        Self {
            backend,
            prefix: harness.unique_prefix(),
            harness,
        }
    }

    /// The harness.
    pub fn harness(&self) -> &dyn Harness {
        self.harness
    }

    /// The scenario's key `name`.
    pub fn key(&self, name: &str) -> LimitKey {
        LimitKey::new(format!("{}:{name}", self.prefix)).expect("test keys are valid")
    }

    /// Defines `definition` and returns the state it led to.
    pub async fn define(&self, definition: LimitDefinition) -> LimitState {
        self.backend
            .apply_definition(&definition)
            .await
            .unwrap_or_else(|e| panic!("defining {}: {e}", definition.key()))
    }

    /// Defines a rolling limit `name`.
    pub async fn rolling(&self, name: &str, capacity: u64, window_seconds: u64) -> LimitKey {
        self.rolling_with(name, capacity, window_seconds, Overage::None).await
    }

    /// Defines a rolling limit `name` with an overage policy.
    pub async fn rolling_with(&self, name: &str, capacity: u64, window_seconds: u64, overage: Overage) -> LimitKey {
        let definition = LimitDefinition::rolling(self.key(name), capacity, window_seconds)
            .expect("valid test definition")
            .with_overage(overage);
        self.define(definition).await;
        self.key(name)
    }

    /// Defines a concurrency limit `name`.
    pub async fn concurrency(&self, name: &str, capacity: u64, timeout_seconds: u64) -> LimitKey {
        let definition =
            LimitDefinition::concurrency(self.key(name), capacity, timeout_seconds).expect("valid test definition");
        self.define(definition).await;
        self.key(name)
    }

    /// Reserves `needs` under `lease`, failing the scenario on an error.
    pub async fn reserve(&self, lease: LeaseId, needs: &[(&LimitKey, u64)]) -> ReserveOutcome {
        self.try_reserve(lease, needs)
            .await
            .unwrap_or_else(|e| panic!("reserve {lease}: unexpected error {e}"))
    }

    /// Reserves `needs` under `lease`.
    pub async fn try_reserve(
        &self,
        lease: LeaseId,
        needs: &[(&LimitKey, u64)],
    ) -> Result<ReserveOutcome, LimiterError> {
        let requirements = needs
            .iter()
            .map(|&(key, amount)| Requirement {
                key: key.clone(),
                amount,
            })
            .collect();
        let request = ReserveRequest::new(lease, None, requirements).expect("valid test request");
        self.backend.reserve(&request).await
    }

    /// Reserves `needs` under a new lease and returns it with the outcome.
    pub async fn reserve_new(&self, needs: &[(&LimitKey, u64)]) -> (LeaseId, ReserveOutcome) {
        let lease = LeaseId::generate();
        (lease, self.reserve(lease, needs).await)
    }

    /// Completes `lease` with `actuals`.
    pub async fn try_complete(&self, lease: LeaseId, actuals: &[(&LimitKey, u64)]) -> Result<(), LimiterError> {
        let actuals = actuals
            .iter()
            .map(|&(key, actual_amount)| Actual {
                key: key.clone(),
                actual_amount,
            })
            .collect();
        let request = CompleteRequest::new(lease, None, actuals).expect("valid test request");
        self.backend.complete(&request).await
    }

    /// Completes `lease` with `actuals`, failing the scenario on an error.
    pub async fn complete(&self, lease: LeaseId, actuals: &[(&LimitKey, u64)]) {
        self.try_complete(lease, actuals)
            .await
            .unwrap_or_else(|e| panic!("complete {lease}: unexpected error {e}"));
    }

    /// The report of `key`, which must exist.
    pub async fn report(&self, key: &LimitKey) -> LimitReport {
        self.backend
            .limit_report(key)
            .await
            .unwrap_or_else(|e| panic!("report {key}: {e}"))
            .unwrap_or_else(|| panic!("report {key}: the limit is not defined"))
    }

    /// Units `key` holds now.
    pub async fn in_use(&self, key: &LimitKey) -> u64 {
        self.report(key).await.in_use
    }

    /// Asserts every key's `in_use`.
    pub async fn assert_in_use(&self, context: &str, expected: &[(&LimitKey, u64)]) {
        for &(key, units) in expected {
            assert_eq!(self.in_use(key).await, units, "{context}: in_use of {key}");
        }
    }

    /// Lets `ms` pass.
    pub async fn advance(&self, ms: u64) {
        self.harness.advance(ms).await;
    }

    /// Polls until `key` holds `units`, for at most the expiry slack.
    pub async fn wait_for_in_use(&self, context: &str, key: &LimitKey, units: u64) {
        let slack_ms = self.harness.expiry_slack_ms();
        let mut waited_ms = 0;
        loop {
            let in_use = self.in_use(key).await;
            if in_use == units {
                return;
            }
            assert!(
                waited_ms < slack_ms,
                "{context}: in_use of {key} is {in_use}, expected {units} within {slack_ms} ms of slack"
            );
            let step_ms = POLL_MS.min(slack_ms - waited_ms);
            self.advance(step_ms).await;
            waited_ms += step_ms;
        }
    }

    /// Carries out the pending decreases usage allows and returns the state of
    /// `key` if its decrease is carried out now, by this call or, where the
    /// backend is shared (a fleet, another test on the same cluster), by
    /// another caller since the key was last read.
    pub async fn decrease_applied(&self, key: &LimitKey) -> Option<LimitState> {
        let changed = self
            .backend
            .apply_pending_decreases()
            .await
            .expect("apply_pending_decreases");
        if let Some(state) = changed.into_iter().find(|s| s.definition().key() == key) {
            return Some(state);
        }
        let state = self.report(key).await.state;
        (state.status() == crate::model::definition::LimitStatus::Active).then_some(state)
    }

    /// Polls until a pending decrease of `key` is applied, for at most the
    /// expiry slack; returns the state it led to.
    pub async fn wait_for_decrease(&self, context: &str, key: &LimitKey) -> LimitState {
        let slack_ms = self.harness.expiry_slack_ms();
        let mut waited_ms = 0;
        loop {
            if let Some(state) = self.decrease_applied(key).await {
                return state;
            }
            assert!(
                waited_ms < slack_ms,
                "{context}: the decrease of {key} was not applied within {slack_ms} ms of slack"
            );
            let step_ms = POLL_MS.min(slack_ms - waited_ms);
            self.advance(step_ms).await;
            waited_ms += step_ms;
        }
    }
}
