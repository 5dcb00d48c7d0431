//! Router tests without a socket: the status and error codes of the contract
//! (docs/http-api.md) for reserves, completes, bodies, tokens, routes and load,
//! through `tower::ServiceExt::oneshot` on `app()` with the memory backend on a fake
//! clock; the limits API's are tests/router_admin.rs.

mod router_support;
mod support;

use std::time::Duration;

use axum::body::Body;
use axum::http::{header, Method, Request, StatusCode};
use router_support::{concurrency, error_code, harness, harness_with, lease, rolling, ADMIN_TOKEN, CLIENT_TOKEN};
use serde_json::{json, Value};
use tower::ServiceExt;

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
