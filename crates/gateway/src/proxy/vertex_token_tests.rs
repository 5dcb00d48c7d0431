use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use ratelimiter::FakeClock;

use super::*;

/// The test-only key (tests/fixtures/README.md).
const TEST_KEY: &str = include_str!("../../../../tests/fixtures/vertex-test-only-key.pem");
/// The fake clock's start: any instant after 2023 (the assertion's `iat`).
const START_MS: u64 = 1_800_000_000_000;

/// A token endpoint on loopback: counts exchanges, answers `tok-{n}` of
/// `lifetime_s`, or 500 while `fail` is set, after `delay_ms`.
#[derive(Default)]
struct Endpoint {
    exchanges: AtomicU64,
    lifetime_s: AtomicU64,
    delay_ms: AtomicU64,
    fail: AtomicBool,
}

async fn token(State(endpoint): State<Arc<Endpoint>>, body: String) -> Response {
    let n = endpoint.exchanges.fetch_add(1, Ordering::SeqCst) + 1;
    tokio::time::sleep(Duration::from_millis(endpoint.delay_ms.load(Ordering::SeqCst))).await;
    let form_ok = body.starts_with("grant_type=urn%3Aietf%3Aparams%3Aoauth%3Agrant-type%3Ajwt-bearer&assertion=")
        && body.matches('.').count() == 2;
    if endpoint.fail.load(Ordering::SeqCst) || !form_ok {
        let error = serde_json::json!({"error": "internal_failure", "error_description": "down"});
        return (StatusCode::INTERNAL_SERVER_ERROR, axum::Json(error)).into_response();
    }
    let lifetime = endpoint.lifetime_s.load(Ordering::SeqCst);
    axum::Json(serde_json::json!({"access_token": format!("tok-{n}"), "expires_in": lifetime, "token_type": "Bearer"}))
        .into_response()
}

