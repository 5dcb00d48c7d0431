//! The tenant and key endpoints (docs/http-api.md, "Tenants and keys") without
//! a socket, through `tower::ServiceExt::oneshot` on `app()` with the memory
//! backend on a fake clock: every endpoint with its errors, and where they are
//! served at all.

mod support;

use axum::http::{Method, StatusCode};
use ratelimiter::LimitKey;
use serde_json::{json, Value};
use support::admin_harness::{harness_with, Harness};

const ADMIN_TOKEN: &str = "admin-token-0123456789abcdef";
const GATEWAY: &str = "gateway:\n  listen_addr: \"127.0.0.1:0\"\n  classes: [{name: gold}, {name: bronze}]\n  upstreams:\n    - {name: openai, kind: openai, base_url: \"http://127.0.0.1:9\"}\n  models:\n    - {name: gpt-4o-mini, upstream: openai, rpm: 500}\n    - {name: gpt-4o, upstream: openai, rpm: 500}\n  tenants:\n    - {name: yaml-team, api_key_env: DIRECTORY_API_TEST_KEY, rpm: 9}\n";

async fn harness(name: &str) -> Harness {
    let server = format!("  admin_token: {ADMIN_TOKEN}\n");
    harness_with(name, &server, GATEWAY, Some(ADMIN_TOKEN)).await
}

fn error(body: &Value) -> &str {
    body["error"].as_str().unwrap_or_else(|| panic!("no error in {body}"))
}

