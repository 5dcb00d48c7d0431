//! The limits API through the router without a socket (the rest of the contract
//! is tests/router.rs): definitions listed, read and refused, a bucket's burst, a
//! decrease that waits for usage, and what reaches the registry file when it can and
//! cannot be written, on the memory backend with a fake clock.

mod router_support;
mod support;

use std::path::PathBuf;

use axum::http::{Method, StatusCode};
use ratelimiter::registry::Registry;
use router_support::{concurrency, error_code, harness, harness_with, lease, rolling};
use serde_json::json;

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
