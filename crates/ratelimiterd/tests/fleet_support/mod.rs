//! The fleet tests' cluster and servers (tests/fleet.rs): one local TigerBeetle
//! cluster per test binary, servers started on it with the fleet's settings, the
//! requests and reports the tests make through them, and bounded polls.

use std::path::Path;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use ratelimiter::tigerbeetle::LocalCluster;
use ratelimiter::{
    Actual, CompleteRequest, LeaseId, LimitDefinition, LimitKey, LimitReport, Limiter, Requirement, ReserveOutcome,
    ReserveRequest,
};

use crate::support::{raw, BackendConfig, Daemon, ADMIN_TOKEN, CLIENT_TOKEN};

/// The cluster of this test binary, started on first use (a replica costs memory).
pub fn cluster() -> &'static LocalCluster {
    static CLUSTER: OnceLock<LocalCluster> = OnceLock::new();
    CLUSTER.get_or_init(|| LocalCluster::start().expect("starting a local TigerBeetle"))
}

/// The tests of this binary run one at a time: each starts two or three
/// servers, and the machine they run on may have two cores; in parallel, the
/// propagation times they measure would measure the scheduler instead.
pub static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The longest any wait for health, propagation or a decrease may take before
/// the test fails: far above what a correct fleet needs, far below a hang.
pub const WAIT_MAX: Duration = Duration::from_secs(20);
/// How often a poll asks again.
const POLL: Duration = Duration::from_millis(20);
/// The promise under test: a definition made on one server is served by every
/// other within this (the servers read the log every 200 ms).
pub const PROPAGATION_MAX: Duration = Duration::from_secs(1);
/// The `tigerbeetle:` settings of every server here: few sessions (a shared
/// development replica), and requests that give up after 2 s so a call never hangs.
const TIGERBEETLE_SETTINGS: &str = "  sessions: 2\n  request_timeout_ms: 2000\n";
/// Pending decreases checked every 100 ms on every server, so the servers race
/// to carry out the same decrease.
pub const FAST_DECREASES: &str = "decrease:\n  check_interval_ms: 100\n";
/// Decreases never tried by the periodic task within a test.
pub const NO_DECREASES: &str = "decrease:\n  check_interval_ms: 3600000\n";

/// Starts a server in `dir` (empty: nothing but what the cluster holds) with
/// `sections`, and waits until it is healthy.
pub async fn start(dir: &Path, sections: &str) -> Daemon {
    let backend = BackendConfig::TigerBeetle {
        addresses: cluster().address(),
        settings: TIGERBEETLE_SETTINGS,
    };
    let server = Daemon::start_on(dir, backend, "", sections);
    let deadline = Instant::now() + WAIT_MAX;
    while raw::request(server.addr, "GET", "/healthz", None, b"").status != 200 {
        assert!(Instant::now() < deadline, "server never became healthy");
        tokio::time::sleep(POLL).await;
    }
    server
}

/// A key under a prefix no other test or run uses (the cluster outlives a run).
pub fn unique_key(prefix: &str, name: &str) -> LimitKey {
    LimitKey::new(format!("fleet:{prefix}:{name}")).expect("valid test key")
}

/// A rolling limit on `key`.
pub fn rolling(key: &LimitKey, capacity: u64, window_seconds: u64) -> LimitDefinition {
    LimitDefinition::rolling(key.clone(), capacity, window_seconds).expect("valid definition")
}

/// A concurrency limit on `key`.
pub fn concurrency(key: &LimitKey, capacity: u64, timeout_seconds: u64) -> LimitDefinition {
    LimitDefinition::concurrency(key.clone(), capacity, timeout_seconds).expect("valid definition")
}

/// A reserve of `needs` (key, amount) under `lease`.
pub fn reserve_request(lease: LeaseId, needs: &[(&LimitKey, u64)]) -> ReserveRequest {
    let requirements = needs
        .iter()
        .map(|&(key, amount)| Requirement {
            key: key.clone(),
            amount,
        })
        .collect();
    ReserveRequest::new(lease, None, requirements).expect("valid reserve")
}

/// A complete of `lease` with `actuals` (key, actual amount).
pub fn complete_request(lease: LeaseId, actuals: &[(&LimitKey, u64)]) -> CompleteRequest {
    let actuals = actuals
        .iter()
        .map(|&(key, actual_amount)| Actual {
            key: key.clone(),
            actual_amount,
        })
        .collect();
    CompleteRequest::new(lease, None, actuals).expect("valid complete")
}

/// Reserves `needs` under a new lease on `server`.
pub async fn reserve(server: &Daemon, needs: &[(&LimitKey, u64)]) -> (LeaseId, ReserveOutcome) {
    let lease = LeaseId::generate();
    let outcome = server
        .client(CLIENT_TOKEN)
        .reserve(&reserve_request(lease, needs))
        .await
        .unwrap_or_else(|e| panic!("reserve on {}: {e}", server.url()));
    (lease, outcome)
}

/// `key`'s report on `server`.
pub async fn report(server: &Daemon, key: &LimitKey) -> LimitReport {
    server
        .client(ADMIN_TOKEN)
        .limit(key)
        .await
        .unwrap_or_else(|e| panic!("GET {key} on {}: {e}", server.url()))
        .unwrap_or_else(|| panic!("{key} unknown to {}", server.url()))
}

/// Polls `check` every [`POLL`] until it holds; the time it took, or a panic
/// naming `what` after [`WAIT_MAX`].
pub async fn wait_until<F, Fut>(what: &str, mut check: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let started = Instant::now();
    loop {
        if check().await {
            return started.elapsed();
        }
        assert!(started.elapsed() < WAIT_MAX, "{what}: not within {WAIT_MAX:?}");
        tokio::time::sleep(POLL).await;
    }
}

/// The value of the unlabelled counter or gauge `name` in `server`'s `/metrics`.
pub fn metric(server: &Daemon, name: &str) -> f64 {
    let text = raw::request(server.addr, "GET", "/metrics", None, b"").text();
    text.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("{name} missing from /metrics:\n{text}"))
        .trim()
        .parse()
        .expect("a number")
}
