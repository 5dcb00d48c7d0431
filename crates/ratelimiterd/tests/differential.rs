//! The same request sequence against a memory-backend server and a
//! TigerBeetle-backend server (real binaries, a real local cluster): every step
//! must get the same status, `allowed`, error code, presence of a retry hint,
//! and the same limit states read back after it (docs/decisions.md). Each step
//! also checks the answer the decisions prescribe, so two servers that agree
//! on a wrong answer fail too.

#![cfg(feature = "tigerbeetle")]

mod support;

use std::time::{Duration, Instant};

use ratelimiter::tigerbeetle::LocalCluster;
use ratelimiter::LeaseId;
use serde_json::{json, Value};
use support::{raw, temp_dir, BackendConfig, Daemon, ADMIN_TOKEN, CLIENT_TOKEN, WAIT_MAX};

/// The `tigerbeetle:` settings: few sessions, answers within 5 s.
const TIGERBEETLE_SETTINGS: &str = "  sessions: 2\n  request_timeout_ms: 5000\n";
/// How often a wait for the periodic decrease looks again.
const POLL_MS: u64 = 100;

/// The two servers and the unique key prefix of this run.
struct Pair {
    memory: Daemon,
    tigerbeetle: Daemon,
    prefix: String,
}

/// What is compared of one answer: status, `allowed`, error code (the denial's
/// whole `code:key`, or an error's code before its message), whether a retry
/// hint > 0 was given, and `ok`.
fn normalized(status: u16, body: &Value) -> Value {
    let error = body["error"].as_str().map(|e| {
        if body.get("allowed").is_some() {
            e.to_owned()
        } else {
            e.split(':').next().unwrap_or(e).to_owned()
        }
    });
    json!({
        "status": status,
        "allowed": body.get("allowed"),
        "error": error,
        "hint": body["retry_after_ms"].as_u64().map(|ms| ms > 0),
        "ok": body.get("ok"),
    })
}

/// What is compared of a limit's state read back.
fn state_of(status: u16, body: &Value) -> Value {
    json!({
        "status": status,
        "kind": body["kind"],
        "capacity": body["capacity"],
        "state": body["status"],
        "pending_decrease_to": body["pending_decrease_to"],
        "in_use": body["in_use"],
        "debt": body["debt"],
    })
}

fn call(server: &Daemon, method: &str, path: &str, body: &Value) -> (u16, Value) {
    let token = if path.starts_with("/v1/admin") {
        ADMIN_TOKEN
    } else {
        CLIENT_TOKEN
    };
    let bytes = if body.is_null() {
        String::new()
    } else {
        body.to_string()
    };
    let answer = raw::request(server.addr, method, path, Some(token), bytes.as_bytes());
    (answer.status, answer.value())
}

impl Pair {
    fn key(&self, name: &str) -> String {
        format!("{}:{name}", self.prefix)
    }

    /// Sends one request to both servers; asserts they answer alike and
    /// returns the memory server's normalized answer and body.
    fn step(&self, what: &str, method: &str, path: &str, body: Value) -> (Value, Value) {
        let (status_m, body_m) = call(&self.memory, method, path, &body);
        let (status_t, body_t) = call(&self.tigerbeetle, method, path, &body);
        let (m, t) = (normalized(status_m, &body_m), normalized(status_t, &body_t));
        assert_eq!(m, t, "{what}: memory {body_m} against tigerbeetle {body_t}");
        (m, body_m)
    }

    /// Reads every key back from both servers; asserts the states match.
    fn states_match(&self, what: &str, names: &[&str]) {
        for name in names {
            let path = format!("/v1/admin/limits/{}", self.key(name));
            let (status_m, body_m) = call(&self.memory, "GET", &path, &Value::Null);
            let (status_t, body_t) = call(&self.tigerbeetle, "GET", &path, &Value::Null);
            assert_eq!(
                state_of(status_m, &body_m),
                state_of(status_t, &body_t),
                "{what}: state of {name}: memory {body_m} against tigerbeetle {body_t}"
            );
        }
    }

