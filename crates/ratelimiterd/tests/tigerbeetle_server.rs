//! The real `ratelimiterd` binary on the TigerBeetle backend (prototype 4 of
//! docs/testing.md, "Prototypes"): limits defined at runtime over HTTP and used at once,
//! without restarting TigerBeetle or the server; state kept across a server restart;
//! health and 503s when the cluster is gone. Every wait is bounded.

#![cfg(feature = "tigerbeetle")]

mod support;

use std::path::Path;
use std::time::{Duration, Instant};

use ratelimiter::tigerbeetle::LocalCluster;
use ratelimiter::LeaseId;
use serde_json::{json, Value};
use support::{raw, temp_dir, BackendConfig, Daemon, ADMIN_TOKEN, CLIENT_TOKEN};

/// The cluster of this test binary, started on first use (a replica costs memory).
fn cluster() -> &'static LocalCluster {
    static CLUSTER: std::sync::OnceLock<LocalCluster> = std::sync::OnceLock::new();
    CLUSTER.get_or_init(|| LocalCluster::start().expect("starting a local TigerBeetle"))
}

/// The longest any wait for the cluster's health or service of these tests may take.
const WAIT_MAX: Duration = Duration::from_secs(60);
/// The `tigerbeetle:` settings of every server here: few sessions, and requests
/// that give up after 2 s so an outage is answered, never hangs.
const TIGERBEETLE_SETTINGS: &str = "  sessions: 2\n  request_timeout_ms: 2000\n";

/// Starts a server in `dir` on the TigerBeetle cluster at `addresses`.
fn start(dir: &Path, addresses: &str) -> Daemon {
    let backend = BackendConfig::TigerBeetle {
        addresses,
        settings: TIGERBEETLE_SETTINGS,
    };
    Daemon::start_on(dir, backend, "", "")
}

/// One request with the token its path needs: (status, JSON or text body).
fn call(server: &Daemon, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
    let token = if path.starts_with("/v1/admin") {
        ADMIN_TOKEN
    } else {
        CLIENT_TOKEN
    };
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    let answer = raw::request(server.addr, method, path, Some(token), body.as_bytes());
    (answer.status, answer.value())
}

fn reserve(server: &Daemon, lease: LeaseId, key: &str, amount: u64) -> (u16, Value) {
    let body = json!({"lease_id": lease.to_string(), "requirements": [{"key": key, "amount": amount}]});
    call(server, "POST", "/v1/reserve", Some(body))
}

