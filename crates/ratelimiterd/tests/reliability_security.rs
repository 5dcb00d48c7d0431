//! Security of the real binary (issue 7): it binds to loopback by default; with
//! tokens configured no admin or client call succeeds without the right one
//! (missing, wrong, truncated, extended, wrong scheme, the other kind's), and a
//! refused call changes nothing; error bodies never show the server's insides.

mod support;

use std::time::{Duration, Instant};

use ratelimiter::LeaseId;
use ratelimiterd::Config;
use serde_json::{json, Value};
use support::raw::{self, request, Response};
use support::{temp_dir, Daemon, TempDir, ADMIN_TOKEN, CLIENT_TOKEN, WAIT_MAX};

/// A key of this test process alone, so tests never share a limit, even on one
/// TigerBeetle cluster.
fn key(name: &str) -> String {
    static RUN: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    format!("sec:{}:{name}", RUN.get_or_init(|| LeaseId::generate().to_string()))
}

#[test]
fn the_default_configuration_listens_on_loopback_only() {
    assert!(Config::defaults().listen_addr().ip().is_loopback());
    // The binary without --config, in an empty directory: it either listens on
    // 127.0.0.1:8080 or, when that port is taken, says it could not; either way
    // the address it uses is loopback.
    let dir = temp_dir("default-bind");
    let logs = match Daemon::start_defaults(&dir) {
        Ok(daemon) => daemon.logs().join("\n"),
        Err(logs) => logs,
    };
    let line = logs
        .lines()
        .find(|line| line.contains("listening") || line.contains("listen "))
        .expect("the server logs where it listens, or why it cannot");
    assert!(line.contains("127.0.0.1:8080"), "{line}");
}

/// A server with one limit, and its directory (deleted when dropped, so the
/// caller keeps it while the server runs).
fn fixture(name: &str) -> (TempDir, Daemon) {
    let dir = temp_dir(name);
    let daemon = Daemon::start(&dir, "", "");
    let definition = json!({"key": key("tokens"), "kind": "rolling", "capacity": 100, "window_seconds": 3600});
    raw::ok(daemon.addr, "PUT", "/v1/admin/limits", ADMIN_TOKEN, &definition);
    (dir, daemon)
}

/// Every endpoint that needs a token, with a body that would succeed.
fn guarded_calls() -> Vec<(&'static str, String, String, bool)> {
    let key = key("tokens");
    let reserve = json!({"lease_id": LeaseId::generate().to_string(), "requirements": [{"key": key, "amount": 1}]});
    let complete = json!({"lease_id": LeaseId::generate().to_string()});
    let define = json!({"key": key, "kind": "rolling", "capacity": 200, "window_seconds": 3600});
    // (method, path, body, admin only)
    vec![
        ("POST", "/v1/reserve".into(), reserve.to_string(), false),
        ("POST", "/v1/complete".into(), complete.to_string(), false),
        ("PUT", "/v1/admin/limits".into(), define.to_string(), true),
        ("GET", "/v1/admin/limits".into(), String::new(), true),
        ("GET", format!("/v1/admin/limits/{key}"), String::new(), true),
    ]
}

/// Sends one call with `authorization` as the raw header value (or none).
fn call(daemon: &Daemon, method: &str, path: &str, body: &str, authorization: Option<&[u8]>) -> Response {
    let mut bytes = format!("{method} {path} HTTP/1.1\r\nhost: t\r\nconnection: close\r\n").into_bytes();
    if let Some(value) = authorization {
        bytes.extend_from_slice(b"authorization: ");
        bytes.extend_from_slice(value);
        bytes.extend_from_slice(b"\r\n");
    }
    if !body.is_empty() {
        bytes.extend_from_slice(b"content-type: application/json\r\n");
    }
    bytes.extend_from_slice(format!("content-length: {}\r\n\r\n{body}", body.len()).as_bytes());
    raw::exchange(daemon.addr, &bytes).unwrap_or_else(|e| panic!("{method} {path}: no answer: {e}"))
}

fn snapshot(daemon: &Daemon) -> Value {
    request(daemon.addr, "GET", "/v1/admin/limits", Some(ADMIN_TOKEN), b"").json()
}

