//! The bad-input tests' server and cases (tests/bad_input.rs): a [`Fixture`]
//! with live usage on every kind of limit, the [`Case`] of one bad request with
//! its documented answer, and the cases of each endpoint ([`cases`]).

pub mod cases;

use std::net::SocketAddr;

use ratelimiter::LeaseId;
use serde_json::{json, Value};

use crate::support::raw::{self, request_bytes, Response};
use crate::support::{temp_dir, Daemon, TempDir, ADMIN_TOKEN, CLIENT_TOKEN};

/// Windows and timeouts far longer than any test, so nothing expires under it.
pub const HOLD_SECONDS: u64 = 3_600;

/// A server with three limits and one live lease holding units on each, so a
/// usage change in either direction shows in the snapshot.
///
/// Its keys start with a prefix of its own, so fixtures never share a limit,
/// even on one TigerBeetle cluster.
pub struct Fixture {
    pub daemon: Daemon,
    _dir: TempDir,
    /// The live lease.
    pub holder: String,
    /// The start of every key of this fixture.
    pub prefix: String,
    /// A rolling key with overage `none` (extra usage is dropped).
    rolling: String,
    /// A rolling key with overage `debt`.
    debt: String,
    /// A concurrency key.
    inflight: String,
}

impl Fixture {
    pub fn start(name: &str, server_extra: &str) -> Fixture {
        let dir = temp_dir(name);
        let daemon = Daemon::start(&dir, server_extra, "");
        let prefix = format!("bad:{name}:{}", LeaseId::generate());
        let fixture = Fixture {
            daemon,
            _dir: dir,
            holder: lease(),
            rolling: format!("{prefix}:rolling"),
            debt: format!("{prefix}:debt"),
            inflight: format!("{prefix}:inflight"),
            prefix,
        };
        let (rolling, debt, inflight) = fixture.keys();
        for definition in [
            json!({"key": rolling, "kind": "rolling", "capacity": 1000, "window_seconds": HOLD_SECONDS}),
            json!({"key": debt, "kind": "rolling", "capacity": 1000, "window_seconds": HOLD_SECONDS, "overage": "debt"}),
            json!({"key": inflight, "kind": "concurrency", "capacity": 10, "timeout_seconds": HOLD_SECONDS}),
        ] {
            assert_eq!(
                fixture.admin("PUT", "/v1/admin/limits", &definition.to_string()).status,
                200
            );
        }
        let holds =
            json!([{"key": rolling, "amount": 10}, {"key": debt, "amount": 10}, {"key": inflight, "amount": 1}]);
        let answer = fixture.reserve(&fixture.holder, holds);
        assert_eq!((answer.status, &answer.json()["allowed"]), (200, &json!(true)));
        fixture
    }

    /// The rolling, debt and concurrency keys.
    pub fn keys(&self) -> (&str, &str, &str) {
        (&self.rolling, &self.debt, &self.inflight)
    }

    pub fn addr(&self) -> SocketAddr {
        self.daemon.addr
    }

    pub fn admin(&self, method: &str, path: &str, body: &str) -> Response {
        self.send(method, path, ADMIN_TOKEN, body.as_bytes())
    }

    pub fn client(&self, path: &str, body: &[u8]) -> Response {
        self.send("POST", path, CLIENT_TOKEN, body)
    }

    /// One request; a missing answer fails with the server's log.
    pub fn send(&self, method: &str, path: &str, token: &str, body: &[u8]) -> Response {
        raw::exchange(self.addr(), &request_bytes(method, path, Some(token), body))
            .unwrap_or_else(|e| panic!("{method} {path}: no answer ({e}); server logs:\n{}", self.logs()))
    }

    pub fn reserve(&self, lease: &str, requirements: Value) -> Response {
        let body = json!({"lease_id": lease, "requirements": requirements}).to_string();
        self.client("/v1/reserve", body.as_bytes())
    }

    pub fn complete(&self, lease: &str, actuals: Value) -> Response {
        let body = json!({"lease_id": lease, "actuals": actuals}).to_string();
        self.client("/v1/complete", body.as_bytes())
    }

    /// Every limit with its usage and debt.
    pub fn snapshot(&self) -> Value {
        let answer = self.admin("GET", "/v1/admin/limits", "");
        assert_eq!(answer.status, 200, "{}", answer.text());
        answer.json()
    }

    pub fn report(&self, key: &str) -> Value {
        let answer = self.admin("GET", &format!("/v1/admin/limits/{key}"), "");
        assert_eq!(answer.status, 200, "{}", answer.text());
        answer.json()
    }

    /// Sends every case, checks its answer, then checks that no usage changed
    /// and the server still answers.
    pub fn check(&self, cases: &[Case]) {
        let before = self.snapshot();
        for case in cases {
            let token = if case.path.starts_with("/v1/admin") {
                ADMIN_TOKEN
            } else {
                CLIENT_TOKEN
            };
            let answer = raw::exchange(
                self.addr(),
                &request_bytes(case.method, &case.path, Some(token), &case.body),
            )
            .unwrap_or_else(|e| panic!("{}: no answer ({e}); server logs:\n{}", case.what, self.logs()));
            assert_eq!(answer.status, case.status, "{}: {}", case.what, answer.text());
            assert_error_body(&answer, case.code, &case.what);
        }
        assert_eq!(self.snapshot(), before, "a rejected request changed usage");
        assert_eq!(raw::request(self.addr(), "GET", "/healthz", None, b"").status, 200);
    }

    pub fn logs(&self) -> String {
        self.daemon.logs().join("\n")
    }
}

/// One bad request and its documented answer.
pub struct Case {
    pub what: String,
    pub method: &'static str,
    pub path: String,
    pub body: Vec<u8>,
    pub status: u16,
    /// The start of the `error` text.
    pub code: &'static str,
}

/// A case on `path`, sent with PUT to the limits' collection and POST elsewhere.
pub fn case(what: impl Into<String>, path: &str, body: impl Into<Vec<u8>>, status: u16, code: &'static str) -> Case {
    let method = if path == "/v1/admin/limits" { "PUT" } else { "POST" };
    Case {
        what: what.into(),
        method,
        path: path.to_owned(),
        body: body.into(),
        status,
        code,
    }
}

/// An error answer is one JSON object whose `error` starts with `code`, and it
/// carries nothing from the server's insides.
pub fn assert_error_body(answer: &Response, code: &str, what: &str) {
    let body = answer.json();
    let error = answer.error();
    assert!(error.starts_with(code), "{what}: expected {code:?}, got {body}");
    assert!(body.is_object(), "{what}: {body}");
    assert_no_internals(answer, what);
}

/// Error bodies never show paths, source locations, panics or backend names.
fn assert_no_internals(answer: &Response, what: &str) {
    let text = answer.text().to_lowercase();
    for leak in [
        "/tmp",
        ".rs:",
        "panicked",
        "tigerbeetle",
        "registry",
        "limits.json",
        "backtrace",
    ] {
        assert!(!text.contains(leak), "{what}: the body shows {leak:?}: {text}");
    }
}

/// A fresh lease id, as text.
pub fn lease() -> String {
    LeaseId::generate().to_string()
}

/// A reserve body with `requirements` as written, valid or not.
pub fn reserve_text(lease: &str, requirements: &str) -> String {
    format!(r#"{{"lease_id":"{lease}","requirements":{requirements}}}"#)
}