/// The endpoint served, and a token source pointed at it on a fake clock.
async fn source(lifetime_s: u64) -> (Arc<Endpoint>, VertexToken, FakeClock) {
    let endpoint = Arc::new(Endpoint::default());
    endpoint.lifetime_s.store(lifetime_s, Ordering::SeqCst);
    let app = axum::Router::new()
        .route("/token", axum::routing::post(token))
        .with_state(Arc::clone(&endpoint));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let token_uri = format!("http://{}/token", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    let file = serde_json::json!({
        "type": "service_account", "private_key_id": "k1", "private_key": TEST_KEY,
        "client_email": "gw@acme-ml.iam.gserviceaccount.com", "token_uri": token_uri,
    });
    let account = ServiceAccount::from_json(file.to_string().as_bytes()).unwrap();
    let clock = FakeClock::new(START_MS);
    let source = VertexToken::new("vertex-east", account, Arc::new(clock.clone()));
    (endpoint, source, clock)
}

async fn bearer(source: &VertexToken) -> String {
    source.header().await.unwrap().to_str().unwrap().to_owned()
}

/// Waits until no exchange is in flight.
async fn settled(source: &VertexToken) {
    for _ in 0..500 {
        if !source.inner.state.lock().unwrap().renewing {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the exchange did not end");
}

#[test]
fn renewal_starts_at_five_minutes_or_a_tenth_of_the_lifetime_whichever_is_shorter() {
    assert_eq!(renew_before_ms(3_600_000), 300_000);
    assert_eq!(renew_before_ms(4_000), 400);
    assert_eq!(send_margin_ms(3_600_000), 10_000);
    assert_eq!(send_margin_ms(4_000), 200);
}

#[tokio::test]
async fn the_token_is_cached_and_renewed_before_it_expires() {
    let (endpoint, source, clock) = source(3_600).await;
    assert_eq!(bearer(&source).await, "Bearer tok-1");
    clock.advance_ms(3_600_000 - 300_001);
    assert_eq!(bearer(&source).await, "Bearer tok-1");
    settled(&source).await;
    assert_eq!(
        endpoint.exchanges.load(Ordering::SeqCst),
        1,
        "cached until renewal is due"
    );
    clock.advance_ms(2);
    // Due: this call still gets the current token, and starts the renewal.
    assert_eq!(bearer(&source).await, "Bearer tok-1");
    settled(&source).await;
    assert_eq!(bearer(&source).await, "Bearer tok-2");
    assert_eq!(endpoint.exchanges.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn concurrent_calls_without_a_token_share_one_exchange() {
    let (endpoint, source, _clock) = source(3_600).await;
    endpoint.delay_ms.store(200, Ordering::SeqCst);
    let calls: Vec<_> = (0..50)
        .map(|_| {
            let source = source.clone();
            tokio::spawn(async move { bearer(&source).await })
        })
        .collect();
    for call in calls {
        assert_eq!(call.await.unwrap(), "Bearer tok-1");
    }
    assert_eq!(endpoint.exchanges.load(Ordering::SeqCst), 1);
    assert_eq!(source.exchanges(), 1);
}

#[tokio::test]
async fn a_call_never_waits_on_a_renewal_while_the_token_is_valid() {
    let (endpoint, source, clock) = source(100).await;
    assert_eq!(bearer(&source).await, "Bearer tok-1");
    endpoint.delay_ms.store(2_000, Ordering::SeqCst);
    clock.advance_ms(91_000);
    let started = std::time::Instant::now();
    for _ in 0..20 {
        assert_eq!(bearer(&source).await, "Bearer tok-1");
    }
    assert!(
        started.elapsed() < Duration::from_millis(500),
        "{:?}",
        started.elapsed()
    );
    settled(&source).await;
    assert_eq!(
        endpoint.exchanges.load(Ordering::SeqCst),
        2,
        "one renewal for the twenty calls"
    );
    assert_eq!(bearer(&source).await, "Bearer tok-2");
}

#[tokio::test]
async fn a_failed_renewal_keeps_the_old_token_and_retries_with_backoff() {
    let (endpoint, source, clock) = source(100).await;
    assert_eq!(bearer(&source).await, "Bearer tok-1");
    endpoint.fail.store(true, Ordering::SeqCst);
    clock.advance_ms(90_000);
    assert_eq!(bearer(&source).await, "Bearer tok-1");
    settled(&source).await;
    assert_eq!(endpoint.exchanges.load(Ordering::SeqCst), 2);
    // Within the first backoff: the old token, no new try.
    clock.advance_ms(RENEW_RETRY_MS_MIN - 1);
    assert_eq!(bearer(&source).await, "Bearer tok-1");
    settled(&source).await;
    assert_eq!(endpoint.exchanges.load(Ordering::SeqCst), 2);
    clock.advance_ms(1);
    assert_eq!(bearer(&source).await, "Bearer tok-1");
    settled(&source).await;
    assert_eq!(endpoint.exchanges.load(Ordering::SeqCst), 3);
    // The backoff doubled: a second later is too soon.
    clock.advance_ms(RENEW_RETRY_MS_MIN);
    assert_eq!(bearer(&source).await, "Bearer tok-1");
    settled(&source).await;
    assert_eq!(endpoint.exchanges.load(Ordering::SeqCst), 3);
    endpoint.fail.store(false, Ordering::SeqCst);
    clock.advance_ms(RENEW_RETRY_MS_MIN);
    assert_eq!(bearer(&source).await, "Bearer tok-1");
    settled(&source).await;
    assert_eq!(bearer(&source).await, "Bearer tok-4");
}

#[tokio::test]
async fn an_expired_token_is_never_handed_out() {
    let (endpoint, source, clock) = source(100).await;
    assert_eq!(bearer(&source).await, "Bearer tok-1");
    endpoint.fail.store(true, Ordering::SeqCst);
    // Past the send margin (5 s of 100): the token is as good as expired.
    clock.advance_ms(100_000 - send_margin_ms(100_000));
    let error = source.header().await.unwrap_err();
    let text = error.to_string();
    assert!(
        text.starts_with("gateway upstream vertex-east: no valid Vertex AI access token: "),
        "{text}"
    );
    assert!(text.contains("500") && !text.contains("tok-"), "{text}");
    // During the backoff a call fails at once, without another exchange.
    let exchanges = endpoint.exchanges.load(Ordering::SeqCst);
    assert!(source.header().await.is_err());
    assert_eq!(endpoint.exchanges.load(Ordering::SeqCst), exchanges);
    // Once it answers again, the next call after the backoff waits for a fresh token.
    endpoint.fail.store(false, Ordering::SeqCst);
    clock.advance_ms(RENEW_RETRY_MS_MIN);
    assert_eq!(bearer(&source).await, format!("Bearer tok-{}", exchanges + 1));
}

#[tokio::test]
async fn an_unreachable_token_endpoint_is_an_error_naming_the_upstream() {
    let (_endpoint, source, _clock) = source(100).await;
    let mut account = source.inner.account.clone();
    // A closed port on loopback.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    account.token_uri = format!("http://{}/token", closed.local_addr().unwrap());
    drop(closed);
    let clock = Arc::new(FakeClock::new(START_MS));
    let unreachable = VertexToken::new("vertex-west", account, clock);
    let error = unreachable.header().await.unwrap_err().to_string();
    assert!(
        error.starts_with("gateway upstream vertex-west:") && error.contains("unreachable"),
        "{error}"
    );
}

#[test]
fn a_bad_token_answer_is_refused_without_echoing_it() {
    for answer in [
        serde_json::json!({"access_token": "secret-token", "expires_in": 0, "token_type": "Bearer"}),
        serde_json::json!({"access_token": "secret-token", "expires_in": 3600, "token_type": "mac"}),
        serde_json::json!({"expires_in": 3600, "token_type": "Bearer"}),
    ] {
        let error = parse_answer(&answer).unwrap_err();
        assert!(!error.contains("secret-token"), "{error}");
    }
    let (header, lifetime_ms) = parse_answer(&serde_json::json!(
        {"access_token": "ya29.x", "expires_in": 3599, "token_type": "Bearer"}
    ))
    .unwrap();
    assert_eq!(
        (header.to_str().unwrap(), lifetime_ms, header.is_sensitive()),
        ("Bearer ya29.x", 3_599_000, true)
    );
}