#[tokio::test]
async fn tenants_are_created_listed_read_patched_and_deleted_with_their_errors() {
    let h = harness("tenants").await;
    let base = "/v1/admin/gateway/tenants";
    let body = json!({"name": "search", "class": "gold", "rpm": 60, "models": ["gpt-4o-mini"]});
    let (status, created) = h.send(Method::POST, base, Some(body.clone())).await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    assert_eq!(
        (
            created["name"].clone(),
            created["source"].clone(),
            created["rpm"].clone()
        ),
        (json!("search"), json!("api"), json!(60))
    );
    let (status, again) = h.send(Method::POST, base, Some(body)).await;
    assert_eq!(status, StatusCode::CONFLICT, "{again}");
    for (bad, field) in [
        (json!({"rpm": 1}), "name: is required"),
        (json!({"name": "a b"}), "name: "),
        (json!({"name": "x", "rpm": 0}), "rpm: "),
        (json!({"name": "x", "rpm": "ten"}), "rpm: "),
        (json!({"name": "x", "class": "platinum"}), "class: no class platinum"),
        (json!({"name": "x", "models": ["gpt-5"]}), "models[0]: no model gpt-5"),
        (json!({"name": "x", "colour": "red"}), "colour: unknown field"),
    ] {
        let (status, answer) = h.send(Method::POST, base, Some(bad.clone())).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}: {answer}");
        assert!(
            error(&answer).starts_with(&format!("invalid_request: {field}")),
            "{bad}: {answer}"
        );
    }
    let (status, answer) = h.send_raw(Method::POST, base, vec![b' '; 17 * 1024], h.token).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{answer}");

    let (_, list) = h.send(Method::GET, base, None).await;
    let names: Vec<(&str, &str)> = (list.as_array().unwrap().iter())
        .map(|t| (t["name"].as_str().unwrap(), t["source"].as_str().unwrap()))
        .collect();
    assert_eq!(names, [("search", "api"), ("yaml-team", "config")]);
    let (status, one) = h.send(Method::GET, &format!("{base}/search"), None).await;
    assert_eq!((status, one["class"].clone()), (StatusCode::OK, json!("gold")));
    assert_eq!(
        h.send(Method::GET, &format!("{base}/nobody"), None).await.0,
        StatusCode::NOT_FOUND
    );

    let (status, patched) = h
        .send(
            Method::PATCH,
            &format!("{base}/search"),
            Some(json!({"rpm": null, "concurrency": 2})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{patched}");
    assert_eq!(
        (
            patched["rpm"].clone(),
            patched["concurrency"].clone(),
            patched["class"].clone()
        ),
        (Value::Null, json!(2), json!("gold"))
    );
    let (status, answer) = h
        .send(Method::PATCH, &format!("{base}/search"), Some(json!({"name": "other"})))
        .await;
    assert_eq!(
        (status, error(&answer)),
        (StatusCode::BAD_REQUEST, "invalid_request: name: unknown field")
    );
    assert_eq!(
        h.send(Method::PATCH, &format!("{base}/nobody"), Some(json!({})))
            .await
            .0,
        StatusCode::NOT_FOUND
    );
    let (status, answer) = h
        .send(Method::PATCH, &format!("{base}/yaml-team"), Some(json!({"rpm": 1})))
        .await;
    assert_eq!(
        status,
        StatusCode::CONFLICT,
        "the YAML's tenants change with the file: {answer}"
    );
    assert_eq!(
        h.send(Method::DELETE, &format!("{base}/yaml-team"), None).await.0,
        StatusCode::CONFLICT
    );

    let (status, deleted) = h.send(Method::DELETE, &format!("{base}/search"), None).await;
    assert_eq!((status, deleted["keys_revoked"].clone()), (StatusCode::OK, json!(0)));
    assert_eq!(
        h.send(Method::DELETE, &format!("{base}/search"), None).await.0,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        h.send_raw(Method::GET, base, Vec::new(), None).await.0,
        StatusCode::UNAUTHORIZED
    );
}

#[tokio::test]
async fn keys_are_created_shown_once_listed_revoked_and_rotated_with_their_errors() {
    let h = harness("keys").await;
    let tenants = "/v1/admin/gateway/tenants";
    let keys = "/v1/admin/gateway/keys";
    h.send(
        Method::POST,
        tenants,
        Some(json!({"name": "search", "models": ["gpt-4o-mini"]})),
    )
    .await;
    let body =
        json!({"tenant": "search", "name": "ci", "models": ["gpt-4o-mini"], "expires_in_seconds": 3600, "rpm": 3});
    let (status, created) = h.send(Method::POST, keys, Some(body)).await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let id = created["id"].as_str().unwrap().to_owned();
    let key = created["key"].as_str().unwrap().to_owned();
    assert!(key.starts_with("rlk-") && key.len() >= 4 + 22, "{key}");
    assert_eq!(created["expires_at"], json!(1_700_000_000 + 3_600));
    // The key's own limit is defined with it, as a limit of its own.
    let limit = LimitKey::new(format!("key:{id}:llm:rpm")).unwrap();
    assert_eq!(
        h.state
            .backend()
            .limit_report(&limit)
            .await
            .unwrap()
            .unwrap()
            .state
            .definition()
            .capacity(),
        3
    );
    let directory = h.state.directory().unwrap();
    assert_eq!(directory.authenticate(&key).await.unwrap().tenant.name, "search");

    for (bad, expected) in [
        (
            json!({"tenant": "nobody"}),
            (StatusCode::NOT_FOUND, "not_found: unknown tenant nobody"),
        ),
        (
            json!({"name": "x"}),
            (StatusCode::BAD_REQUEST, "invalid_request: tenant: is required"),
        ),
        (
            json!({"tenant": "search", "models": ["gpt-4o"]}),
            (
                StatusCode::BAD_REQUEST,
                "invalid_request: models[0]: gpt-4o is outside the tenant's models",
            ),
        ),
        (
            json!({"tenant": "search", "expires_in_seconds": 0}),
            (StatusCode::BAD_REQUEST, "invalid_request: expires_in_seconds: "),
        ),
        (
            json!({"tenant": "search", "key": "mine"}),
            (StatusCode::BAD_REQUEST, "invalid_request: key: unknown field"),
        ),
    ] {
        let (status, answer) = h.send(Method::POST, keys, Some(bad.clone())).await;
        assert_eq!(status, expected.0, "{bad}: {answer}");
        assert!(error(&answer).starts_with(expected.1), "{bad}: {answer}");
    }

    let (status, list) = h.send(Method::GET, &format!("{keys}?tenant=search"), None).await;
    assert_eq!(status, StatusCode::OK);
    let text = list.to_string();
    assert!(
        !text.contains(&key) && !text.contains("hash"),
        "a list never shows a key: {text}"
    );
    assert_eq!(list[0]["hint"], json!(format!("…{}", &key[key.len() - 4..])));
    assert_eq!(
        h.send(Method::GET, &format!("{keys}?tenant=nobody"), None).await.1,
        json!([])
    );
    assert_eq!(
        h.send(Method::GET, &format!("{keys}?owner=x"), None).await.0,
        StatusCode::BAD_REQUEST
    );
    let (status, one) = h.send(Method::GET, &format!("{keys}/{id}"), None).await;
    assert_eq!((status, one["status"].clone()), (StatusCode::OK, json!("active")));
    assert_eq!(
        h.send(Method::GET, &format!("{keys}/NOPE"), None).await.0,
        StatusCode::NOT_FOUND
    );

    let (status, rotated) = h
        .send(
            Method::POST,
            &format!("{keys}/{id}/rotate"),
            Some(json!({"grace_seconds": 60})),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{rotated}");
    let new_key = rotated["key"].as_str().unwrap().to_owned();
    assert_eq!(
        (rotated["tenant"].clone(), rotated["rpm"].clone()),
        (json!("search"), json!(3))
    );
    assert_eq!(rotated["replaces"]["expires_at"], json!(1_700_000_000 + 60));
    h.clock.advance_ms(60_000);
    assert!(directory.authenticate(&key).await.is_err() && directory.authenticate(&new_key).await.is_ok());
    let (status, answer) = h
        .send(
            Method::POST,
            &format!("{keys}/{id}/rotate"),
            Some(json!({"grace_seconds": -1})),
        )
        .await;
    assert_eq!(
        (status, error(&answer).starts_with("invalid_request: grace_seconds: ")),
        (StatusCode::BAD_REQUEST, true)
    );
    assert_eq!(
        h.send(Method::POST, &format!("{keys}/{id}/rotate"), None).await.0,
        StatusCode::CONFLICT,
        "an expired key"
    );
    assert_eq!(
        h.send(Method::POST, &format!("{keys}/NOPE/rotate"), None).await.0,
        StatusCode::NOT_FOUND
    );

    let new_id = rotated["id"].as_str().unwrap();
    let (status, revoked) = h.send(Method::DELETE, &format!("{keys}/{new_id}"), None).await;
    assert_eq!((status, revoked["status"].clone()), (StatusCode::OK, json!("revoked")));
    assert!(directory.authenticate(&new_key).await.is_err());
    assert_eq!(
        h.send(Method::DELETE, &format!("{keys}/NOPE"), None).await.0,
        StatusCode::NOT_FOUND
    );

    // A key of the YAML's tenant; deleting an API tenant revokes its keys.
    let (status, _) = h.send(Method::POST, keys, Some(json!({"tenant": "yaml-team"}))).await;
    assert_eq!(status, StatusCode::CREATED);
    let (_, last) = h.send(Method::POST, keys, Some(json!({"tenant": "search"}))).await;
    let (_, deleted) = h.send(Method::DELETE, &format!("{tenants}/search"), None).await;
    assert_eq!(deleted["keys_revoked"], json!(1));
    assert!(directory.authenticate(last["key"].as_str().unwrap()).await.is_err());

    let metrics = h.send_raw(Method::GET, "/metrics", Vec::new(), None).await.1;
    let metrics = metrics.as_str().unwrap();
    for line in [
        "ratelimiterd_gateway_keys_created_total 3",
        "ratelimiterd_gateway_keys_rotated_total 1",
        "ratelimiterd_gateway_keys_revoked_total 1",
        "ratelimiterd_gateway_tenants_deleted_total 1",
    ] {
        assert!(metrics.contains(line), "{line} missing from {metrics}");
    }
}

#[tokio::test]
async fn without_an_admin_token_only_a_loopback_listener_serves_tenants_and_keys() {
    let open = harness_with("loopback", "  listen_addr: \"127.0.0.1:8080\"\n", "", None).await;
    let (status, created) = open
        .send(Method::POST, "/v1/admin/gateway/tenants", Some(json!({"name": "a"})))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let wide = harness_with("wide", "  listen_addr: \"0.0.0.0:8080\"\n", "", None).await;
    for (method, path) in [
        (Method::POST, "/v1/admin/gateway/tenants"),
        (Method::GET, "/v1/admin/gateway/keys"),
    ] {
        let (status, answer) = wide.send(method, path, Some(json!({"name": "a"}))).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{answer}");
        assert!(error(&answer).contains("server.admin_token"), "{answer}");
    }
}

#[test]
fn the_directorys_cap_bound_is_the_gateways() {
    assert_eq!(
        ratelimiter::directory::TENANT_CAP_MAX,
        gateway::config::TENANT_CAP_LIMIT as u64
    );
}
