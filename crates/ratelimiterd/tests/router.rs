//! Router tests without a socket: every status code and error code of the contract
//! (docs/http-api.md), through `tower::ServiceExt::oneshot` on `app()` with the memory
//! backend on a fake clock.

mod support;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{header, Method, Request, StatusCode};
use axum::Router;
use ratelimiter::memory::MemoryBackend;
use ratelimiter::registry::Registry;
use ratelimiter::{FakeClock, LeaseId};
use ratelimiterd::{app, AppState, Config};
use serde_json::{json, Value};
use support::{temp_dir, TempDir};
use tower::ServiceExt;

const ADMIN_TOKEN: &str = "admin-token-0123456789abcdef";
const CLIENT_TOKEN: &str = "client-token-0123456789abcdef";

/// A server under test: its router, clock, state and registry file.
struct Harness {
    router: Router,
    clock: FakeClock,
    state: AppState,
    registry_path: PathBuf,
    /// The registry's directory, deleted when the harness is dropped.
    _dir: TempDir,
}

fn harness_with(name: &str, yaml: &str) -> Harness {
    let dir = temp_dir(name);
    let registry_path = dir.join("limits.json");
    let text = format!("registry:\n  path: {}\n{yaml}", registry_path.display());
    let config = Config::parse(&text, std::path::Path::new("test.yaml")).unwrap();
    let clock = FakeClock::new(1_700_000_000_000);
    let backend = Arc::new(MemoryBackend::new(
        Arc::new(clock.clone()),
        ratelimiterd::backend::memory_config(&config),
    ));
    let registry = Registry::open(&registry_path).unwrap();
    let state = AppState::new(
        ratelimiterd::backend::SelectedBackend::of(backend),
        Some(registry),
        &config,
    );
    Harness {
        router: app(state.clone()),
        clock,
        state,
        registry_path,
        _dir: dir,
    }
}

fn harness(name: &str) -> Harness {
    harness_with(name, "")
}

impl Harness {
    async fn send(&self, method: Method, path: &str, body: Option<String>, token: Option<&str>) -> (StatusCode, Value) {
        let mut request = Request::builder().method(method).uri(path);
        if let Some(token) = token {
            request = request.header(header::AUTHORIZATION, format!("Bearer {token}"));
        }
        let body = body.map(Body::from).unwrap_or_else(Body::empty);
        let response = self.router.clone().oneshot(request.body(body).unwrap()).await.unwrap();
        let status = response.status();
        let bytes = axum::body::to_bytes(response.into_body(), 1 << 24).await.unwrap();
        let value =
            serde_json::from_slice(&bytes).unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into()));
        (status, value)
    }

    async fn post(&self, path: &str, body: Value) -> (StatusCode, Value) {
        self.send(Method::POST, path, Some(body.to_string()), None).await
    }

    async fn put_limit(&self, definition: Value) -> (StatusCode, Value) {
        self.send(Method::PUT, "/v1/admin/limits", Some(definition.to_string()), None)
            .await
    }

    async fn reserve(&self, lease: &str, requirements: Value) -> (StatusCode, Value) {
        self.post("/v1/reserve", json!({"lease_id": lease, "requirements": requirements}))
            .await
    }
}

fn lease() -> String {
    LeaseId::generate().to_string()
}

fn rolling(key: &str, capacity: u64) -> Value {
    json!({"key": key, "kind": "rolling", "capacity": capacity, "window_seconds": 60,
           "timeout_seconds": 0, "unit": "requests", "description": "test"})
}

fn concurrency(key: &str, capacity: u64) -> Value {
    json!({"key": key, "kind": "concurrency", "capacity": capacity, "window_seconds": 0, "timeout_seconds": 300})
}

fn error_code(body: &Value) -> &str {
    body["error"].as_str().unwrap_or("")
}

