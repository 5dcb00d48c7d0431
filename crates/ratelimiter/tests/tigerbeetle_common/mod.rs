//! Shared setup of the TigerBeetle test binaries: one real local cluster per
//! binary (a replica costs memory), and backends connected to it.

#![allow(dead_code)]

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use ratelimiter::retry::{Jitter, RetryAdvisor, RetryPolicy};
use ratelimiter::tigerbeetle::{
    BackendOptions, ConfigFields, LocalCluster, SubmitMode, TigerBeetleBackend, TigerBeetleConfig,
};
use ratelimiter::{
    Actual, Backend, Clock, CompleteRequest, LeaseId, LimitKey, Requirement, ReserveRequest, SystemClock,
};

/// How long a test waits for the cluster to answer its first request.
pub const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// The cluster of this test binary, started on first use.
pub fn cluster() -> &'static LocalCluster {
    static CLUSTER: OnceLock<LocalCluster> = OnceLock::new();
    CLUSTER.get_or_init(|| LocalCluster::start().expect("starting a local TigerBeetle"))
}

/// Settings for the shared cluster: few sessions, batches a development
/// replica accepts.
pub fn config(mode: SubmitMode) -> TigerBeetleConfig {
    config_with(mode, 2)
}

/// [`config`] with `sessions` client sessions.
pub fn config_with(mode: SubmitMode, sessions: u32) -> TigerBeetleConfig {
    TigerBeetleConfig::new(ConfigFields {
        addresses: vec![cluster().address().to_owned()],
        sessions,
        batch_events_max: 200,
        submit_mode: mode,
        request_timeout_ms: 20_000,
        ..ConfigFields::default()
    })
    .unwrap()
}

/// Backend options with the default retry policy and `clock`.
pub fn options(clock: Arc<dyn Clock>) -> BackendOptions {
    BackendOptions {
        retry: RetryAdvisor::new(RetryPolicy::default(), 1024, Jitter::seeded(7)),
        decrease_retry_ms: 10_000,
        // Holds end exactly at their window: the tests time expiry to the second.
        window_margin_ms: 0,
        clock,
    }
}

/// A backend on the shared cluster that answered a health check.
pub async fn backend_with(mode: SubmitMode, clock: Arc<dyn Clock>) -> TigerBeetleBackend {
    backend_on(&config(mode), clock).await
}

/// A backend with `config` that answered a health check.
pub async fn backend_on(config: &TigerBeetleConfig, clock: Arc<dyn Clock>) -> TigerBeetleBackend {
    let backend = TigerBeetleBackend::connect(config, options(clock), std::future::pending()).unwrap();
    let deadline = tokio::time::Instant::now() + READY_TIMEOUT;
    while backend.health().await.is_err() {
        assert!(tokio::time::Instant::now() < deadline, "cluster not ready");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    backend
}

/// A batching backend on the system clock.
pub async fn backend() -> TigerBeetleBackend {
    backend_with(SubmitMode::Batching, Arc::new(SystemClock::new())).await
}

/// A key no other test uses (tests share the cluster).
pub fn unique_key(name: &str) -> LimitKey {
    LimitKey::new(format!("test:{name}:{}", LeaseId::generate())).unwrap()
}

/// A reserve request for a fresh lease.
pub fn reserve(requirements: &[(&LimitKey, u64)]) -> ReserveRequest {
    reserve_lease(LeaseId::generate(), requirements)
}

/// A reserve request for `lease`.
pub fn reserve_lease(lease: LeaseId, requirements: &[(&LimitKey, u64)]) -> ReserveRequest {
    let requirements = requirements
        .iter()
        .map(|(key, amount)| Requirement {
            key: (*key).clone(),
            amount: *amount,
        })
        .collect();
    ReserveRequest::new(lease, None, requirements).unwrap()
}

/// A Complete of `lease` with `actuals`.
pub fn complete(lease: LeaseId, actuals: &[(&LimitKey, u64)]) -> CompleteRequest {
    let actuals = actuals
        .iter()
        .map(|(key, amount)| Actual {
            key: (*key).clone(),
            actual_amount: *amount,
        })
        .collect();
    CompleteRequest::new(lease, None, actuals).unwrap()
}

/// Units of `key` in use, as `backend` reports them.
pub async fn in_use(backend: &impl Backend, key: &LimitKey) -> u64 {
    backend.limit_report(key).await.unwrap().unwrap().in_use
}
