//! The exporter's settings as the environment gives them, its retries against
//! a collector on a real socket, and the partial success it reads.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use axum::http::StatusCode;
use tokio::io::AsyncReadExt;

use super::*;

/// An environment of `pairs`.
fn env_of(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
    move |name| pairs.iter().find(|(k, _)| *k == name).map(|(_, v)| (*v).to_owned())
}

/// The section's headers.
fn section() -> BTreeMap<String, String> {
    BTreeMap::from([
        ("x-team".to_owned(), "search".to_owned()),
        ("x-env".to_owned(), "prod".to_owned()),
    ])
}

#[test]
fn the_environments_headers_win_over_the_sections_and_the_signals_over_the_general() {
    let env = env_of(&[
        (
            "OTEL_EXPORTER_OTLP_HEADERS",
            "x-team=infra, authorization=Basic%20YWI6Y2Q%3D",
        ),
        ("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "x-team=traces"),
        ("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "2500"),
        ("OTEL_EXPORTER_OTLP_TIMEOUT", "9000"),
        ("OTEL_EXPORTER_OTLP_COMPRESSION", "none"),
    ]);
    let settings = HttpSettings::read("TRACES", "http://collector:4318/v1/traces", &section(), &env).unwrap();
    let headers: Vec<(String, String)> = (settings.headers.iter())
        .map(|(n, v)| (n.to_string(), v.to_str().unwrap().to_owned()))
        .collect();
    assert_eq!(
        headers,
        [
            ("authorization", "Basic YWI6Y2Q="),
            ("x-env", "prod"),
            ("x-team", "traces"),
        ]
        .map(|(n, v)| (n.to_owned(), v.to_owned()))
    );
    assert_eq!(settings.timeout, Duration::from_millis(2500));
    assert_eq!(settings.endpoint, "http://collector:4318/v1/traces");
    let plain = HttpSettings::read("TRACES", "https://collector/v1/traces", &BTreeMap::new(), &env_of(&[])).unwrap();
    assert_eq!(plain.timeout, Duration::from_millis(TIMEOUT_MS_DEFAULT));
    assert!(plain.headers.is_empty());
}

#[test]
fn bad_variables_are_named_and_header_values_never_shown() {
    let cases: [(&'static [(&'static str, &'static str)], &str); 5] = [
        (
            &[("OTEL_EXPORTER_OTLP_HEADERS", "secret-token")],
            "OTEL_EXPORTER_OTLP_HEADERS: entry 1",
        ),
        (
            &[("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "=secret")],
            "OTEL_EXPORTER_OTLP_TRACES_HEADERS: entry 1",
        ),
        (&[("OTEL_EXPORTER_OTLP_HEADERS", "a=secret%4")], "the value of `a`"),
        (
            &[("OTEL_EXPORTER_OTLP_TIMEOUT", "soon")],
            "OTEL_EXPORTER_OTLP_TIMEOUT: `soon`",
        ),
        (
            &[("OTEL_EXPORTER_OTLP_TRACES_COMPRESSION", "gzip")],
            "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION: `gzip`",
        ),
    ];
    for (pairs, expected) in cases {
        let error = HttpSettings::read("TRACES", "http://c/v1/traces", &section(), &env_of(pairs)).unwrap_err();
        assert!(error.contains(expected), "{error}");
        assert!(!error.contains("secret"), "{error}");
    }
    let error = HttpSettings::read(
        "TRACES",
        "http://c/v1/traces",
        &BTreeMap::from([("k".to_owned(), "secret\n".to_owned())]),
        &env_of(&[]),
    )
    .unwrap_err();
    assert!(
        error.contains("the value of `k`") && !error.contains("secret"),
        "{error}"
    );
}

#[test]
fn a_partial_success_names_the_rejected_spans() {
    // ExportTraceServiceResponse { partial_success: { rejected_spans: 3, error_message: "too big" } }
    let mut inner = vec![0x08, 3, 0x12, 7];
    inner.extend_from_slice(b"too big");
    let mut answer = vec![0x0a, inner.len() as u8];
    answer.extend_from_slice(&inner);
    assert_eq!(partial_success(&answer), Some((3, "too big".to_owned())));
    assert_eq!(partial_success(&[]), None);
    assert_eq!(partial_success(&[0x0a, 0x00]), None);
    assert_eq!(partial_success(&[0x0a, 0x05, 0x08]), None, "a cut message is no answer");
}

/// A collector on loopback answering `statuses` in turn (then 200), counting the tries.
async fn collector(statuses: &'static [u16]) -> (String, Arc<AtomicUsize>) {
    let tries = Arc::new(AtomicUsize::new(0));
    let counted = tries.clone();
    let app = axum::Router::new().route(
        "/v1/traces",
        axum::routing::post(move |body: axum::body::Bytes| {
            let n = counted.fetch_add(1, Ordering::SeqCst);
            assert!(!body.is_empty(), "a body is sent");
            let status = statuses.get(n).copied().unwrap_or(200);
            async move { StatusCode::from_u16(status).unwrap() }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (format!("http://{address}/v1/traces"), tries)
}

/// Posts one body to `endpoint` with a one-second timeout.
async fn post(endpoint: &str) -> Result<Bytes, OTelSdkError> {
    let env = env_of(&[("OTEL_EXPORTER_OTLP_TIMEOUT", "1000")]);
    let settings = HttpSettings::read("TRACES", endpoint, &BTreeMap::new(), &env).unwrap();
    let client = HyperClient::with_default_connector(settings.timeout, None);
    post_with_retries(&client, &settings, Bytes::from_static(b"\x0a\x00")).await
}

#[tokio::test]
async fn a_retryable_answer_is_tried_again_and_a_refusal_is_not() {
    let (endpoint, tries) = collector(&[503, 429]).await;
    assert!(post(&endpoint).await.is_ok());
    assert_eq!(tries.load(Ordering::SeqCst), 3);
    let (endpoint, tries) = collector(&[400]).await;
    let error = post(&endpoint).await.unwrap_err();
    assert!(error.to_string().contains("400"), "{error}");
    assert_eq!(tries.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn retries_stop_within_the_timeout() {
    let (endpoint, tries) = collector(&[503, 503, 503, 503, 503, 503]).await;
    let started = std::time::Instant::now();
    assert!(post(&endpoint).await.is_err());
    assert!(
        started.elapsed() < Duration::from_millis(1500),
        "{:?}",
        started.elapsed()
    );
    assert!(tries.load(Ordering::SeqCst) <= usize::try_from(RETRIES_MAX).unwrap() + 1);
}

#[tokio::test]
async fn an_https_collector_is_dialed_with_tls() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let first_bytes = tokio::spawn(async move {
        let (mut socket, _) = listener.accept().await.unwrap();
        let mut head = [0u8; 2];
        socket.read_exact(&mut head).await.unwrap();
        head
    });
    let settings = HttpSettings::read(
        "TRACES",
        &format!("https://{address}/v1/traces"),
        &BTreeMap::new(),
        &env_of(&[]),
    )
    .unwrap();
    let client = https_client(Duration::from_secs(1));
    let request = request(&settings, Bytes::from_static(b"")).unwrap();
    // The listener speaks no TLS, so the post fails; what it read is a TLS handshake's record.
    assert!(client.send_bytes(request).await.is_err());
    let head = tokio::time::timeout(Duration::from_secs(5), first_bytes)
        .await
        .expect("the collector is dialed");
    assert_eq!(head.unwrap(), [0x16, 0x03], "a TLS handshake record");
}