#[tokio::test]
async fn reserve_allows_denies_and_is_idempotent() {
    let h = harness("reserve");
    assert_eq!(h.put_limit(rolling("global:rpm", 2)).await.0, StatusCode::OK);
    let first = lease();
    let (status, body) = h.reserve(&first, json!([{"key": "global:rpm", "amount": 2}])).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["allowed"], true);
    assert_eq!(body["retry_after_ms"], 0);
    let reserved_at = body["reserved_at_unix_ms"].as_u64().unwrap();
    assert_eq!(reserved_at, 1_700_000_000_000);
    assert!(body.get("error").is_none(), "{body}");

    // The same lease again: allowed with the original time, nothing more reserved.
    h.clock.advance_ms(5);
    let (_, again) = h.reserve(&first, json!([{"key": "global:rpm", "amount": 2}])).await;
    assert_eq!(again["allowed"], true);
    assert_eq!(again["reserved_at_unix_ms"].as_u64().unwrap(), reserved_at);

    let denied_lease = lease();
    let (status, denied) = h
        .reserve(&denied_lease, json!([{"key": "global:rpm", "amount": 1}]))
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(denied["allowed"], false);
    assert_eq!(denied["reserved_at_unix_ms"], 0);
    assert_eq!(error_code(&denied), "insufficient_capacity:global:rpm");
    assert!(denied["retry_after_ms"].as_u64().unwrap() > 0);

    // A denied lease stays denied, even once capacity is back.
    h.clock.advance_ms(61_000);
    let (_, failed) = h
        .reserve(&denied_lease, json!([{"key": "global:rpm", "amount": 1}]))
        .await;
    assert_eq!(error_code(&failed), "lease_already_failed");
    assert_eq!(failed["retry_after_ms"], 0);

    let (_, never) = h.reserve(&lease(), json!([{"key": "global:rpm", "amount": 3}])).await;
    assert_eq!(error_code(&never), "exceeds_capacity:global:rpm");
    assert_eq!(never["retry_after_ms"], 0);
    assert_eq!(never["allowed"], false);
}

/// `hold_ms` (issue 19, item 4: a pause after a provider's 429) holds a
/// reservation for its own time instead of the window; out of 1..=one day it is
/// 400 and reserves nothing.
#[tokio::test]
async fn hold_ms_holds_for_its_own_time_and_out_of_range_is_400() {
    let h = harness("hold-ms");
    h.put_limit(rolling("global:rpm", 2)).await;
    let held = json!({"lease_id": lease(), "requirements": [{"key": "global:rpm", "amount": 2}], "hold_ms": 1500});
    let (status, body) = h.post("/v1/reserve", held).await;
    assert_eq!((status, &body["allowed"]), (StatusCode::OK, &json!(true)), "{body}");
    let (_, denied) = h.reserve(&lease(), json!([{"key": "global:rpm", "amount": 1}])).await;
    let hint_ms = denied["retry_after_ms"].as_u64().unwrap();
    assert!(
        (1_500..=1_550).contains(&hint_ms),
        "the hold's end, not the minute's: {denied}"
    );
    h.clock.advance_ms(1_500);
    let (_, report) = h.send(Method::GET, "/v1/admin/limits/global:rpm", None, None).await;
    assert_eq!(report["in_use"], 0, "the hold ended with its hold_ms");
    for bad in [json!(0), json!(86_400_001), json!(-1), json!(1.5), json!("1500")] {
        let body = json!({"lease_id": lease(), "requirements": [{"key": "global:rpm", "amount": 1}], "hold_ms": bad});
        let (status, answer) = h.post("/v1/reserve", body.clone()).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
        assert!(
            error_code(&answer).starts_with("invalid_request: "),
            "{body} -> {answer}"
        );
    }
    let (_, report) = h.send(Method::GET, "/v1/admin/limits/global:rpm", None, None).await;
    assert_eq!(report["in_use"], 0, "nothing was reserved by the bad requests");
}

