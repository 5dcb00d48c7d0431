//! End-to-end tests of the real binary on a free loopback port with a temporary
//! registry: the contract over a socket, persistence across restarts (a pending
//! decrease included), auth, graceful shutdown, the operator CLI and startup
//! errors. Every wait is bounded.

mod support;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ratelimiter::httpclient::{HttpClient, HttpClientConfig};
use ratelimiter::{LeaseId, LimitKey, Limiter, Requirement, ReserveOutcome, ReserveRequest};
use serde_json::{json, Value};
use support::raw::{self, Session};
use support::{temp_dir, write_config_on, BackendConfig, Daemon, ADMIN_TOKEN, BIN, CLIENT_TOKEN, WAIT_MAX};

/// Starts the binary on the memory backend, whatever the environment says (the
/// restart test counts on the memory backend's snapshot keeping usage across a
/// restart), with `sections` after the base configuration.
fn start(dir: &Path, sections: &str) -> Daemon {
    Daemon::start_on(dir, BackendConfig::Memory, "", sections)
}

/// One HTTP/1.1 exchange on a fresh connection: (status, JSON or text body).
fn http(addr: SocketAddr, method: &str, path: &str, body: Option<&str>, token: Option<&str>) -> (u16, Value) {
    let answer = raw::request(addr, method, path, token, body.unwrap_or("").as_bytes());
    (answer.status, answer.value())
}

fn rolling(key: &str, capacity: u64) -> String {
    json!({"key": key, "kind": "rolling", "capacity": capacity, "window_seconds": 60}).to_string()
}

fn concurrency(key: &str, capacity: u64) -> String {
    json!({"key": key, "kind": "concurrency", "capacity": capacity, "timeout_seconds": 600}).to_string()
}

fn reserve_body(key: &str, amount: u64) -> String {
    json!({"lease_id": LeaseId::generate().to_string(), "requirements": [{"key": key, "amount": amount}]}).to_string()
}

#[test]
fn the_contract_holds_over_a_real_socket() {
    let dir = temp_dir("contract");
    let server = start(&dir, "");
    let a = server.addr;
    assert_eq!(
        http(a, "PUT", "/v1/admin/limits", Some(&rolling("rpm", 1)), None).0,
        401
    );
    let (status, report) = http(
        a,
        "PUT",
        "/v1/admin/limits",
        Some(&rolling("rpm", 1)),
        Some(ADMIN_TOKEN),
    );
    assert_eq!(status, 200);
    assert_eq!(report["status"], "active");
    let (status, body) = http(
        a,
        "POST",
        "/v1/reserve",
        Some(&reserve_body("rpm", 1)),
        Some(CLIENT_TOKEN),
    );
    assert_eq!((status, &body["allowed"]), (200, &json!(true)));
    let (status, body) = http(
        a,
        "POST",
        "/v1/reserve",
        Some(&reserve_body("rpm", 1)),
        Some(CLIENT_TOKEN),
    );
    assert_eq!(
        (status, body["error"].as_str()),
        (200, Some("insufficient_capacity:rpm"))
    );
    let (status, body) = http(
        a,
        "POST",
        "/v1/reserve",
        Some(&reserve_body("nope", 1)),
        Some(CLIENT_TOKEN),
    );
    assert_eq!(status, 404);
    assert_eq!(
        body,
        json!({"allowed": false, "retry_after_ms": 0, "error": "unknown_limit_key: nope"})
    );
    let (status, body) = http(a, "POST", "/v1/reserve", Some("{nope"), Some(CLIENT_TOKEN));
    assert_eq!(status, 400);
    assert!(body["error"].as_str().unwrap().starts_with("invalid_json: "));
    let big = "x".repeat(100_000);
    assert_eq!(http(a, "POST", "/v1/reserve", Some(&big), Some(CLIENT_TOKEN)).0, 413);
    assert_eq!(
        http(a, "POST", "/v1/reserve", Some(&reserve_body("rpm", 1)), None).0,
        401
    );
    let complete = json!({"lease_id": LeaseId::generate().to_string()}).to_string();
    let (status, body) = http(a, "POST", "/v1/complete", Some(&complete), Some(CLIENT_TOKEN));
    assert_eq!((status, body), (200, json!({"ok": true})));
    let (status, _) = http(
        a,
        "PUT",
        "/v1/admin/limits",
        Some(&concurrency("rpm", 1)),
        Some(ADMIN_TOKEN),
    );
    assert_eq!(status, 409);
    assert_eq!(http(a, "GET", "/v1/admin/limits/none", None, Some(ADMIN_TOKEN)).0, 404);
    assert_eq!(http(a, "DELETE", "/v1/admin/limits", None, Some(ADMIN_TOKEN)).0, 405);
    assert_eq!(http(a, "GET", "/healthz", None, None), (200, json!({"status": "ok"})));
    let (status, Value::String(metrics)) = http(a, "GET", "/metrics", None, None) else {
        panic!("metrics are text")
    };
    assert_eq!(status, 200);
    assert!(metrics.contains("ratelimiterd_reserve_outcomes_total{key=\"rpm\",outcome=\"allowed\"} 1"));
}

