//! The behaviour suite every backend passes (enabled by the `testkit` feature).
//!
//! A backend is plugged in through a [`Harness`]; each scenario is one `pub async
//! fn(&dyn Harness)` that panics with a message when the backend misbehaves, and
//! [`run_all`] runs them all. Scenarios use windows and timeouts of 1–3 s so a run
//! against a real-time backend (TigerBeetle) is quick, and they wait for expiry
//! through [`Harness::advance`] plus a bounded poll of [`Harness::expiry_slack_ms`],
//! so a backend whose expiry lags passes without exact-instant assertions.
//!
//! ```ignore
//! #[tokio::test]
//! async fn behaviour() {
//!     ratelimiter::testkit::run_all(&ratelimiter::testkit::MemoryHarness::new()).await;
//! }
//! ```
//!
//! A harness for a real-time backend (TigerBeetle) returns the same shared
//! backend from [`Harness::backend`], a prefix with a per-run random part from
//! [`Harness::unique_prefix`] (the cluster outlives the run), sleeps in
//! [`Harness::advance`], and gives an [`Harness::expiry_slack_ms`] of a few
//! seconds: scenarios wait out a window or timeout with `advance`, then poll
//! every 100 ms, at most that long, for the backend to show the expiry. They
//! only assert "still held" well before an expiry (half a timeout early), never
//! at the instant. Scenarios may also be run one by one, in parallel if the
//! backend allows, since no two share a key.

mod bucket_scenarios;
mod fixture;
mod memory_harness;
mod owing_scenarios;
mod scenarios;

use std::sync::Arc;

use async_trait::async_trait;

use crate::limiting::limiter::Backend;

pub use bucket_scenarios::*;
pub use fixture::Fixture;
pub use memory_harness::MemoryHarness;
pub use owing_scenarios::*;
pub use scenarios::*;

/// What the suite needs from a backend under test.
#[async_trait]
pub trait Harness: Send + Sync {
    /// A backend for one scenario. It may be shared with other scenarios (one
    /// TigerBeetle cluster): scenarios only touch keys under [`Harness::unique_prefix`].
    async fn backend(&self) -> Arc<dyn Backend>;

    /// A key prefix that no other scenario of this run (or of earlier runs
    /// against the same cluster) uses; valid key characters only.
    fn unique_prefix(&self) -> String;

    /// Lets `ms` of the backend's time pass: advances a fake clock, or sleeps.
    async fn advance(&self, ms: u64);

    /// How late the backend may release a hold after its window or timeout;
    /// 0 for exact expiry. Scenarios poll that long before they fail.
    fn expiry_slack_ms(&self) -> u64;

    /// The `retry_after_ms` the backend answers for `limit_decreasing`.
    fn decrease_retry_ms(&self) -> u64;
}

/// Runs every scenario in turn; panics at the first misbehaviour, naming it.
pub async fn run_all(harness: &dyn Harness) {
    prototype_1_lease_ids(harness).await;
    denied_request_changes_nothing(harness).await;
    concurrency_released_on_complete(harness).await;
    concurrency_released_on_timeout(harness).await;
    reconcile_frees_capacity(harness).await;
    overage_and_debt(harness).await;
    capacity_increase(harness).await;
    capacity_decrease(harness).await;
    idempotent_reserve(harness).await;
    lease_reuse_conflicts(harness).await;
    exceeds_capacity(harness).await;
    unknown_key(harness).await;
    complete_is_idempotent(harness).await;
    first_complete_decides(harness).await;
    complete_rejects_bad_actuals(harness).await;
    reserve_precedence(harness).await;
    overage_after_the_window(harness).await;
    pause_holds_for_its_own_time(harness).await;
    owing_refuses_until_its_window_ends(harness).await;
    owing_in_a_period_is_final(harness).await;
}

/// Runs every token-bucket scenario in turn (docs/bucket-limits.md); panics at the
/// first misbehaviour, naming it.
pub async fn run_bucket(harness: &dyn Harness) {
    bucket_burst_then_refill(harness).await;
    bucket_refund_on_complete(harness).await;
    bucket_overage(harness).await;
    bucket_capacity_changes(harness).await;
}
