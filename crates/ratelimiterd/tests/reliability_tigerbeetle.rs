//! The reliability checks on the TigerBeetle backend, in CI (issue 7), on one
//! local replica for this test binary: a short over-admission soak, and
//! `ratelimiterd` killed with SIGKILL and restarted, where TigerBeetle keeps the
//! reservations themselves (nothing lost), and holds whose lease metadata died
//! with the process are released by their timeouts (nothing leaked).
//!
//! The 60 s soaks on a three-replica cluster and the bad-input, crash and
//! security suites on TigerBeetle are in RELIABILITY.md.

#![cfg(feature = "tigerbeetle")]

#[path = "../examples/soak/engine/mod.rs"]
mod engine;
mod soak_support;
mod support;

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use engine::server;
use ratelimiter::tigerbeetle::LocalCluster;
use ratelimiter::LeaseId;
use ratelimiterd::config::BackendKind;
use serde_json::{json, Value};
use support::raw::request;
use support::{temp_dir, BackendConfig, Daemon, ADMIN_TOKEN, CLIENT_TOKEN, WAIT_MAX};

/// Client sessions and batch size a development replica accepts, as the
/// backend's own tests use.
const SESSIONS: u32 = 2;
const BATCH_EVENTS_MAX: u32 = 200;

/// The replica of this test binary, started on first use.
fn cluster() -> &'static LocalCluster {
    static CLUSTER: OnceLock<LocalCluster> = OnceLock::new();
    CLUSTER.get_or_init(|| LocalCluster::start().expect("a local TigerBeetle replica"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_soak_on_tigerbeetle_never_over_admits() {
    let (seed, prefix) = soak_support::seed_and_prefix("ci-tb");
    let mut config = server::config(None, &server::temp_dir(&prefix)).expect("config");
    config.server.backend = BackendKind::Tigerbeetle;
    config.tigerbeetle.addresses = vec![cluster().address().to_owned()];
    config.tigerbeetle.sessions = SESSIONS;
    config.tigerbeetle.batch_events_max = BATCH_EVENTS_MAX;
    soak_support::soak_never_over_admits(&config, seed, prefix).await;
}

/// Starts the binary on this binary's replica, whatever the environment says;
/// decreases are checked far less often than the test runs, so one stays pending.
fn start(dir: &std::path::Path) -> Daemon {
    let settings = format!("  sessions: {SESSIONS}\n  max_batch_events: {BATCH_EVENTS_MAX}\n");
    let backend = BackendConfig::TigerBeetle {
        addresses: cluster().address(),
        settings: &settings,
    };
    Daemon::start_on(dir, backend, "", "decrease:\n  check_interval_ms: 3600000\n")
}

fn call(daemon: &Daemon, method: &str, path: &str, token: &str, body: &Value) -> (u16, Value) {
    let body = if body.is_null() {
        String::new()
    } else {
        body.to_string()
    };
    let answer = request(daemon.addr, method, path, Some(token), body.as_bytes());
    (answer.status, answer.json())
}

fn limits(daemon: &Daemon) -> Value {
    let (status, list) = call(daemon, "GET", "/v1/admin/limits", ADMIN_TOKEN, &Value::Null);
    assert_eq!(status, 200, "{list}");
    list
}

fn in_use(daemon: &Daemon, key: &str) -> u64 {
    let (status, report) = call(
        daemon,
        "GET",
        &format!("/v1/admin/limits/{key}"),
        ADMIN_TOKEN,
        &Value::Null,
    );
    assert_eq!(status, 200, "{report}");
    report["in_use"].as_u64().expect("in_use")
}

#[test]
fn sigkill_on_tigerbeetle_loses_no_reservation_and_leaks_none() {
    let dir = temp_dir("tb-sigkill");
    let mut daemon = start(&dir);
    let run = LeaseId::generate();
    let (inflight, tpm) = (format!("crash-tb:{run}:inflight"), format!("crash-tb:{run}:tpm"));
    // Short concurrency timeouts, so the test sees holds released by them; the
    // rolling window outlasts the test, so its usage shows what survived.
    let definition = json!({"key": inflight, "kind": "concurrency", "capacity": 10, "timeout_seconds": 5});
    for body in [
        definition.clone(),
        json!({"key": tpm, "kind": "rolling", "capacity": 5000, "window_seconds": 3600}),
    ] {
        assert_eq!(call(&daemon, "PUT", "/v1/admin/limits", ADMIN_TOKEN, &body).0, 200);
    }
    let leases: Vec<String> = (0..4).map(|_| LeaseId::generate().to_string()).collect();
    for lease in &leases {
        let body =
            json!({"lease_id": lease, "requirements": [{"key": inflight, "amount": 1}, {"key": tpm, "amount": 100}]});
        let (status, answer) = call(&daemon, "POST", "/v1/reserve", CLIENT_TOKEN, &body);
        assert_eq!((status, &answer["allowed"]), (200, &json!(true)), "{answer}");
    }
    let complete = json!({"lease_id": leases[0], "actuals": [{"key": tpm, "actual_amount": 30}]});
    assert_eq!(call(&daemon, "POST", "/v1/complete", CLIENT_TOKEN, &complete).0, 200);
    let mut lower = definition.clone();
    lower["capacity"] = json!(2);
    let (status, decreasing) = call(&daemon, "PUT", "/v1/admin/limits", ADMIN_TOKEN, &lower);
    assert_eq!(
        (status, &decreasing["status"]),
        (200, &json!("decreasing")),
        "{decreasing}"
    );
    let before = limits(&daemon);
    assert_eq!(in_use(&daemon, &tpm), 330);

    daemon.kill9();
    let daemon = Daemon::start_with(&daemon.config).expect("restart after SIGKILL");
    // TigerBeetle kept every reservation and the decrease. (The
    // concurrency holds may have started to time out by now: compare the rest.)
    let after = limits(&daemon);
    // The cluster is shared with the other test of this binary, and every
    // server lists every limit of its cluster: compare this test's keys.
    let without_inflight_usage = |list: &Value| -> Vec<Value> {
        let mut list: Vec<Value> = (list.as_array().expect("a list").iter())
            .filter(|report| report["key"] == inflight.as_str() || report["key"] == tpm.as_str())
            .cloned()
            .collect();
        for report in &mut list {
            if report["key"] == inflight.as_str() {
                report["in_use"] = json!(null);
            }
        }
        list
    };
    assert_eq!(without_inflight_usage(&after), without_inflight_usage(&before));
    // Completes of leases reserved before the kill are answered, though their
    // metadata died with the process: the server reads them back from the
    // cluster and releases their holds; none leaks.
    for lease in &leases[1..] {
        let complete = json!({"lease_id": lease});
        assert_eq!(call(&daemon, "POST", "/v1/complete", CLIENT_TOKEN, &complete).0, 200);
    }
    let deadline = Instant::now() + WAIT_MAX;
    while in_use(&daemon, &inflight) != 0 {
        assert!(Instant::now() < deadline, "concurrency holds were never released");
        std::thread::sleep(Duration::from_millis(100));
    }
    // The decrease survived the kill: while it is pending a reserve is refused
    // with `limit_decreasing`. Once the holds are gone the pending decrease can
    // be carried out at any moment (by this server's decrease task, or by any
    // other server of the cluster: exactly once, by design), so a grant is
    // right only when the limit is then active at the lower capacity.
    let body = json!({"lease_id": LeaseId::generate().to_string(), "requirements": [{"key": inflight, "amount": 1}]});
    let (_, answer) = call(&daemon, "POST", "/v1/reserve", CLIENT_TOKEN, &body);
    if answer["allowed"] == json!(true) {
        let (status, report) = call(
            &daemon,
            "GET",
            &format!("/v1/admin/limits/{inflight}"),
            ADMIN_TOKEN,
            &Value::Null,
        );
        assert_eq!(status, 200, "{report}");
        assert_eq!(
            (&report["status"], &report["capacity"]),
            (&json!("active"), &json!(2)),
            "granted while the decrease was not carried out: {report}"
        );
    } else {
        assert_eq!(answer["error"], format!("limit_decreasing:{inflight}"), "{answer}");
    }
}
