//! The gateway served by the real `ratelimiterd` binary against slow and stalled
//! clients (docs/gateway.md, "Slow and stalled clients"): a client that never
//! finishes its headers is cut off after `client_header_timeout_ms`; a client
//! that stops reading its answer is disconnected after `client_write_timeout_ms`,
//! and its call completed (its slot freed, its tokens kept as the provider will
//! count them).

mod support;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::response::Response;
use axum::routing;
use axum::Router;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use serde_json::{json, Value};
use support::gateway_setup::{client, gateway_addr, HttpClient};
use support::{temp_dir, BackendConfig, Daemon, ADMIN_TOKEN, WAIT_MAX};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const TENANT_KEY: &str = "gateway-clients-test-key-0123456789";
/// The configured client timeouts: far below the server's defaults, so a test
/// that passes shows the configured value at work.
const CLIENT_TIMEOUT_MS: u64 = 500;
/// The answer a stalled client stops reading: far more than the kernel's socket
/// buffers on both sides hold.
const ANSWER_BYTES: usize = 64 * 1024 * 1024;

/// An embeddings answer of [`ANSWER_BYTES`], made as it is sent.
struct BigAnswer {
    /// Chunks left before the tail; `None` once the tail is sent.
    chunks_left: Option<usize>,
    started: bool,
}

impl http_body::Body for BigAnswer {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        let data = if !self.started {
            self.started = true;
            Bytes::from_static(b"{\"object\":\"list\",\"data\":[{\"embedding\":[0.1")
        } else {
            match self.chunks_left {
                None => return std::task::Poll::Ready(None),
                Some(0) => {
                    self.chunks_left = None;
                    Bytes::from_static(b"]}],\"usage\":{\"prompt_tokens\":3,\"total_tokens\":3}}")
                }
                Some(n) => {
                    self.chunks_left = Some(n - 1);
                    Bytes::from(",0.1".repeat(CHUNK_BYTES / 4))
                }
            }
        };
        std::task::Poll::Ready(Some(Ok(http_body::Frame::data(data))))
    }
}

/// The size of each chunk of the big answer.
const CHUNK_BYTES: usize = 64 * 1024;

async fn embeddings() -> Response {
    let answer = BigAnswer {
        chunks_left: Some(ANSWER_BYTES / CHUNK_BYTES),
        started: false,
    };
    let mut response = Response::new(Body::new(answer));
    response
        .headers_mut()
        .insert("content-type", "application/json".parse().unwrap());
    response
}

async fn start_provider() -> SocketAddr {
    let app = Router::new().route("/v1/embeddings", routing::post(embeddings));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

fn section(provider: SocketAddr) -> String {
    std::env::set_var("GATEWAY_CLIENTS_TEST_KEY", TENANT_KEY);
    format!(
        "gateway:\n  listen_addr: \"127.0.0.1:0\"\n  client_header_timeout_ms: {CLIENT_TIMEOUT_MS}\n  client_write_timeout_ms: {CLIENT_TIMEOUT_MS}\n  upstreams:\n    - {{name: p, kind: openai, base_url: \"http://{provider}\"}}\n  models:\n    - {{name: embed, upstream: p, tpm: 1000000, concurrency: 4, max_output_tokens_default: 1}}\n  tenants:\n    - {{name: acme, api_key_env: GATEWAY_CLIENTS_TEST_KEY}}\n"
    )
}

async fn in_use(client: &HttpClient, server: SocketAddr, key: &str) -> u64 {
    let request = hyper::Request::get(format!("http://{server}/v1/admin/limits/{key}"))
        .header("authorization", format!("Bearer {ADMIN_TOKEN}"))
        .body(Full::new(Bytes::new()))
        .unwrap();
    let response = client.request(request).await.unwrap();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    let report: Value = serde_json::from_slice(&body).unwrap();
    report["in_use"].as_u64().unwrap_or_else(|| panic!("{report}"))
}

async fn eventually_in_use(client: &HttpClient, server: SocketAddr, key: &str, expected: u64) {
    let deadline = Instant::now() + WAIT_MAX;
    while in_use(client, server, key).await != expected {
        assert!(Instant::now() < deadline, "{key} never held {expected}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn start() -> (Daemon, SocketAddr, support::TempDir) {
    let provider = start_provider().await;
    let dir = temp_dir("gateway-clients");
    let daemon = Daemon::start_on(&dir, BackendConfig::Memory, "", &section(provider));
    let gateway = gateway_addr(&daemon);
    (daemon, gateway, dir)
}

#[tokio::test]
async fn a_client_that_never_finishes_its_headers_is_cut_off() {
    let (_daemon, gateway, _dir) = start().await;
    let mut stream = tokio::net::TcpStream::connect(gateway).await.unwrap();
    stream
        .write_all(b"POST /v1/embeddings HTTP/1.1\r\nhost: gw\r\n")
        .await
        .unwrap();
    // The server's default (10 s) is far past this bound; the configured 500 ms is not.
    let mut buf = [0u8; 1024];
    let closed = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => continue,
            }
        }
    })
    .await;
    assert!(closed.is_ok(), "the connection stayed open past the header timeout");
}

#[tokio::test]
async fn a_client_that_stops_reading_is_disconnected_and_its_call_completed() {
    let (daemon, gateway, _dir) = start().await;
    let admin = client();
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    // A small receive buffer, so the server's writes block soon.
    socket.set_recv_buffer_size(4096).unwrap();
    let mut stream = socket.connect(gateway).await.unwrap();
    let body = json!({"model": "embed", "input": "hello"}).to_string();
    let head = format!(
        "POST /v1/embeddings HTTP/1.1\r\nhost: gw\r\nauthorization: Bearer {TENANT_KEY}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut buf = [0u8; 1024];
    let read = stream.read(&mut buf).await.unwrap();
    assert!(String::from_utf8_lossy(&buf[..read]).starts_with("HTTP/1.1 200"));
    let concurrency = "global:llm:p:embed:concurrency";
    let tpm = "global:llm:p:embed:tpm";
    let reserved = in_use(&admin, daemon.addr, tpm).await;
    assert!(reserved > 0);
    // The client reads nothing more: the server gives up on it and completes the call.
    eventually_in_use(&admin, daemon.addr, concurrency, 0).await;
    assert_eq!(
        in_use(&admin, daemon.addr, tpm).await,
        reserved,
        "the usage was never seen: the reservation is kept, never less than the provider counts"
    );
    drop(stream);
}