/// A client listing a dead server first and the real one second: every call,
/// admin calls included, reaches the real server with the same lease id.
#[tokio::test]
async fn a_fleet_client_fails_over_from_a_dead_server_with_the_same_lease_id() {
    let dir = temp_dir("failover");
    let server = start(&dir, "");
    let dead = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}", listener.local_addr().unwrap())
    };
    let fleet = |token: &str| {
        HttpClient::new(HttpClientConfig {
            token: Some(token.to_owned()),
            retries_max: 1,
            ..HttpClientConfig::fleet([dead.clone(), server.url()])
        })
        .unwrap()
    };
    let key = LimitKey::new("global:inflight").unwrap();
    let definition = serde_json::from_str(&concurrency("global:inflight", 10)).unwrap();
    fleet(ADMIN_TOKEN).put_limit(&definition).await.unwrap();
    let request = ReserveRequest::new(
        LeaseId::generate(),
        None,
        vec![Requirement {
            key: key.clone(),
            amount: 1,
        }],
    )
    .unwrap();
    let first = fleet(CLIENT_TOKEN).reserve(&request).await.unwrap();
    assert!(first.is_allowed());
    // The real server holds that very lease: a retry there answers the original outcome.
    assert_eq!(server.client(CLIENT_TOKEN).reserve(&request).await.unwrap(), first);
    let report = server.client(ADMIN_TOKEN).limit(&key).await.unwrap().unwrap();
    assert_eq!(report.in_use, 1);
}