/// Polls `/healthz` until it answers `status`, within the bound.
fn wait_health(server: &Daemon, status: u16) {
    let deadline = Instant::now() + WAIT_MAX;
    while call(server, "GET", "/healthz", None).0 != status {
        assert!(Instant::now() < deadline, "healthz never answered {status}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn limits_defined_at_runtime_work_at_once_and_survive_a_restart() {
    let dir = temp_dir("runtime");
    let key = format!("tb:e2e:{}:rpm", LeaseId::generate());
    let server = start(&dir, cluster().address());
    wait_health(&server, 200);
    let definition = json!({"key": key, "kind": "rolling", "capacity": 3, "window_seconds": 60});
    let (status, state) = call(&server, "PUT", "/v1/admin/limits", Some(definition));
    assert_eq!((status, &state["status"]), (200, &json!("active")), "{state}");

    let granted = LeaseId::generate();
    let (status, body) = reserve(&server, granted, &key, 2);
    assert_eq!((status, &body["allowed"]), (200, &json!(true)), "{body}");
    let (status, again) = reserve(&server, granted, &key, 2);
    assert_eq!(
        (status, &again["reserved_at_unix_ms"]),
        (200, &body["reserved_at_unix_ms"])
    );
    let (status, denied) = reserve(&server, LeaseId::generate(), &key, 2);
    assert_eq!(status, 200);
    assert_eq!(denied["error"], json!(format!("insufficient_capacity:{key}")));
    assert!(denied["retry_after_ms"].as_u64().unwrap() > 0);
    let (status, report) = call(&server, "GET", &format!("/v1/admin/limits/{key}"), None);
    assert_eq!((status, &report["in_use"]), (200, &json!(2)), "{report}");
    let complete = json!({"lease_id": granted.to_string(), "actuals": [{"key": key, "actual_amount": 1}]});
    let (status, body) = call(&server, "POST", "/v1/complete", Some(complete));
    assert_eq!((status, body), (200, json!({"ok": true})));
    drop(server);

    // The registry restores the definition; the cluster kept the usage.
    let server = start(&dir, cluster().address());
    wait_health(&server, 200);
    let (_, report) = call(&server, "GET", &format!("/v1/admin/limits/{key}"), None);
    assert_eq!(
        (&report["capacity"], &report["in_use"]),
        (&json!(3), &json!(1)),
        "{report}"
    );
    assert_eq!(reserve(&server, LeaseId::generate(), &key, 2).1["allowed"], json!(true));
    assert_eq!(
        reserve(&server, LeaseId::generate(), &key, 1).1["allowed"],
        json!(false)
    );
    let (status, body) = reserve(&server, LeaseId::generate(), &format!("{key}:ghost"), 1);
    assert_eq!(status, 404, "{body}");
}

#[test]
fn a_cluster_that_does_not_answer_is_unhealthy_and_503() {
    let dir = temp_dir("dead");
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead = listener.local_addr().unwrap().to_string();
    drop(listener);
    let server = start(&dir, &dead);
    wait_health(&server, 503);
    let definition = json!({"key": "tb:dead", "kind": "rolling", "capacity": 3, "window_seconds": 60});
    let (status, body) = call(&server, "PUT", "/v1/admin/limits", Some(definition));
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["error"], json!("backend_unavailable"));
}

/// The server's resident memory in KiB, from `/proc`.
fn rss_kib(server: &Daemon) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{}/status", server.pid())).unwrap();
    let line = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .expect("VmRSS in /proc status");
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// Requests sent while the cluster is stopped: each must be answered within
/// `request_timeout_ms` (2 s here) plus this margin, never hang.
const OUTAGE_ANSWER_MS_MAX: u128 = 4_000;
/// Reserves sent during the outage, from this many threads at once.
const OUTAGE_CLIENTS: usize = 8;
const OUTAGE_RESERVES_PER_CLIENT: usize = 5;
/// How much the server's memory may grow across the outage: a queue or cache
/// that piles up per failed request would exceed it.
const OUTAGE_RSS_GROWTH_KIB_MAX: u64 = 32 * 1024;

#[test]
fn a_stopped_cluster_gives_bounded_503s_and_service_resumes_by_itself() {
    let dir = temp_dir("outage");
    let cluster = LocalCluster::start().expect("a local cluster");
    let server = start(&dir, cluster.address());
    wait_health(&server, 200);
    let key = format!("tb:outage:{}:rpm", LeaseId::generate());
    let definition = json!({"key": key, "kind": "rolling", "capacity": 1000, "window_seconds": 60});
    assert_eq!(call(&server, "PUT", "/v1/admin/limits", Some(definition)).0, 200);
    assert_eq!(reserve(&server, LeaseId::generate(), &key, 1).1["allowed"], json!(true));
    let rss_before = rss_kib(&server);

    cluster.pause().unwrap();
    std::thread::scope(|scope| {
        for _ in 0..OUTAGE_CLIENTS {
            scope.spawn(|| {
                for _ in 0..OUTAGE_RESERVES_PER_CLIENT {
                    let started = Instant::now();
                    let (status, body) = reserve(&server, LeaseId::generate(), &key, 1);
                    let took_ms = started.elapsed().as_millis();
                    assert_eq!(status, 503, "{body}");
                    assert_eq!(body["error"], json!("backend_unavailable"), "{body}");
                    assert!(took_ms <= OUTAGE_ANSWER_MS_MAX, "a reserve took {took_ms} ms");
                }
            });
        }
    });
    wait_health(&server, 503);
    let rss_growth = rss_kib(&server).saturating_sub(rss_before);
    assert!(
        rss_growth <= OUTAGE_RSS_GROWTH_KIB_MAX,
        "RSS grew {rss_growth} KiB in the outage"
    );

    cluster.resume().unwrap();
    wait_health(&server, 200);
    let deadline = Instant::now() + WAIT_MAX;
    loop {
        let (status, body) = reserve(&server, LeaseId::generate(), &key, 1);
        if status == 200 && body["allowed"] == json!(true) {
            break;
        }
        assert!(Instant::now() < deadline, "service never resumed: {status} {body}");
        std::thread::sleep(Duration::from_millis(100));
    }
    // Reservations of unknown outcome are held pessimistically, never granted twice.
    let (_, report) = call(&server, "GET", &format!("/v1/admin/limits/{key}"), None);
    let in_use = report["in_use"].as_u64().unwrap();
    assert!(in_use <= 1000, "{report}");
}

/// The value of a single-valued metric in a Prometheus text.
fn metric(text: &str, name: &str) -> u64 {
    text.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("{name} is not in /metrics:\n{text}"))
        .parse()
        .unwrap()
}

