//! What the tests of the gateway a `ratelimiterd` serves share: the provider
//! simulator in process on a free loopback port, the gateway's address read from
//! the server's log, and an HTTP client for both with its [`send`].

use std::net::SocketAddr;
use std::sync::Arc;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use ratelimiter::SystemClock;
use replay::sim::control::SimControl;
use replay::sim::limits::{Accounting, ProviderLimits};
use replay::sim::server::ProviderServer;
use serde_json::Value;

use super::{Daemon, ADMIN_TOKEN};

/// A plain HTTP/1.1 client, of the gateway and of the server's API.
pub type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// A new client.
pub fn client() -> HttpClient {
    Client::builder(TokioExecutor::new()).build(HttpConnector::new())
}

/// An answer, its body read whole.
pub struct Answer {
    /// The status code.
    pub status: u16,
    /// The headers.
    pub headers: hyper::HeaderMap,
    /// The body's text (a byte that is not UTF-8 replaced).
    pub body: String,
}

impl Answer {
    /// The body as JSON; `null` when it is not JSON.
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or(Value::Null)
    }
}

/// Sends one request with `headers` and a JSON `body` (none: empty).
pub async fn send(
    client: &HttpClient,
    method: hyper::Method,
    url: String,
    headers: &[(&str, &str)],
    body: Option<Value>,
) -> Answer {
    let mut request = hyper::Request::builder()
        .method(method)
        .uri(url)
        .header("content-type", "application/json");
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let body = body.map_or_else(Bytes::new, |b| Bytes::from(b.to_string()));
    let response = client.request(request.body(Full::new(body)).unwrap()).await.unwrap();
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    Answer {
        status,
        headers,
        body: String::from_utf8_lossy(&bytes).into_owned(),
    }
}

/// An admin call on the server at `server` with the admin token; asserts its
/// status, returns its JSON.
pub async fn admin(
    client: &HttpClient,
    server: SocketAddr,
    method: hyper::Method,
    path: &str,
    body: Option<Value>,
    status: u16,
) -> Value {
    let bearer = format!("Bearer {ADMIN_TOKEN}");
    let url = format!("http://{server}{path}");
    let answer = send(client, method, url, &[("authorization", &bearer)], body).await;
    assert_eq!(answer.status, status, "{path}: {}", answer.body);
    answer.json()
}

/// The simulator's limits, far above what a test sends, so that the gateway's
/// own limits are the ones a test meets: 10,000 requests and 10 million tokens a
/// minute, 64 calls at once, answered at once and charged what they use.
pub fn sim_limits() -> ProviderLimits {
    ProviderLimits {
        rpm: 10_000,
        tpm: 10_000_000,
        window_ms: 60_000,
        concurrency: 64,
        ms_per_output_token: 0,
        accounting: Accounting::Actual,
    }
}

/// The simulator with `limits`, on the system clock, on a free loopback port.
pub async fn start_sim_with(limits: ProviderLimits) -> (SocketAddr, Arc<ProviderServer>) {
    let provider = ProviderServer::with_control(limits, Arc::new(SystemClock::new()), SimControl::default());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(Arc::clone(&provider).serve(listener, std::future::pending()));
    (addr, provider)
}

/// The simulator with [`sim_limits`] on a free loopback port: its address.
pub async fn start_sim() -> SocketAddr {
    start_sim_with(sim_limits()).await.0
}

/// The gateway's address, from the server's `gateway serving gateway_addr=...` line.
pub fn gateway_addr(daemon: &Daemon) -> SocketAddr {
    (daemon.logs().iter())
        .find_map(|line| {
            line.split("gateway_addr=")
                .nth(1)?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
        .expect("the gateway logs its address before the server listens")
}