#[tokio::test]
async fn limits_survive_restarts_including_a_pending_decrease() {
    let dir = temp_dir("restart");
    // A long check interval keeps the restored decrease pending while it is checked.
    let slow_decreases = "decrease:\n  check_interval_ms: 3600000\n";
    let mut server = start(&dir, slow_decreases);
    let admin = server.client(ADMIN_TOKEN);
    let key = LimitKey::new("global:inflight").unwrap();
    let definition = serde_json::from_str(&concurrency("global:inflight", 10)).unwrap();
    admin.put_limit(&definition).await.unwrap();
    admin
        .put_limit(&serde_json::from_str(&rolling("global:rpm", 7)).unwrap())
        .await
        .unwrap();
    let client = server.client(CLIENT_TOKEN);
    let leases = [(); 3].map(|()| LeaseId::generate());
    for lease in leases {
        let request = ReserveRequest::new(
            lease,
            None,
            vec![Requirement {
                key: key.clone(),
                amount: 1,
            }],
        )
        .unwrap();
        assert!(client.reserve(&request).await.unwrap().is_allowed());
    }
    let decreased = admin.put_limit(&definition.with_capacity(2).unwrap()).await.unwrap();
    assert_eq!(decreased.state.pending_decrease_to(), 2);
    assert!(server.terminate().success());

    let server = start(&dir, slow_decreases);
    let report = server.client(ADMIN_TOKEN).limit(&key).await.unwrap().unwrap();
    assert_eq!(report.state.status(), ratelimiter::LimitStatus::Decreasing);
    assert_eq!(
        (report.state.definition().capacity(), report.state.pending_decrease_to()),
        (10, 2)
    );
    let rpm = server
        .client(ADMIN_TOKEN)
        .limit(&LimitKey::new("global:rpm").unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(rpm.state.definition().capacity(), 7);
    let request = ReserveRequest::new(
        LeaseId::generate(),
        None,
        vec![Requirement {
            key: key.clone(),
            amount: 1,
        }],
    )
    .unwrap();
    let outcome = server.client(CLIENT_TOKEN).reserve(&request).await.unwrap();
    assert!(matches!(
        outcome,
        ReserveOutcome::Denied(ratelimiter::Denial::LimitDecreasing {
            retry_after_ms: 10_000,
            ..
        })
    ));
    drop(server);

    // The 3 units are still held after the restarts (the memory snapshot), so the
    // decrease waits; once the leases complete, it is carried out and persisted.
    let server = start(&dir, "decrease:\n  check_interval_ms: 20\n");
    let admin = server.client(ADMIN_TOKEN);
    assert_eq!(admin.limit(&key).await.unwrap().unwrap().in_use, 3);
    for lease in leases {
        let complete = ratelimiter::CompleteRequest::new(lease, None, Vec::new()).unwrap();
        server.client(CLIENT_TOKEN).complete(&complete).await.unwrap();
    }
    let deadline = Instant::now() + WAIT_MAX;
    loop {
        let report = admin.limit(&key).await.unwrap().unwrap();
        if report.state.status() == ratelimiter::LimitStatus::Active {
            assert_eq!(report.state.definition().capacity(), 2);
            break;
        }
        assert!(Instant::now() < deadline, "the decrease was not carried out in time");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The backend shows the decrease just before the registry file does: wait for
    // the file too.
    loop {
        let on_disk: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("limits.json")).unwrap()).unwrap();
        let entry = on_disk
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["key"] == "global:inflight")
            .unwrap()
            .clone();
        if entry["status"] == "active" {
            assert_eq!(
                (&entry["capacity"], &entry["pending_decrease_to"]),
                (&json!(2), &json!(0))
            );
            break;
        }
        assert!(Instant::now() < deadline, "the decrease was not persisted in time");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[test]
fn sigterm_lets_the_request_in_flight_finish() {
    let dir = temp_dir("graceful");
    let mut server = start(&dir, "");
    http(
        server.addr,
        "PUT",
        "/v1/admin/limits",
        Some(&rolling("rpm", 5)),
        Some(ADMIN_TOKEN),
    );
    // Send the head and half the body, then SIGTERM, then the rest.
    let body = reserve_body("rpm", 1);
    let (first, second) = body.split_at(body.len() / 2);
    let mut session = Session::open(server.addr);
    let head = format!(
        "POST /v1/reserve HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\nauthorization: Bearer {CLIENT_TOKEN}\r\nconnection: close\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    session.write(head.as_bytes());
    session.write(first.as_bytes());
    // Wait, bounded, until the server is handling the request.
    let deadline = Instant::now() + WAIT_MAX;
    while !metrics_text(server.addr).contains("\nratelimiterd_requests_in_flight 1\n") {
        assert!(Instant::now() < deadline, "the request never started");
        std::thread::sleep(Duration::from_millis(10));
    }
    server.signal_term();
    // Shutdown has begun once new connections are refused.
    while TcpStream::connect(server.addr).is_ok() {
        assert!(Instant::now() < deadline, "the server kept accepting after SIGTERM");
        std::thread::sleep(Duration::from_millis(10));
    }
    session.write(second.as_bytes());
    let answer = session.read_response().expect("the answer to the request in flight");
    assert_eq!((answer.status, &answer.json()["allowed"]), (200, &json!(true)));
    assert!(server.wait_exit().success());
}

fn metrics_text(addr: SocketAddr) -> String {
    match http(addr, "GET", "/metrics", None, None) {
        (200, Value::String(text)) => text,
        other => panic!("unexpected metrics answer {other:?}"),
    }
}

fn cli(args: &[&str], url: &str, token: &str) -> (i32, Value, String) {
    let output = Command::new(BIN)
        .args(args)
        .env("RATELIMITERD_URL", url)
        .env("RATELIMITERD_TOKEN", token)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout).to_string();
    let stderr = String::from_utf8_lossy(&output.stderr).to_string();
    (
        output.status.code().unwrap_or(-1),
        serde_json::from_str(&stdout).unwrap_or(Value::Null),
        stderr,
    )
}

#[test]
fn the_operator_cli_talks_to_the_server() {
    let dir = temp_dir("cli");
    let server = start(&dir, "");
    let url = server.url();
    let put = [
        "limits",
        "put",
        "--key",
        "global:tpm",
        "--kind",
        "rolling",
        "--capacity",
        "100",
        "--window-seconds",
        "60",
        "--unit",
        "tokens",
    ];
    let (code, report, stderr) = cli(&put, &url, ADMIN_TOKEN);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!((&report["capacity"], &report["unit"]), (&json!(100), &json!("tokens")));
    let (code, _, stderr) = cli(&put, &url, CLIENT_TOKEN);
    assert_eq!(code, 1);
    assert!(stderr.contains("unauthorized"), "{stderr}");
    let (code, report, _) = cli(&["limits", "get", "global:tpm"], &url, ADMIN_TOKEN);
    assert_eq!((code, &report["key"]), (0, &json!("global:tpm")));
    let (code, list, _) = cli(&["limits", "list"], &url, ADMIN_TOKEN);
    assert_eq!((code, list.as_array().map(Vec::len)), (0, Some(1)));
    let (code, _, stderr) = cli(&["limits", "get", "global:none"], &url, ADMIN_TOKEN);
    assert_eq!(code, 1);
    assert!(stderr.contains("unknown_limit_key: global:none"), "{stderr}");

    let (code, answer, _) = cli(&["reserve", "-r", "global:tpm=80"], &url, CLIENT_TOKEN);
    assert_eq!((code, &answer["allowed"]), (0, &json!(true)));
    let lease = answer["lease_id"].as_str().unwrap().to_owned();
    let (code, answer, _) = cli(&["reserve", "-r", "global:tpm=30"], &url, CLIENT_TOKEN);
    assert_eq!(
        (code, answer["error"].as_str()),
        (3, Some("insufficient_capacity:global:tpm"))
    );
    let (code, answer, _) = cli(
        &["complete", "--lease-id", &lease, "-a", "global:tpm=20"],
        &url,
        CLIENT_TOKEN,
    );
    assert_eq!((code, answer), (0, json!({"ok": true})));
    let (code, _, _) = cli(&["reserve", "-r", "global:tpm=30"], &url, CLIENT_TOKEN);
    assert_eq!(code, 0);
    // `--url` and `--token` before the subcommand as well as after it (issue 15).
    for args in [
        &["--url", &url, "--token", ADMIN_TOKEN, "limits", "list"][..],
        &["limits", "list", "--url", &url, "--token", ADMIN_TOKEN],
    ] {
        let output = Command::new(BIN)
            .args(args)
            .env_remove("RATELIMITERD_URL")
            .env_remove("RATELIMITERD_TOKEN")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(0), "{args:?}: {stderr}");
        let list: Value = serde_json::from_slice(&output.stdout).unwrap();
        assert_eq!(list.as_array().map(Vec::len), Some(1), "{args:?}");
    }
}