#[test]
fn no_call_succeeds_without_the_right_token() {
    let (_dir, daemon) = fixture("tokens");
    let bearer = |token: &str| format!("Bearer {token}").into_bytes();
    let mut wrong: Vec<(&str, Option<Vec<u8>>)> = vec![
        ("no header", None),
        ("empty header", Some(Vec::new())),
        ("scheme only", Some(b"Bearer".to_vec())),
        ("scheme and a space", Some(b"Bearer ".to_vec())),
        (
            "a wrong token of the same length",
            Some(bearer(&"x".repeat(ADMIN_TOKEN.len()))),
        ),
        ("the token without a scheme", Some(ADMIN_TOKEN.as_bytes().to_vec())),
        ("the Basic scheme", Some(format!("Basic {ADMIN_TOKEN}").into_bytes())),
        (
            "two spaces after the scheme",
            Some(format!("Bearer  {ADMIN_TOKEN}").into_bytes()),
        ),
        ("a trailing character", Some(bearer(&format!("{ADMIN_TOKEN}x")))),
        (
            "the last character cut",
            Some(bearer(&ADMIN_TOKEN[..ADMIN_TOKEN.len() - 1])),
        ),
        ("the token twice", Some(bearer(&format!("{ADMIN_TOKEN}{ADMIN_TOKEN}")))),
        (
            "a comma-joined list",
            Some(format!("Bearer {}, Bearer {ADMIN_TOKEN}", "x".repeat(20)).into_bytes()),
        ),
        (
            "an obs-text byte in the token",
            Some([bearer(ADMIN_TOKEN), vec![0xff]].concat()),
        ),
        ("a token of 100 KiB", Some(bearer(&"t".repeat(100 * 1024)))),
    ];
    let before = snapshot(&daemon);
    for (method, path, body, admin_only) in guarded_calls() {
        let client_token = Some(bearer(CLIENT_TOKEN));
        if admin_only {
            wrong.push(("the client token", client_token));
        }
        for (what, authorization) in &wrong {
            let answer = call(&daemon, method, &path, &body, authorization.as_deref());
            if answer.status == 431 {
                // The HTTP layer refuses the 100 KiB header before any route runs.
                assert!(what.contains("100 KiB"), "{what}");
                continue;
            }
            assert_eq!(answer.status, 401, "{method} {path} with {what}: {}", answer.text());
            // Missing and wrong look the same.
            assert_eq!(answer.json(), json!({"error": "unauthorized"}), "{what}");
            assert_eq!(answer.header("www-authenticate"), Some("Bearer"), "{what}");
        }
        if admin_only {
            wrong.pop();
        }
        // A refused call is refused before its body is read: even a malformed one is 401.
        let answer = call(&daemon, method, &path, "{malformed", None);
        assert_eq!(answer.status, 401, "{method} {path} malformed without a token");
    }
    assert_eq!(snapshot(&daemon), before, "a refused call changed something");

    // The right token works; client endpoints also take the admin token, as documented.
    for token in [ADMIN_TOKEN, CLIENT_TOKEN] {
        for (method, path, body, admin_only) in guarded_calls() {
            if admin_only && token == CLIENT_TOKEN {
                continue;
            }
            let answer = call(&daemon, method, &path, &body, Some(&bearer(token)));
            assert_eq!(answer.status, 200, "{method} {path}: {}", answer.text());
        }
    }
    // Health and metrics need no token and show no token.
    for path in ["/healthz", "/metrics"] {
        let answer = call(&daemon, "GET", path, "", None);
        assert_eq!(answer.status, 200);
        assert!(!answer.text().contains(ADMIN_TOKEN) && !answer.text().contains(CLIENT_TOKEN));
    }
}

#[test]
fn error_bodies_never_show_internals() {
    let dir = temp_dir("internals");
    let daemon = Daemon::start(&dir, "", "");
    // A directory where the registry's temporary file goes makes every write fail.
    std::fs::create_dir_all(dir.join("limits.json.tmp")).expect("blocker");
    let key = key("internals");
    let definition = json!({"key": key, "kind": "rolling", "capacity": 100, "window_seconds": 60});
    let answer = request(
        daemon.addr,
        "PUT",
        "/v1/admin/limits",
        Some(ADMIN_TOKEN),
        definition.to_string().as_bytes(),
    );
    assert_eq!(answer.status, 500);
    // The reason (the operating system's, issue 21), never the path.
    assert_eq!(
        answer.json(),
        json!({"error": "internal_error: the registry file could not be written (is a directory); the limit was not changed"})
    );
    // The detail is in the log, for the operator.
    let deadline = Instant::now() + WAIT_MAX;
    while !daemon
        .logs()
        .iter()
        .any(|l| l.contains("registry file could not be written") && l.contains("limits.json"))
    {
        assert!(
            Instant::now() < deadline,
            "the log lacks the detail:\n{}",
            daemon.logs().join("\n")
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    // Nothing was defined.
    let answer = request(
        daemon.addr,
        "GET",
        &format!("/v1/admin/limits/{key}"),
        Some(ADMIN_TOKEN),
        b"",
    );
    assert_eq!(answer.status, 404);
    // The messages of 4xx answers name what was wrong with the request, and only that.
    for (path, body) in [
        ("/v1/reserve", "{\"lease_id\":"),
        ("/v1/reserve", "{\"lease_id\":\"x\",\"requirements\":[]}"),
        ("/v1/complete", "[]"),
    ] {
        let text = request(daemon.addr, "POST", path, Some(CLIENT_TOKEN), body.as_bytes()).text();
        for leak in [dir.to_str().unwrap(), ".rs:", "panicked", "serde", "ratelimiter::"] {
            assert!(!text.contains(leak), "{path} {body}: {text}");
        }
    }
}