    fn put(&self, what: &str, definition: Value) -> Value {
        self.step(what, "PUT", "/v1/admin/limits", definition).0
    }

    fn reserve(&self, what: &str, lease: LeaseId, needs: &[(&str, u64)]) -> (Value, Value) {
        let requirements: Vec<Value> = needs
            .iter()
            .map(|(name, amount)| json!({"key": self.key(name), "amount": amount}))
            .collect();
        let body = json!({"lease_id": lease.to_string(), "requirements": requirements});
        self.step(what, "POST", "/v1/reserve", body)
    }

    fn complete(&self, what: &str, lease: LeaseId, actuals: &[(&str, u64)]) -> Value {
        let actuals: Vec<Value> = actuals
            .iter()
            .map(|(name, amount)| json!({"key": self.key(name), "actual_amount": amount}))
            .collect();
        let body = json!({"lease_id": lease.to_string(), "actuals": actuals});
        self.step(what, "POST", "/v1/complete", body).0
    }
}

fn rolling(key: &str, capacity: u64, overage: &str) -> Value {
    json!({"key": key, "kind": "rolling", "capacity": capacity, "window_seconds": 600, "overage": overage})
}

fn allowed() -> Value {
    json!({"status": 200, "allowed": true, "error": null, "hint": false, "ok": null})
}

fn denied(error: &str, hint: bool) -> Value {
    json!({"status": 200, "allowed": false, "error": error, "hint": hint, "ok": null})
}

fn failed(status: u16, code: &str) -> Value {
    json!({"status": status, "allowed": null, "error": code, "hint": null, "ok": null})
}

fn ok() -> Value {
    json!({"status": 200, "allowed": null, "error": null, "hint": null, "ok": true})
}

fn start_pair(cluster: &LocalCluster, memory_dir: &std::path::Path, tb_dir: &std::path::Path) -> Pair {
    let backend = BackendConfig::TigerBeetle {
        addresses: cluster.address(),
        settings: TIGERBEETLE_SETTINGS,
    };
    let pair = Pair {
        memory: Daemon::start_on(memory_dir, BackendConfig::Memory, "", ""),
        tigerbeetle: Daemon::start_on(tb_dir, backend, "", ""),
        prefix: format!("diff:{}", LeaseId::generate()).to_lowercase(),
    };
    let deadline = Instant::now() + WAIT_MAX;
    while call(&pair.tigerbeetle, "GET", "/healthz", &Value::Null).0 != 200 {
        assert!(Instant::now() < deadline, "the TigerBeetle server never became healthy");
        std::thread::sleep(Duration::from_millis(POLL_MS));
    }
    pair
}

