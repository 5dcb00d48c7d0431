//! The real `ratelimiterd` binary on the TigerBeetle backend (spec prototype 4):
//! limits defined at runtime over HTTP and used at once, without restarting
//! TigerBeetle or the server; state kept across a server restart; health and
//! 503s when the cluster is gone. Every wait is bounded.

#![cfg(feature = "tigerbeetle")]

mod tigerbeetle_common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use ratelimiter::LeaseId;
use serde_json::{json, Value};
use tigerbeetle_common::cluster;

const BIN: &str = env!("CARGO_BIN_EXE_ratelimiterd");
/// The longest any single wait of these tests may take.
const WAIT_MAX: Duration = Duration::from_secs(60);

/// A running server; killed on drop.
struct Server {
    child: Child,
    addr: SocketAddr,
}

impl Server {
    fn start(dir: &Path, addresses: &str) -> Server {
        let config = dir.join("config.yaml");
        let text = format!(
            "server:\n  listen_addr: \"127.0.0.1:0\"\n  backend: tigerbeetle\nregistry:\n  path: {}\n\
             tigerbeetle:\n  cluster_id: \"0\"\n  addresses: [\"{addresses}\"]\n  sessions: 2\n  request_timeout_ms: 2000\n",
            dir.join("limits.json").display()
        );
        std::fs::write(&config, text).unwrap();
        let mut child = Command::new(BIN)
            .arg("--config")
            .arg(&config)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let mut server = Server {
            child,
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
        };
        let (sender, receiver) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                eprintln!("[server] {line}");
                let _ = sender.send(line);
            }
        });
        let deadline = Instant::now() + WAIT_MAX;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = receiver
                .recv_timeout(left)
                .expect("the server logs its address in time");
            if let Some(rest) = line.split("addr=").nth(1).filter(|_| line.contains("listening")) {
                server.addr = rest.split_whitespace().next().unwrap().parse().unwrap();
                return server;
            }
        }
    }

    fn call(&self, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
        let mut stream = TcpStream::connect(self.addr).unwrap();
        stream.set_read_timeout(Some(WAIT_MAX)).unwrap();
        let body = body.map(|b| b.to_string()).unwrap_or_default();
        let head = format!(
            "{method} {path} HTTP/1.1\r\nhost: test\r\nconnection: close\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
            body.len()
        );
        stream.write_all(head.as_bytes()).unwrap();
        stream.write_all(body.as_bytes()).unwrap();
        let mut raw = Vec::new();
        stream.read_to_end(&mut raw).unwrap();
        let text = String::from_utf8_lossy(&raw);
        let (head, body) = text.split_once("\r\n\r\n").expect("a full response");
        let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
        (
            status,
            serde_json::from_str(body).unwrap_or(Value::String(body.to_owned())),
        )
    }

    fn reserve(&self, lease: LeaseId, key: &str, amount: u64) -> (u16, Value) {
        let body = json!({"lease_id": lease.to_string(), "requirements": [{"key": key, "amount": amount}]});
        self.call("POST", "/v1/reserve", Some(body))
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A temporary directory, deleted on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        let dir = std::env::temp_dir().join(format!("ratelimiterd-tb-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Polls `/healthz` until it answers `status`, within the bound.
fn wait_health(server: &Server, status: u16) {
    let deadline = Instant::now() + WAIT_MAX;
    while server.call("GET", "/healthz", None).0 != status {
        assert!(Instant::now() < deadline, "healthz never answered {status}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn limits_defined_at_runtime_work_at_once_and_survive_a_restart() {
    let temp = TempDir::new("runtime");
    let dir = &temp.0;
    let key = format!("tb:e2e:{}:rpm", LeaseId::generate());
    let server = Server::start(dir, cluster().address());
    wait_health(&server, 200);
    let definition = json!({"key": key, "kind": "rolling", "capacity": 3, "window_seconds": 60});
    let (status, state) = server.call("PUT", "/v1/admin/limits", Some(definition));
    assert_eq!((status, &state["status"]), (200, &json!("active")), "{state}");

    let granted = LeaseId::generate();
    let (status, body) = server.reserve(granted, &key, 2);
    assert_eq!((status, &body["allowed"]), (200, &json!(true)), "{body}");
    let (status, again) = server.reserve(granted, &key, 2);
    assert_eq!(
        (status, &again["reserved_at_unix_ms"]),
        (200, &body["reserved_at_unix_ms"])
    );
    let (status, denied) = server.reserve(LeaseId::generate(), &key, 2);
    assert_eq!(status, 200);
    assert_eq!(denied["error"], json!(format!("insufficient_capacity:{key}")));
    assert!(denied["retry_after_ms"].as_u64().unwrap() > 0);
    let (status, report) = server.call("GET", &format!("/v1/admin/limits/{key}"), None);
    assert_eq!((status, &report["in_use"]), (200, &json!(2)), "{report}");
    let complete = json!({"lease_id": granted.to_string(), "actuals": [{"key": key, "actual_amount": 1}]});
    let (status, body) = server.call("POST", "/v1/complete", Some(complete));
    assert_eq!((status, body), (200, json!({"ok": true})));
    drop(server);

    // The registry restores the definition; the cluster kept the usage.
    let server = Server::start(dir, cluster().address());
    wait_health(&server, 200);
    let (_, report) = server.call("GET", &format!("/v1/admin/limits/{key}"), None);
    assert_eq!(
        (&report["capacity"], &report["in_use"]),
        (&json!(3), &json!(1)),
        "{report}"
    );
    assert_eq!(server.reserve(LeaseId::generate(), &key, 2).1["allowed"], json!(true));
    assert_eq!(server.reserve(LeaseId::generate(), &key, 1).1["allowed"], json!(false));
    let (status, body) = server.reserve(LeaseId::generate(), &format!("{key}:ghost"), 1);
    assert_eq!(status, 404, "{body}");
}

#[test]
fn a_cluster_that_does_not_answer_is_unhealthy_and_503() {
    let temp = TempDir::new("dead");
    let dir = &temp.0;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead = listener.local_addr().unwrap().to_string();
    drop(listener);
    let server = Server::start(dir, &dead);
    wait_health(&server, 503);
    let definition = json!({"key": "tb:dead", "kind": "rolling", "capacity": 3, "window_seconds": 60});
    let (status, body) = server.call("PUT", "/v1/admin/limits", Some(definition));
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["error"], json!("backend_unavailable"));
}

/// The server's resident memory in KiB, from `/proc`.
fn rss_kib(server: &Server) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{}/status", server.child.id())).unwrap();
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
    let temp = TempDir::new("outage");
    let cluster = ratelimiterd::tigerbeetle::LocalCluster::start().expect("a local cluster");
    let server = Server::start(&temp.0, cluster.address());
    wait_health(&server, 200);
    let key = format!("tb:outage:{}:rpm", LeaseId::generate());
    let definition = json!({"key": key, "kind": "rolling", "capacity": 1000, "window_seconds": 60});
    assert_eq!(server.call("PUT", "/v1/admin/limits", Some(definition)).0, 200);
    assert_eq!(server.reserve(LeaseId::generate(), &key, 1).1["allowed"], json!(true));
    let rss_before = rss_kib(&server);

    cluster.pause().unwrap();
    std::thread::scope(|scope| {
        for _ in 0..OUTAGE_CLIENTS {
            scope.spawn(|| {
                for _ in 0..OUTAGE_RESERVES_PER_CLIENT {
                    let started = Instant::now();
                    let (status, body) = server.reserve(LeaseId::generate(), &key, 1);
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
        let (status, body) = server.reserve(LeaseId::generate(), &key, 1);
        if status == 200 && body["allowed"] == json!(true) {
            break;
        }
        assert!(Instant::now() < deadline, "service never resumed: {status} {body}");
        std::thread::sleep(Duration::from_millis(100));
    }
    // Reservations of unknown outcome are held pessimistically, never granted twice.
    let (_, report) = server.call("GET", &format!("/v1/admin/limits/{key}"), None);
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
    let temp = TempDir::new("metrics");
    let server = Server::start(&temp.0, cluster().address());
    wait_health(&server, 200);
    let id = LeaseId::generate();
    let (plain, owed) = (format!("tb:metrics:{id}:plain"), format!("tb:metrics:{id}:owed"));
    for (key, overage) in [(&plain, "none"), (&owed, "debt")] {
        let definition =
            json!({"key": key, "kind": "rolling", "capacity": 10, "window_seconds": 60, "overage": overage});
        assert_eq!(server.call("PUT", "/v1/admin/limits", Some(definition)).0, 200);
    }
    // One lease takes both limits whole, then reports 3 units more on each:
    // the overage cannot be reserved, so it is dropped on one and owed on the other.
    let lease = LeaseId::generate().to_string();
    let reserve =
        json!({"lease_id": lease, "requirements": [{"key": plain, "amount": 10}, {"key": owed, "amount": 10}]});
    let (status, body) = server.call("POST", "/v1/reserve", Some(reserve));
    assert_eq!((status, &body["allowed"]), (200, &json!(true)), "{body}");
    let complete = json!({"lease_id": lease, "actuals": [{"key": plain, "actual_amount": 13}, {"key": owed, "actual_amount": 13}]});
    assert_eq!(server.call("POST", "/v1/complete", Some(complete)).0, 200);

    let (status, text) = server.call("GET", "/metrics", None);
    assert_eq!(status, 200);
    let text = text.as_str().expect("Prometheus text").to_owned();
    assert_eq!(metric(&text, "ratelimiterd_tigerbeetle_overage_dropped_units_total"), 3);
    assert_eq!(metric(&text, "ratelimiterd_tigerbeetle_overage_debt_units_total"), 3);
    // The hot path sent three work items: the reserve chain (2 transfers), the
    // two overage reservations (2), the debt (1); the admin path is not counted.
    assert_eq!(metric(&text, "ratelimiterd_tigerbeetle_batch_items_total"), 3);
    assert_eq!(metric(&text, "ratelimiterd_tigerbeetle_batch_transfers_total"), 5);
    assert_eq!(metric(&text, "ratelimiterd_tigerbeetle_batch_transfers_max"), 2);
    let batches = metric(&text, "ratelimiterd_tigerbeetle_batches_total");
    assert!((1..=3).contains(&batches), "{batches} batches");
    assert_eq!(metric(&text, "ratelimiterd_tigerbeetle_queue_wait_seconds_count"), 3);
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