#[test]
fn the_backends_own_counters_are_in_metrics() {
    let dir = temp_dir("metrics");
    let server = start(&dir, cluster().address());
    wait_health(&server, 200);
    let id = LeaseId::generate();
    let (plain, owed) = (format!("tb:metrics:{id}:plain"), format!("tb:metrics:{id}:owed"));
    for (key, overage) in [(&plain, "none"), (&owed, "debt")] {
        let definition =
            json!({"key": key, "kind": "rolling", "capacity": 10, "window_seconds": 60, "overage": overage});
        assert_eq!(call(&server, "PUT", "/v1/admin/limits", Some(definition)).0, 200);
    }
    // One lease takes both limits whole, then reports 3 units more on each:
    // the overage cannot be reserved, so it is dropped on one and owed on the other.
    let lease = LeaseId::generate().to_string();
    let reserve =
        json!({"lease_id": lease, "requirements": [{"key": plain, "amount": 10}, {"key": owed, "amount": 10}]});
    let (status, body) = call(&server, "POST", "/v1/reserve", Some(reserve));
    assert_eq!((status, &body["allowed"]), (200, &json!(true)), "{body}");
    let complete = json!({"lease_id": lease, "actuals": [{"key": plain, "actual_amount": 13}, {"key": owed, "actual_amount": 13}]});
    assert_eq!(call(&server, "POST", "/v1/complete", Some(complete)).0, 200);

    let (status, text) = call(&server, "GET", "/metrics", None);
    assert_eq!(status, 200);
    let text = text.as_str().expect("Prometheus text").to_owned();
    assert_eq!(metric(&text, "ratelimiterd_tigerbeetle_overage_dropped_units_total"), 3);
    assert_eq!(metric(&text, "ratelimiterd_tigerbeetle_overage_debt_units_total"), 3);
    // The hot path sent four work items: the reserve chain (2 reservations,
    // the first at the lease's marker id), then the Complete's chain in
    // rounds, each dropping what cannot be written: the completion record
    // and the two overage reservations (3), the record and the owed one (2,
    // the other dropped: overage none), the record and its debt (2). The
    // admin path is not counted.
    assert_eq!(metric(&text, "ratelimiterd_tigerbeetle_batch_items_total"), 4);
    assert_eq!(metric(&text, "ratelimiterd_tigerbeetle_batch_transfers_total"), 9);
    assert_eq!(metric(&text, "ratelimiterd_tigerbeetle_batch_transfers_max"), 3);
    let batches = metric(&text, "ratelimiterd_tigerbeetle_batches_total");
    assert!((1..=4).contains(&batches), "{batches} batches");
    assert_eq!(metric(&text, "ratelimiterd_tigerbeetle_queue_wait_seconds_count"), 4);
    assert_eq!(
        metric(&text, "ratelimiterd_tigerbeetle_request_duration_seconds_count"),
        batches
    );
    assert!(text.contains("ratelimiterd_tigerbeetle_request_duration_seconds_bucket{le=\"+Inf\"} "));
    for zero in [
        "ratelimiterd_tigerbeetle_queue_full_total",
        "ratelimiterd_tigerbeetle_timeouts_total",
        "ratelimiterd_tigerbeetle_abandoned_items_total",
        "ratelimiterd_tigerbeetle_queue_depth",
        "ratelimiterd_tigerbeetle_requests_outstanding",
        "ratelimiterd_tigerbeetle_sessions_renewed_total",
        "ratelimiterd_tigerbeetle_lease_cache_evictions_total",
        "ratelimiterd_tigerbeetle_denied_leases_remembered",
        "ratelimiterd_tigerbeetle_denied_leases_evictions_total",
    ] {
        assert_eq!(metric(&text, zero), 0, "{zero}");
    }
    assert_eq!(metric(&text, "ratelimiterd_tigerbeetle_leases_cached"), 1);
}