#[test]
fn both_backends_answer_every_step_alike() {
    let cluster = LocalCluster::start().expect("a local TigerBeetle");
    let (memory_dir, tb_dir) = (temp_dir("diff-memory"), temp_dir("diff-tb"));
    let p = start_pair(&cluster, &memory_dir, &tb_dir);
    let names = ["a", "b", "c", "d"];
    let (a, b, c, d) = (p.key("a"), p.key("b"), p.key("c"), p.key("d"));
    p.put("define a", rolling(&a, 10, "none"));
    p.put("define b", rolling(&b, 5, "none"));
    p.put("define d", rolling(&d, 10, "debt"));
    let concurrency = json!({"key": c, "kind": "concurrency", "capacity": 2, "timeout_seconds": 600});
    p.put("define c", concurrency);
    let l1 = LeaseId::generate();
    assert_eq!(p.reserve("9 of a", l1, &[("a", 9)]).0, allowed());
    p.put("decrease a", rolling(&a, 5, "none"));
    p.states_match("a decreasing", &names);

    let exceeds = denied(&format!("exceeds_capacity:{b}"), false);
    assert_eq!(
        p.reserve(
            "[a decreasing, b too large]",
            LeaseId::generate(),
            &[("a", 1), ("b", 6)]
        )
        .0,
        exceeds
    );
    assert_eq!(
        p.reserve(
            "[b too large, a decreasing]",
            LeaseId::generate(),
            &[("b", 6), ("a", 1)]
        )
        .0,
        exceeds
    );
    let l2 = LeaseId::generate();
    let decreasing = denied(&format!("limit_decreasing:{a}"), true);
    assert_eq!(p.reserve("a decreasing", l2, &[("b", 1), ("a", 1)]).0, decreasing);
    let unknown = p
        .reserve("unknown key", LeaseId::generate(), &[("b", 1), ("ghost", 1)])
        .0;
    assert_eq!(unknown["status"], 404);

    let l3 = LeaseId::generate();
    let (first, first_body) = p.reserve("b and c", l3, &[("b", 5), ("c", 1)]);
    assert_eq!(first, allowed());
    let (again, again_body) = p.reserve("replayed", l3, &[("c", 1), ("b", 5)]);
    assert_eq!(again, allowed());
    assert_eq!(again_body["reserved_at_unix_ms"], first_body["reserved_at_unix_ms"]);
    assert_eq!(p.reserve("reused", l3, &[("b", 4)]).0, failed(409, "conflict"));
    let l4 = LeaseId::generate();
    assert_eq!(
        p.reserve("b full", l4, &[("b", 1)]).0,
        denied(&format!("insufficient_capacity:{b}"), true)
    );
    assert_eq!(
        p.reserve("b full, same id", l4, &[("b", 1)]).0,
        denied("lease_already_failed", false)
    );
    assert_eq!(p.reserve("l2 was not burnt", l2, &[("c", 1)]).0, allowed());
    p.states_match("after the reserves", &names);

    assert_eq!(
        p.complete("actual for c", l3, &[("c", 1)]),
        failed(400, "invalid_request")
    );
    assert_eq!(
        p.complete("actual for a", l3, &[("a", 1)]),
        failed(400, "invalid_request")
    );
    p.states_match("bad actuals changed nothing", &names);
    assert_eq!(p.complete("l3 with 3 of b", l3, &[("b", 3)]), ok());
    assert_eq!(p.complete("l3 again", l3, &[("b", 1)]), ok());
    assert_eq!(p.complete("unknown lease", LeaseId::generate(), &[("b", 1)]), ok());
    p.states_match("after the completes", &names);

    let l5 = LeaseId::generate();
    assert_eq!(p.reserve("4 of d", l5, &[("d", 4)]).0, allowed());
    assert_eq!(p.complete("12 of d", l5, &[("d", 12)]), ok());
    p.states_match("overage as debt", &names);

    let kind_change = json!({"key": c, "kind": "rolling", "capacity": 2, "window_seconds": 60});
    assert_eq!(p.put("kind change", kind_change), failed(409, "conflict"));
    assert_eq!(p.put("invalid", rolling(&b, 0, "none")), failed(400, "invalid_request"));
    assert_eq!(p.put("increase b", rolling(&b, 20, "none"))["status"], 200);
    p.states_match("after the definitions", &names);

    assert_eq!(p.complete("l1 with 2 of a", l1, &[("a", 2)]), ok());
    let deadline = Instant::now() + WAIT_MAX;
    loop {
        let path = format!("/v1/admin/limits/{a}");
        let done = [&p.memory, &p.tigerbeetle]
            .iter()
            .all(|server| call(server, "GET", &path, &Value::Null).1["status"] == "active");
        if done {
            break;
        }
        assert!(Instant::now() < deadline, "the decrease of a was never carried out");
        std::thread::sleep(Duration::from_millis(POLL_MS));
    }
    p.states_match("the decrease carried out", &names);
    assert_eq!(
        p.reserve("a at its new capacity", LeaseId::generate(), &[("a", 4)]).0,
        denied(&format!("insufficient_capacity:{a}"), true)
    );
}