#[test]
fn bad_configurations_and_registries_stop_startup_with_a_clear_message() {
    let dir = temp_dir("bad-startup");
    let run = |config: &Path| {
        let output = Command::new(BIN)
            .arg("--config")
            .arg(config)
            .stderr(Stdio::piped())
            .output()
            .unwrap();
        (
            output.status.code(),
            String::from_utf8_lossy(&output.stderr).to_string(),
        )
    };
    let config = dir.join("unknown.yaml");
    std::fs::write(&config, "server:\n  listen_adr: \":1\"\n").unwrap();
    let (code, stderr) = run(&config);
    assert_eq!(code, Some(1));
    assert!(
        stderr.contains(config.to_str().unwrap()) && stderr.contains("listen_adr"),
        "{stderr}"
    );

    let registry = dir.join("limits.json");
    std::fs::write(&registry, r#"[{"key":"ok","kind":"rolling","capacity":1,"window_seconds":60},{"key":"bad","kind":"rolling","capacity":0,"window_seconds":60}]"#).unwrap();
    let config = write_config_on(&dir, BackendConfig::Memory, "", "");
    let (code, stderr) = run(&config);
    assert_eq!(code, Some(1));
    assert!(
        stderr.contains(registry.to_str().unwrap()) && stderr.contains("entry 1 (bad)"),
        "{stderr}"
    );
    // The bad registry is left as it was.
    assert!(std::fs::read_to_string(&registry).unwrap().contains("\"bad\""));

    let valid = dir.join("valid.yaml");
    std::fs::write(&valid, "server:\n  listen_addr: \":9\"\ndecrease:\n  retry_ms: 5000\n").unwrap();
    let output = Command::new(BIN)
        .arg("--config")
        .arg(&valid)
        .arg("check-config")
        .output()
        .unwrap();
    assert!(output.status.success());
    assert_eq!(String::from_utf8_lossy(&output.stdout), "configuration is valid\n");
    let output = Command::new(BIN)
        .arg("--config")
        .arg(dir.join("unknown.yaml"))
        .arg("check-config")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));

    if !cfg!(feature = "tigerbeetle") {
        let config = dir.join("tb.yaml");
        std::fs::write(&config, "server:\n  backend: tigerbeetle\n").unwrap();
        let (code, stderr) = run(&config);
        assert_eq!(code, Some(1));
        assert!(stderr.contains("--features tigerbeetle"), "{stderr}");
    }
}

#[test]
fn a_connection_past_the_limit_replaces_the_idle_one() {
    let dir = temp_dir("connections");
    let server = Daemon::start_on(&dir, BackendConfig::Memory, "  connections_max: 1\n", "");
    // The first connection takes the only slot and stays idle.
    let mut holder = TcpStream::connect(server.addr).unwrap();
    holder.set_read_timeout(Some(WAIT_MAX)).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    // A new connection is served: the idle one is closed to make room, so an
    // idle flood never takes the API (and /healthz) down.
    let mut stream = TcpStream::connect(server.addr).unwrap();
    stream.set_read_timeout(Some(WAIT_MAX)).unwrap();
    let _ = stream.write_all(b"GET /healthz HTTP/1.1\r\nhost: t\r\nconnection: close\r\n\r\n");
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    assert!(
        answer.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&answer)
    );
    let mut rest = Vec::new();
    let read = holder.read_to_end(&mut rest);
    assert!(
        matches!(read, Ok(0)) || read.is_err() && rest.is_empty(),
        "the idle connection was closed: {read:?} {}",
        String::from_utf8_lossy(&rest)
    );
}
