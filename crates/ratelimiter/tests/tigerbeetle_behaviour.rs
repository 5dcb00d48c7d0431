//! The backend behaviour suite (`ratelimiter::testkit`) on the TigerBeetle
//! backend, against a real local cluster. Time is real: TigerBeetle expires
//! pending transfers by its own clock, so the harness sleeps and allows slack.

#![cfg(feature = "tigerbeetle")]

mod tigerbeetle_common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use ratelimiter::testkit::{self, Harness};
use ratelimiter::tigerbeetle::{SubmitMode, TigerBeetleBackend};
use ratelimiter::{Backend, LeaseId, SystemClock};
use tigerbeetle_common::backend_with;

/// How late TigerBeetle may release a pending transfer after its timeout: it
/// expires them in the background, in batches, by the cluster's clock.
const EXPIRY_SLACK_MS: u64 = 5_000;

/// Scenarios share one backend (and cluster); each gets its own key prefix.
struct TigerBeetleHarness {
    backend: Arc<TigerBeetleBackend>,
    run: LeaseId,
    scenarios: AtomicU64,
}

#[async_trait]
impl Harness for TigerBeetleHarness {
    async fn backend(&self) -> Arc<dyn Backend> {
        self.backend.clone()
    }

    fn unique_prefix(&self) -> String {
        format!("suite:{}:{}", self.run, self.scenarios.fetch_add(1, Ordering::Relaxed))
    }

    async fn advance(&self, ms: u64) {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }

    fn expiry_slack_ms(&self) -> u64 {
        EXPIRY_SLACK_MS
    }

    fn decrease_retry_ms(&self) -> u64 {
        10_000
    }
}

async fn harness(mode: SubmitMode) -> TigerBeetleHarness {
    TigerBeetleHarness {
        backend: Arc::new(backend_with(mode, Arc::new(SystemClock::new())).await),
        run: LeaseId::generate(),
        scenarios: AtomicU64::new(0),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batching_backend_passes_the_behaviour_suite() {
    testkit::run_all(&harness(SubmitMode::Batching).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn direct_backend_passes_the_behaviour_suite() {
    testkit::run_all(&harness(SubmitMode::Direct).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batching_backend_passes_the_bucket_scenarios() {
    testkit::run_bucket(&harness(SubmitMode::Batching).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn direct_backend_passes_the_bucket_scenarios() {
    testkit::run_bucket(&harness(SubmitMode::Direct).await).await;
}