#[tokio::test]
async fn an_unknown_key_is_404_with_the_reserve_shape_and_reserves_nothing() {
    let h = harness("unknown");
    h.put_limit(rolling("global:rpm", 1)).await;
    let (status, body) = h
        .reserve(
            &lease(),
            json!([{"key": "global:rpm", "amount": 1}, {"key": "global:nope", "amount": 1}]),
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(
        body,
        json!({"allowed": false, "retry_after_ms": 0, "error": "unknown_limit_key: global:nope"})
    );
    let (_, report) = h.send(Method::GET, "/v1/admin/limits/global:rpm", None, None).await;
    assert_eq!(report["in_use"], 0);
}

#[tokio::test]
async fn malformed_requests_are_400_with_stable_codes() {
    let h = harness("malformed");
    h.put_limit(rolling("a", 5)).await;
    let l = lease();
    let cases: Vec<(String, &str)> = vec![
        ("{".into(), "invalid_json: "),
        ("".into(), "invalid_json: "),
        ("[1,2".into(), "invalid_json: "),
        (
            json!({"lease_id": "not-a-ulid", "requirements": [{"key": "a", "amount": 1}]}).to_string(),
            "invalid_request: ",
        ),
        (
            json!({"lease_id": l, "requirements": [{"key": "a", "amount": "1"}]}).to_string(),
            "invalid_request: ",
        ),
        (
            json!({"lease_id": l, "requirements": [{"key": "a", "amount": 0}]}).to_string(),
            "invalid_request: ",
        ),
        (
            json!({"lease_id": l, "requirements": [{"key": "a", "amount": -1}]}).to_string(),
            "invalid_request: ",
        ),
        (
            json!({"lease_id": l, "requirements": []}).to_string(),
            "invalid_request: ",
        ),
        (
            json!({"lease_id": l, "requirements": [{"key": "a", "amount": 1}, {"key": "a", "amount": 1}]}).to_string(),
            "invalid_request: ",
        ),
        (
            json!({"lease_id": l, "requirements": [{"key": "bad key", "amount": 1}]}).to_string(),
            "invalid_request: ",
        ),
        (
            json!({"requirements": [{"key": "a", "amount": 1}]}).to_string(),
            "invalid_request: ",
        ),
        (
            json!({"lease_id": l, "requirements": [{"key": "a", "amount": 1}], "extra": 1}).to_string(),
            "invalid_request: ",
        ),
        (json!([1, 2]).to_string(), "invalid_request: "),
    ];
    for (body, prefix) in cases {
        let (status, answer) = h.send(Method::POST, "/v1/reserve", Some(body.clone()), None).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
        assert!(error_code(&answer).starts_with(prefix), "{body} -> {answer}");
        assert_eq!(answer.as_object().unwrap().len(), 1, "only `error`: {answer}");
    }
    let many: Vec<Value> = (0..33).map(|i| json!({"key": format!("k{i}"), "amount": 1})).collect();
    let (status, answer) = h.reserve(&lease(), Value::Array(many)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(error_code(&answer).contains("1..=32"), "{answer}");
    // Nothing above changed the limit.
    let (_, report) = h.send(Method::GET, "/v1/admin/limits/a", None, None).await;
    assert_eq!(report["in_use"], 0);
}

#[tokio::test]
async fn a_body_needs_the_json_content_type() {
    let h = harness("content-type");
    h.put_limit(rolling("a", 5)).await;
    let body = json!({"lease_id": lease(), "requirements": [{"key": "a", "amount": 1}]}).to_string();
    for (content_type, expected) in [
        (None, StatusCode::UNSUPPORTED_MEDIA_TYPE),
        (Some("text/plain"), StatusCode::UNSUPPORTED_MEDIA_TYPE),
        (
            Some("application/x-www-form-urlencoded"),
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
        ),
        (Some("application/json; charset=utf-8"), StatusCode::OK),
    ] {
        let mut request = Request::builder()
            .method(Method::POST)
            .uri("/v1/reserve")
            .header(header::CONTENT_LENGTH, body.len());
        if let Some(ct) = content_type {
            request = request.header(header::CONTENT_TYPE, ct);
        }
        let response = h
            .router
            .clone()
            .oneshot(request.body(Body::from(body.clone())).unwrap())
            .await
            .unwrap();
        assert_eq!(response.status(), expected, "{content_type:?}");
    }
    let (_, report) = h.send(Method::GET, "/v1/admin/limits/a", None, None).await;
    assert_eq!(report["in_use"], 1, "only the JSON body reserved");
}

#[tokio::test]
async fn oversized_bodies_are_413_whether_declared_or_not() {
    let h = harness_with("oversized", "server:\n  body_bytes_max: 2048\n");
    let big = format!("{{\"pad\":\"{}\"}}", "x".repeat(4096));
    let (status, body) = h.send(Method::POST, "/v1/reserve", Some(big.clone()), None).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    assert!(error_code(&body).starts_with("payload_too_large: "), "{body}");
    let declared = Request::builder()
        .method(Method::PUT)
        .uri("/v1/admin/limits")
        .header(header::CONTENT_LENGTH, big.len())
        .body(Body::from(big))
        .unwrap();
    let response = h.router.clone().oneshot(declared).await.unwrap();
    assert_eq!(response.status(), StatusCode::PAYLOAD_TOO_LARGE);
}

#[tokio::test]
async fn complete_is_ok_for_known_unknown_and_repeated_leases() {
    let h = harness("complete");
    h.put_limit(rolling("tpm", 1000)).await;
    h.put_limit(concurrency("inflight", 1)).await;
    let l = lease();
    let reqs = json!([{"key": "tpm", "amount": 800}, {"key": "inflight", "amount": 1}]);
    assert_eq!(h.reserve(&l, reqs).await.1["allowed"], true);
    let (_, blocked) = h.reserve(&lease(), json!([{"key": "inflight", "amount": 1}])).await;
    assert_eq!(error_code(&blocked), "insufficient_capacity:inflight");

    let complete = json!({"lease_id": l, "actuals": [{"key": "tpm", "actual_amount": 300}]});
    for _ in 0..2 {
        let (status, body) = h.post("/v1/complete", complete.clone()).await;
        assert_eq!((status, body), (StatusCode::OK, json!({"ok": true})));
    }
    let (_, tpm) = h.send(Method::GET, "/v1/admin/limits/tpm", None, None).await;
    assert_eq!(tpm["in_use"], 300);
    let (_, inflight) = h.send(Method::GET, "/v1/admin/limits/inflight", None, None).await;
    assert_eq!(inflight["in_use"], 0);
    let (status, body) = h.post("/v1/complete", json!({"lease_id": lease()})).await;
    assert_eq!((status, body), (StatusCode::OK, json!({"ok": true})));

    let (status, body) = h.post("/v1/complete", json!({"lease_id": "x"})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(error_code(&body).starts_with("invalid_request: "));
}

#[tokio::test]
async fn an_actual_for_a_key_outside_the_lease_is_400() {
    let h = harness("foreign-actual");
    h.put_limit(rolling("tpm", 1000)).await;
    h.put_limit(rolling("other", 1000)).await;
    let l = lease();
    h.reserve(&l, json!([{"key": "tpm", "amount": 10}])).await;
    let (status, body) = h
        .post(
            "/v1/complete",
            json!({"lease_id": l, "actuals": [{"key": "other", "actual_amount": 1}]}),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(error_code(&body).starts_with("invalid_request: "), "{body}");
}

#[tokio::test]
async fn admin_put_get_list_and_errors() {
    let h = harness("admin");
    let (status, report) = h.put_limit(rolling("global:llm:openai:gpt-4o:rpm", 3000)).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        report,
        json!({"key": "global:llm:openai:gpt-4o:rpm", "kind": "rolling", "capacity": 3000, "window_seconds": 60,
               "timeout_seconds": 0, "unit": "requests", "description": "test", "overage": "none",
               "status": "active", "pending_decrease_to": 0, "in_use": 0, "debt": 0})
    );
    h.put_limit(concurrency("tenant:a/b@c", 5)).await;
    let (status, one) = h.send(Method::GET, "/v1/admin/limits/tenant:a/b@c", None, None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(one["kind"], "concurrency");
    let (status, list) = h.send(Method::GET, "/v1/admin/limits", None, None).await;
    assert_eq!(status, StatusCode::OK);
    let keys: Vec<&str> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["key"].as_str().unwrap())
        .collect();
    assert_eq!(keys, ["global:llm:openai:gpt-4o:rpm", "tenant:a/b@c"]);

    let (status, missing) = h.send(Method::GET, "/v1/admin/limits/global:none", None, None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(missing, json!({"error": "unknown_limit_key: global:none"}));
    let (status, bad) = h.send(Method::GET, "/v1/admin/limits/bad%20key", None, None).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(error_code(&bad).starts_with("invalid_request: "));

    let (status, conflict) = h.put_limit(concurrency("global:llm:openai:gpt-4o:rpm", 10)).await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert!(error_code(&conflict).starts_with("conflict: "), "{conflict}");
    let mut invalid = rolling("x", 0);
    let (status, body) = h.put_limit(invalid.clone()).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(error_code(&body).starts_with("invalid_request: "), "{body}");
    invalid["capacity"] = json!(1);
    invalid["window_seconds"] = json!(0);
    assert_eq!(h.put_limit(invalid).await.0, StatusCode::BAD_REQUEST);
    let (status, body) = h.send(Method::PUT, "/v1/admin/limits", Some("{".into()), None).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(error_code(&body).starts_with("invalid_json: "));
    // Rejected definitions changed nothing, in the backend or on disk.
    let (_, list) = h.send(Method::GET, "/v1/admin/limits", None, None).await;
    assert_eq!(list.as_array().unwrap().len(), 2);
    assert_eq!(list[0]["kind"], "rolling");
    let on_disk = Registry::open(&h.registry_path).unwrap();
    assert_eq!(on_disk.states().count(), 2);
}

/// A `bucket` limit through the admin API and reserve (docs/bucket-limits.md): it
/// grants its burst at once, denies the next unit with the time of the refill that
/// fits it, refuses more than the burst for ever, and a definition that keeps no
/// burst is a 400 that changes nothing.
#[tokio::test]
async fn a_bucket_grants_its_burst_then_denies_with_a_hint_and_a_bad_one_is_400() {
    let h = harness("bucket");
    let key = "global:llm:anthropic:m:otpm";
    let bucket = json!({"key": key, "kind": "bucket", "capacity": 6_000, "window_seconds": 60, "unit": "tokens"});
    let (status, report) = h.put_limit(bucket.clone()).await;
    assert_eq!(status, StatusCode::OK, "{report}");
    assert_eq!(
        (report["kind"].as_str(), report["in_use"].as_u64()),
        (Some("bucket"), Some(0))
    );
    let definition: ratelimiter::LimitDefinition = serde_json::from_value(bucket).unwrap();
    let burst = definition.grantable_max(ratelimiter::WINDOW_MARGIN_MS_DEFAULT);
    assert!(
        burst > 0 && burst < 6_000,
        "a bucket holds less than its capacity: {burst}"
    );

    let (_, full) = h.reserve(&lease(), json!([{"key": key, "amount": burst}])).await;
    assert_eq!(full["allowed"], true, "the whole burst at once: {full}");
    let (_, denied) = h.reserve(&lease(), json!([{"key": key, "amount": 1}])).await;
    assert_eq!(error_code(&denied), format!("insufficient_capacity:{key}"));
    let hint_ms = denied["retry_after_ms"].as_u64().unwrap();
    // 6,000 a minute refills 100 at each 1 s boundary: the next one, 1 s from the fake
    // clock's whole second, fits one unit (the hint adds the retry policy's jitter).
    assert!(
        (1_000..2_000).contains(&hint_ms),
        "the next boundary, not the minute: {denied}"
    );
    let (_, never) = h.reserve(&lease(), json!([{"key": key, "amount": burst + 1}])).await;
    assert_eq!(error_code(&never), format!("exceeds_capacity:{key}"));
    assert_eq!(never["retry_after_ms"], 0);
    h.clock.advance_ms(hint_ms);
    let (_, refilled) = h.reserve(&lease(), json!([{"key": key, "amount": 1}])).await;
    assert_eq!(refilled["allowed"], true, "allowed at the hint: {refilled}");

    // Capacity 1 refilled over 1 s keeps no burst: 400, on a new key and on this one.
    for bad_key in ["global:llm:anthropic:m:new", key] {
        let bad = json!({"key": bad_key, "kind": "bucket", "capacity": 1, "window_seconds": 1});
        let (status, body) = h.put_limit(bad).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
        assert!(error_code(&body).starts_with("invalid_request: "), "{body}");
        assert!(error_code(&body).contains("burst"), "{body}");
    }
    let (_, list) = h.send(Method::GET, "/v1/admin/limits", None, None).await;
    let list = list.as_array().unwrap();
    assert_eq!(list.len(), 1, "nothing defined: {list:?}");
    assert_eq!(
        (list[0]["capacity"].as_u64(), list[0]["window_seconds"].as_u64()),
        (Some(6_000), Some(60))
    );
    let on_disk = Registry::open(&h.registry_path).unwrap();
    let kinds: Vec<_> = on_disk.states().map(|state| state.definition().kind()).collect();
    assert_eq!(
        kinds,
        [ratelimiter::LimitKind::Bucket],
        "the registry file keeps the bucket"
    );
}

#[tokio::test]
async fn a_decrease_waits_for_usage_then_is_applied_and_persisted() {
    let h = harness("decrease");
    h.put_limit(concurrency("inflight", 10)).await;
    let holders: Vec<String> = (0..5).map(|_| lease()).collect();
    for l in &holders {
        assert_eq!(
            h.reserve(l, json!([{"key": "inflight", "amount": 1}])).await.1["allowed"],
            true
        );
    }
    let (status, report) = h.put_limit(concurrency("inflight", 2)).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(report["status"], "decreasing");
    assert_eq!(report["capacity"], 10);
    assert_eq!(report["pending_decrease_to"], 2);
    assert_eq!(report["in_use"], 5);
    let on_disk = Registry::open(&h.registry_path).unwrap();
    assert_eq!(on_disk.states().next().unwrap().pending_decrease_to(), 2);

    let (_, denied) = h.reserve(&lease(), json!([{"key": "inflight", "amount": 1}])).await;
    assert_eq!(error_code(&denied), "limit_decreasing:inflight");
    assert_eq!(denied["retry_after_ms"], 10_000);

    // Usage still above the target: nothing changes.
    assert_eq!(h.state.admin().apply_pending_decreases().await.unwrap(), 0);
    for l in &holders[..4] {
        h.post("/v1/complete", json!({"lease_id": l})).await;
    }
    assert_eq!(h.state.admin().apply_pending_decreases().await.unwrap(), 1);
    let (_, report) = h.send(Method::GET, "/v1/admin/limits/inflight", None, None).await;
    assert_eq!(
        (report["status"].as_str(), report["capacity"].as_u64()),
        (Some("active"), Some(2))
    );
    let on_disk = Registry::open(&h.registry_path).unwrap();
    let state = on_disk.states().next().unwrap();
    assert_eq!((state.definition().capacity(), state.pending_decrease_to()), (2, 0));
    assert_eq!(
        h.reserve(&lease(), json!([{"key": "inflight", "amount": 1}])).await.1["allowed"],
        true
    );
}

#[tokio::test]
async fn tokens_guard_admin_and_client_endpoints() {
    let yaml = format!("server:\n  admin_token: {ADMIN_TOKEN}\n  client_tokens: [{CLIENT_TOKEN}]\n");
    let h = harness_with("auth", &yaml);
    let def = rolling("a", 5).to_string();
    for token in [None, Some("wrong-token-0123456789"), Some(CLIENT_TOKEN)] {
        let (status, body) = h.send(Method::PUT, "/v1/admin/limits", Some(def.clone()), token).await;
        assert_eq!(
            (status, body),
            (StatusCode::UNAUTHORIZED, json!({"error": "unauthorized"}))
        );
        let (status, _) = h.send(Method::GET, "/v1/admin/limits", None, token).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
    }
    let (status, _) = h
        .send(Method::PUT, "/v1/admin/limits", Some(def), Some(ADMIN_TOKEN))
        .await;
    assert_eq!(status, StatusCode::OK);

    let reserve = json!({"lease_id": lease(), "requirements": [{"key": "a", "amount": 1}]}).to_string();
    let (status, _) = h.send(Method::POST, "/v1/reserve", Some(reserve.clone()), None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, _) = h
        .send(Method::POST, "/v1/reserve", Some(reserve), Some(CLIENT_TOKEN))
        .await;
    assert_eq!(status, StatusCode::OK);
    let complete = json!({"lease_id": lease()}).to_string();
    assert_eq!(
        h.send(
            Method::POST,
            "/v1/complete",
            Some(complete.clone()),
            Some("nope-nope-nope-nope")
        )
        .await
        .0,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        h.send(Method::POST, "/v1/complete", Some(complete), Some(CLIENT_TOKEN))
            .await
            .0,
        StatusCode::OK
    );
    // Health and metrics stay open.
    assert_eq!(h.send(Method::GET, "/healthz", None, None).await.0, StatusCode::OK);
    assert_eq!(h.send(Method::GET, "/metrics", None, None).await.0, StatusCode::OK);
}

/// A service's token scoped to its own key prefix reserves and completes there,
/// and nowhere else; a plain token and the admin token still reach every key.
#[tokio::test]
async fn a_scoped_token_reserves_and_completes_only_on_its_prefixes() {
    const SEARCH_TOKEN: &str = "search-service-token-0123456789";
    std::env::set_var("ROUTER_TEST_SEARCH_TOKEN", format!("{SEARCH_TOKEN}\n"));
    let yaml = format!(
        "server:\n  admin_token: {ADMIN_TOKEN}\n  client_tokens:\n    - {CLIENT_TOKEN}\n    - {{token_env: ROUTER_TEST_SEARCH_TOKEN, key_prefixes: [\"svc:search:\"]}}\n"
    );
    let h = harness_with("scoped", &yaml);
    for key in ["svc:search:rpm", "svc:billing:rpm"] {
        let (status, _) = h
            .send(
                Method::PUT,
                "/v1/admin/limits",
                Some(rolling(key, 5).to_string()),
                Some(ADMIN_TOKEN),
            )
            .await;
        assert_eq!(status, StatusCode::OK);
    }
    let reserve =
        |key: &str, lease: &str| json!({"lease_id": lease, "requirements": [{"key": key, "amount": 1}]}).to_string();
    let own = lease();
    let (status, body) = h
        .send(
            Method::POST,
            "/v1/reserve",
            Some(reserve("svc:search:rpm", &own)),
            Some(SEARCH_TOKEN),
        )
        .await;
    assert_eq!((status, &body["allowed"]), (StatusCode::OK, &json!(true)));
    // Another service's key, alone or beside its own: refused, nothing reserved.
    let both = json!({"lease_id": lease(), "requirements": [
        {"key": "svc:search:rpm", "amount": 1}, {"key": "svc:billing:rpm", "amount": 1}]})
    .to_string();
    for request in [reserve("svc:billing:rpm", &lease()), both] {
        let (status, body) = h
            .send(Method::POST, "/v1/reserve", Some(request), Some(SEARCH_TOKEN))
            .await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
        assert_eq!(
            error_code(&body),
            "forbidden: this token may not use the key svc:billing:rpm"
        );
    }
    let (_, report) = h
        .send(Method::GET, "/v1/admin/limits/svc:billing:rpm", None, Some(ADMIN_TOKEN))
        .await;
    assert_eq!(report["in_use"], 0);
    // A plain token reaches every key; its lease cannot be reconciled by the scoped one.
    let billing = lease();
    let (status, _) = h
        .send(
            Method::POST,
            "/v1/reserve",
            Some(reserve("svc:billing:rpm", &billing)),
            Some(CLIENT_TOKEN),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let complete = json!({"lease_id": billing, "actuals": [{"key": "svc:billing:rpm", "actual_amount": 0}]});
    let (status, _) = h
        .send(
            Method::POST,
            "/v1/complete",
            Some(complete.to_string()),
            Some(SEARCH_TOKEN),
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (_, report) = h
        .send(Method::GET, "/v1/admin/limits/svc:billing:rpm", None, Some(ADMIN_TOKEN))
        .await;
    assert_eq!(report["in_use"], 1, "the other service's usage stands");
    let complete = json!({"lease_id": own, "actuals": [{"key": "svc:search:rpm", "actual_amount": 0}]});
    let (status, _) = h
        .send(
            Method::POST,
            "/v1/complete",
            Some(complete.to_string()),
            Some(SEARCH_TOKEN),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test]
async fn unknown_routes_and_methods_answer_json() {
    let h = harness("routes");
    let (status, body) = h.send(Method::GET, "/v2/nothing", None, None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(error_code(&body).starts_with("not_found: "), "{body}");
    let (status, body) = h.send(Method::GET, "/v1/reserve", None, None).await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    assert!(error_code(&body).starts_with("method_not_allowed: "), "{body}");
    // The echo route is off unless configured.
    assert_eq!(h.post("/v1/echo", json!({"a": 1})).await.0, StatusCode::NOT_FOUND);
    let echo = harness_with("echo", "server:\n  echo_route: true\n");
    assert_eq!(
        echo.post("/v1/echo", json!({"a": [1, 2]})).await,
        (StatusCode::OK, json!({"a": [1, 2]}))
    );
}

#[tokio::test]
async fn healthz_and_metrics_report() {
    let h = harness("metrics");
    h.put_limit(rolling("a", 1)).await;
    h.reserve(&lease(), json!([{"key": "a", "amount": 1}])).await;
    h.reserve(&lease(), json!([{"key": "a", "amount": 1}])).await;
    h.reserve(&lease(), json!([{"key": "zzz", "amount": 1}])).await;
    h.post("/v1/complete", json!({"lease_id": lease()})).await;
    let (status, body) = h.send(Method::GET, "/healthz", None, None).await;
    assert_eq!((status, body), (StatusCode::OK, json!({"status": "ok"})));
    let (status, Value::String(text)) = h.send(Method::GET, "/metrics", None, None).await else {
        panic!("metrics are text");
    };
    assert_eq!(status, StatusCode::OK);
    for line in [
        "ratelimiterd_reserve_outcomes_total{key=\"a\",outcome=\"allowed\"} 1",
        "ratelimiterd_reserve_outcomes_total{key=\"a\",outcome=\"insufficient_capacity\"} 1",
        "ratelimiterd_reserve_outcomes_total{key=\"\",outcome=\"unknown_limit_key\"} 1",
        "ratelimiterd_request_duration_seconds_count{endpoint=\"reserve\"} 3",
        "ratelimiterd_request_duration_seconds_count{endpoint=\"complete\"} 1",
        "ratelimiterd_requests_in_flight 0",
        "ratelimiterd_memory_leases_live 1",
    ] {
        assert!(text.lines().any(|l| l == line), "missing {line} in\n{text}");
    }
}

/// A body that never yields a byte nor ends: its request holds a permit for as
/// long as the test keeps it.
struct NeverEnds;

impl http_body::Body for NeverEnds {
    type Data = axum::body::Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        std::task::Poll::Pending
    }
}

fn stalled_request(path: &str) -> Request<Body> {
    Request::builder()
        .method(Method::POST)
        .uri(path)
        .body(Body::new(NeverEnds))
        .unwrap()
}

#[tokio::test]
async fn requests_past_the_concurrency_limit_are_shed() {
    let h = harness_with("shed", "server:\n  concurrent_requests_max: 1\n");
    let request = stalled_request("/v1/reserve");
    let stalled = tokio::spawn(h.router.clone().oneshot(request));
    // Wait, bounded, until the stalled request holds the only permit.
    for _ in 0..1_000 {
        if h.state.permits().available_permits() == 0 {
            break;
        }
        tokio::task::yield_now().await;
    }
    assert_eq!(h.state.permits().available_permits(), 0);
    let (status, body) = h.post("/v1/reserve", json!({})).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(body, json!({"error": "overloaded", "retry_after_ms": 50}));
    // Health and metrics are not shed.
    assert_eq!(h.send(Method::GET, "/healthz", None, None).await.0, StatusCode::OK);
    stalled.abort();
}

#[tokio::test(start_paused = true)]
async fn requests_past_the_timeout_are_503() {
    let h = harness_with("timeout", "server:\n  request_timeout_ms: 50\n");
    let request = stalled_request("/v1/reserve");
    let response = tokio::time::timeout(Duration::from_secs(5), h.router.clone().oneshot(request))
        .await
        .expect("the server answers within its timeout")
        .unwrap();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    let bytes = axum::body::to_bytes(response.into_body(), 1 << 16).await.unwrap();
    let body: Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(body, json!({"error": "backend_unavailable", "retry_after_ms": 100}));
}

/// A directory where the registry's temporary file goes makes every write fail.
fn break_registry_writes(registry_path: &std::path::Path) -> PathBuf {
    let tmp = registry_path.with_file_name("limits.json.tmp");
    std::fs::create_dir_all(&tmp).unwrap();
    tmp
}

#[tokio::test]
async fn a_put_that_cannot_be_persisted_is_500_and_changes_nothing() {
    let h = harness("persist-fail");
    h.put_limit(rolling("a", 5)).await;
    let blocker = break_registry_writes(&h.registry_path);
    let (status, body) = h.put_limit(rolling("a", 50)).await;
    assert_eq!(
        (status, body),
        (
            StatusCode::INTERNAL_SERVER_ERROR,
            json!({"error": "internal_error: the registry file could not be written (is a directory); the limit was not changed"})
        )
    );
    let (status, _) = h.put_limit(rolling("b", 1)).await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    let (_, a) = h.send(Method::GET, "/v1/admin/limits/a", None, None).await;
    assert_eq!(a["capacity"], 5);
    assert_eq!(
        h.send(Method::GET, "/v1/admin/limits/b", None, None).await.0,
        StatusCode::NOT_FOUND
    );
    std::fs::remove_dir_all(blocker).unwrap();
    assert_eq!(h.put_limit(rolling("a", 50)).await.0, StatusCode::OK);
    assert_eq!(
        Registry::open(&h.registry_path)
            .unwrap()
            .states()
            .next()
            .unwrap()
            .definition()
            .capacity(),
        50
    );
}

#[tokio::test]
async fn a_carried_out_decrease_is_persisted_once_the_registry_is_writable_again() {
    let h = harness("decrease-retry");
    h.put_limit(concurrency("c", 4)).await;
    let holder = lease();
    h.reserve(&holder, json!([{"key": "c", "amount": 3}])).await;
    h.put_limit(concurrency("c", 1)).await;
    h.post("/v1/complete", json!({"lease_id": holder})).await;
    let blocker = break_registry_writes(&h.registry_path);
    assert_eq!(h.state.admin().apply_pending_decreases().await.unwrap(), 1);
    let on_disk = Registry::open(&h.registry_path).unwrap();
    assert_eq!(
        on_disk.states().next().unwrap().pending_decrease_to(),
        1,
        "still decreasing on disk"
    );
    std::fs::remove_dir_all(blocker).unwrap();
    assert_eq!(h.state.admin().apply_pending_decreases().await.unwrap(), 0);
    let on_disk = Registry::open(&h.registry_path).unwrap();
    let state = on_disk.states().next().unwrap();
    assert_eq!((state.definition().capacity(), state.pending_decrease_to()), (1, 0));
}

#[tokio::test]
async fn window_margins_default_from_the_config_and_show_as_given() {
    let h = harness_with("margin", "defaults:\n  window_margin_ms: 300\n");
    let mut by_default = rolling("by-default", 1);
    let mut exact = rolling("exact", 1);
    exact["window_margin_ms"] = json!(0);
    let (status, report) = h.put_limit(by_default.clone()).await;
    assert_eq!(status, StatusCode::OK);
    assert!(report.get("window_margin_ms").is_none(), "shown as given: {report}");
    let (_, report) = h.put_limit(exact.clone()).await;
    assert_eq!(report["window_margin_ms"], 0);
    let (_, list) = h.send(Method::GET, "/v1/admin/limits", None, None).await;
    assert!(
        list[0].get("window_margin_ms").is_none() && list[1]["window_margin_ms"] == 0,
        "{list}"
    );
    let on_disk = Registry::open(&h.registry_path).unwrap();
    let margins: Vec<Option<u64>> = on_disk.states().map(|s| s.definition().window_margin_ms()).collect();
    assert_eq!(margins, [None, Some(0)]);

    for key in ["by-default", "exact"] {
        let (_, body) = h.reserve(&lease(), json!([{"key": key, "amount": 1}])).await;
        assert_eq!(body["allowed"], true, "{body}");
    }
    h.clock.advance_ms(60_000);
    let (_, exact_report) = h.send(Method::GET, "/v1/admin/limits/exact", None, None).await;
    let (_, default_report) = h.send(Method::GET, "/v1/admin/limits/by-default", None, None).await;
    assert_eq!(
        (exact_report["in_use"].as_u64(), default_report["in_use"].as_u64()),
        (Some(0), Some(1))
    );
    h.clock.advance_ms(300);
    let (_, default_report) = h.send(Method::GET, "/v1/admin/limits/by-default", None, None).await;
    assert_eq!(
        default_report["in_use"], 0,
        "window + the configured margin: {default_report}"
    );

    by_default["window_margin_ms"] = json!(60_001);
    assert_eq!(h.put_limit(by_default).await.0, StatusCode::BAD_REQUEST);
    let mut on_concurrency = concurrency("c", 1);
    on_concurrency["window_margin_ms"] = json!(10);
    assert_eq!(h.put_limit(on_concurrency).await.0, StatusCode::BAD_REQUEST);
}
