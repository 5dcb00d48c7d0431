//! The remote [`Limiter`] (docs/client-library.md, "Distributed mode: the HTTP client"):
//! reserve and complete over HTTP against `ratelimiterd`, plus the admin calls its
//! operator CLI needs.
//!
//! Connections are kept alive and reused. Every request has a timeout. A request that
//! times out, cannot connect, or is answered 503 is retried a bounded number of times
//! with the very same body, hence the same lease id, so a retry can never reserve twice
//! (docs/lease-ids.md, "Rules for callers"). Plain HTTP/1.1 only: put a TLS proxy in
//! front when the network needs it.
//!
//! # Failover
//!
//! The client may list several servers of one fleet (servers sharing their state
//! through one TigerBeetle cluster, so any of them can take any request). Each
//! call starts on the client's preferred server, at first the first listed. A
//! retry goes to the next server in the list, wrapping around, with the same body:
//! Reserve and Complete are idempotent by lease id and an admin `PUT` defines the
//! same state wherever it lands, so a retry elsewhere is as safe as a retry on the
//! same server. Moving on to a server not yet tried in this call does not wait;
//! coming back to one already tried (a single server, or a full round without an
//! answer) waits the server's `retry_after_ms` hint or the backoff, capped by
//! `retry_wait_ms_max`. `retries_max` bounds the retries of a call in total, across
//! servers. The server that answers (anything but a 503) becomes the preferred
//! one for every later call of the client and its clones, so a dead server costs
//! one failed attempt, not one per call. Answers other than a 503 (allowed,
//! denied, 4xx, other 5xx) are returned at once and never tried elsewhere.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Bytes;
use hyper::{header, Method, Request, StatusCode, Uri};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use serde::de::DeserializeOwned;
use serde::Deserialize;

use crate::limiting::limiter::Limiter;
use crate::model::definition::{LimitDefinition, LimitReport};
use crate::model::error::LimiterError;
use crate::model::key::LimitKey;
use crate::model::wire::{CompleteRequest, ReserveOutcome, ReserveRequest, ReserveResponse};

/// The largest response read: a list of 100,000 limits is about 30 MiB.
pub const RESPONSE_BYTES_MAX: usize = 64 * 1024 * 1024;
/// The most retries that may be configured: each one repeats a request that may
/// already be holding the server up.
pub const RETRIES_MAX_LIMIT: u32 = 10;
/// Idle connections kept per server; more concurrent callers open more connections
/// that close after use.
pub const POOL_IDLE_PER_HOST_MAX: usize = 256;
/// How long an idle kept-alive connection is kept.
const POOL_IDLE_TIMEOUT_MS: u64 = 30_000;
/// The first wait before a retry without a server hint; doubled on each retry.
const RETRY_BACKOFF_MS_BASE: u64 = 50;
/// The retry hint reported when the server gave none.
const RETRY_HINT_MS_DEFAULT: u64 = 100;
/// The most servers one client may list. A call tries them in turn, each try
/// costing up to a request timeout, and at most `RETRIES_MAX_LIMIT + 1` tries are
/// made, so a longer list could not even be walked once; each server also keeps
/// its own pool of idle connections. A larger fleet belongs behind a load balancer.
pub const SERVERS_MAX: usize = 16;

/// Why an [`HttpClient`] could not be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("http client: {0}")]
pub struct HttpClientError(String);

/// How the client reaches the server or the servers of a fleet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpClientConfig {
    /// `http://host:port` of each `ratelimiterd` to use, in failover order: one for
    /// a single server or a load balancer, several for a fleet without one. From 1
    /// to [`SERVERS_MAX`], each listed once.
    pub base_urls: Vec<String>,
    /// Sent as `Authorization: Bearer <token>` when set (client or admin token).
    pub token: Option<String>,
    /// How long one attempt may take, connecting included.
    pub request_timeout_ms: u64,
    /// How long connecting may take.
    pub connect_timeout_ms: u64,
    /// Retries after a timeout, a connection failure or a 503, across all servers
    /// together; 0..=10.
    pub retries_max: u32,
    /// The longest wait before one retry, whatever the server's hint.
    pub retry_wait_ms_max: u64,
}

impl HttpClientConfig {
    /// Defaults for the one server (or load balancer) at `base_url`: 2 s per
    /// attempt, 1 s to connect, 2 retries waiting at most 1 s each.
    pub fn new(base_url: impl Into<String>) -> Self {
        Self::fleet([base_url])
    }

    /// The same defaults for the servers of a fleet, in failover order: the first
    /// is preferred until it fails to answer.
    pub fn fleet(base_urls: impl IntoIterator<Item = impl Into<String>>) -> Self {
        Self {
            base_urls: base_urls.into_iter().map(Into::into).collect(),
            token: None,
            request_timeout_ms: 2_000,
            connect_timeout_ms: 1_000,
            retries_max: 2,
            retry_wait_ms_max: 1_000,
        }
    }
}

/// Checks and normalises the server list: 1..=[`SERVERS_MAX`] distinct
/// `http://host[:port]` URLs (a path prefix, for a proxy, is kept), without a
/// trailing slash.
fn parse_servers(base_urls: &[String]) -> Result<Vec<String>, HttpClientError> {
    let invalid = |m: String| Err(HttpClientError(m));
    if base_urls.is_empty() {
        return invalid("base_urls: at least one server URL is needed".to_owned());
    }
    if base_urls.len() > SERVERS_MAX {
        return invalid(format!(
            "base_urls: {} servers listed, at most {SERVERS_MAX} (put a larger fleet behind a load balancer)",
            base_urls.len()
        ));
    }
    let mut servers: Vec<String> = Vec::with_capacity(base_urls.len());
    for raw in base_urls {
        let base_url = raw.trim().trim_end_matches('/').to_owned();
        if !base_url.starts_with("http://") {
            return invalid(format!(
                "base_url {raw:?} must start with http:// (TLS is not built in)"
            ));
        }
        match base_url.parse::<Uri>() {
            Ok(uri) if uri.host().is_some_and(|h| !h.is_empty()) && uri.query().is_none() => {}
            _ => return invalid(format!("base_url {raw:?} is not an http://host:port URL")),
        }
        if servers.contains(&base_url) {
            return invalid(format!("base_url {raw:?} is listed twice"));
        }
        servers.push(base_url);
    }
    Ok(servers)
}

/// A [`Limiter`] backed by a remote `ratelimiterd`, or by the servers of a fleet
/// with failover (see the module's documentation). Clones share connections and
/// the preferred server.
#[derive(Debug, Clone)]
pub struct HttpClient {
    client: Client<HttpConnector, Full<Bytes>>,
    /// The servers, normalised, in failover order.
    base_urls: Arc<[String]>,
    /// The index in `base_urls` of the server each call starts on: the last one
    /// that answered.
    preferred: Arc<AtomicUsize>,
    authorization: Option<header::HeaderValue>,
    request_timeout: Duration,
    retries_max: u32,
    retry_wait_ms_max: u64,
}

/// The error bodies the server sends.
#[derive(Debug, Default, Deserialize)]
struct ErrorBody {
    #[serde(default)]
    error: String,
    #[serde(default)]
    retry_after_ms: Option<u64>,
}

/// One attempt's result: an answer, or no answer (timeout, connection failure).
enum Attempt {
    Answered(StatusCode, Bytes),
    NoAnswer(String),
}

impl HttpClient {
    /// Validates the configuration and builds the client.
    pub fn new(config: HttpClientConfig) -> Result<Self, HttpClientError> {
        let invalid = |m: String| Err(HttpClientError(m));
        let base_urls = parse_servers(&config.base_urls)?;
        if config.request_timeout_ms == 0 || config.connect_timeout_ms == 0 {
            return invalid("timeouts must be at least 1 ms".to_owned());
        }
        if config.retries_max > RETRIES_MAX_LIMIT {
            return invalid(format!("retries_max must be at most {RETRIES_MAX_LIMIT}"));
        }
        let authorization = match &config.token {
            Some(token) => Some(
                header::HeaderValue::from_str(&format!("Bearer {token}"))
                    .map_err(|_| HttpClientError("the token must be printable ASCII".to_owned()))?,
            ),
            None => None,
        };
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(Duration::from_millis(config.connect_timeout_ms)));
        connector.set_nodelay(true);
        // One client pools connections per server (scheme and authority): each
        // server has its own kept-alive connections.
        let client = Client::builder(TokioExecutor::new())
            .pool_timer(TokioTimer::new())
            .pool_idle_timeout(Duration::from_millis(POOL_IDLE_TIMEOUT_MS))
            .pool_max_idle_per_host(POOL_IDLE_PER_HOST_MAX)
            .build(connector);
        Ok(Self {
            client,
            base_urls: base_urls.into(),
            preferred: Arc::new(AtomicUsize::new(0)),
            authorization,
            request_timeout: Duration::from_millis(config.request_timeout_ms),
            retries_max: config.retries_max,
            retry_wait_ms_max: config.retry_wait_ms_max,
        })
    }

    /// `PUT /v1/admin/limits`: defines a limit; answers its state and usage.
    pub async fn put_limit(&self, definition: &LimitDefinition) -> Result<LimitReport, LimiterError> {
        let body = serde_json::to_vec(definition).expect("definitions serialize");
        let (status, bytes) = self.send(Method::PUT, "/v1/admin/limits", Some(body)).await?;
        expect_ok(status, &bytes)?;
        parse_json(&bytes)
    }

    /// `GET /v1/admin/limits`: every limit, ordered by key.
    pub async fn limits(&self) -> Result<Vec<LimitReport>, LimiterError> {
        let (status, bytes) = self.send(Method::GET, "/v1/admin/limits", None).await?;
        expect_ok(status, &bytes)?;
        parse_json(&bytes)
    }

    /// `GET /v1/admin/limits/{key}`: one limit, `None` when undefined.
    pub async fn limit(&self, key: &LimitKey) -> Result<Option<LimitReport>, LimiterError> {
        // Key characters are all valid in a URL path, so the key needs no escaping.
        let path = format!("/v1/admin/limits/{key}");
        let (status, bytes) = self.send(Method::GET, &path, None).await?;
        match expect_ok(status, &bytes) {
            Ok(()) => parse_json(&bytes).map(Some),
            Err(LimiterError::UnknownKey(_)) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// An admin request answered in JSON, such as the gateway's tenants and
    /// keys (`POST /v1/admin/gateway/keys`): its status and body, whatever
    /// the status, so the caller prints the server's error as it came.
    /// `method` is `GET`, `POST`, `PATCH` or `DELETE`.
    pub async fn admin_json(
        &self,
        method: &str,
        path: &str,
        body: Option<&serde_json::Value>,
    ) -> Result<(u16, serde_json::Value), LimiterError> {
        let method = Method::from_bytes(method.as_bytes())
            .map_err(|e| LimiterError::InvalidRequest(format!("method {method}: {e}")))?;
        let body = body.map(|b| serde_json::to_vec(b).expect("JSON serializes"));
        let (status, bytes) = self.send(method, path, body).await?;
        let value = serde_json::from_slice(&bytes)
            .unwrap_or_else(|_| serde_json::Value::String(String::from_utf8_lossy(&bytes).into_owned()));
        Ok((status.as_u16(), value))
    }

    /// The servers this client uses, in failover order, normalised.
    pub fn servers(&self) -> &[String] {
        &self.base_urls
    }

    /// The server the next call starts on: the last one that answered.
    pub fn preferred_server(&self) -> &str {
        &self.base_urls[self.preferred.load(Ordering::Relaxed) % self.base_urls.len()]
    }

    /// Sends one request, retrying it unchanged on the next server while there is
    /// no answer or a 503 (the failover policy is the module's documentation).
    async fn send(
        &self,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<(StatusCode, Bytes), LimiterError> {
        let servers = self.base_urls.len();
        let first = self.preferred.load(Ordering::Relaxed) % servers;
        let body = Bytes::from(body.unwrap_or_default());
        let mut retries: u32 = 0;
        loop {
            let server = (first + retries as usize) % servers;
            let uri: Uri = format!("{}{path}", self.base_urls[server])
                .parse()
                .map_err(|e| LimiterError::InvalidRequest(format!("bad path {path:?}: {e}")))?;
            let attempt = self.attempt(method.clone(), uri.clone(), body.clone()).await?;
            // Full rounds of the list done before this attempt: the backoff grows per round.
            let rounds = retries / servers as u32;
            let hint_ms = match &attempt {
                Attempt::Answered(status, bytes) if *status == StatusCode::SERVICE_UNAVAILABLE => {
                    error_body(bytes).retry_after_ms.unwrap_or(RETRY_HINT_MS_DEFAULT)
                }
                Attempt::Answered(status, bytes) => {
                    self.preferred.store(server, Ordering::Relaxed);
                    return Ok((*status, bytes.clone()));
                }
                Attempt::NoAnswer(why) => {
                    tracing::debug!(%uri, %why, retries, "no answer");
                    RETRY_BACKOFF_MS_BASE << rounds
                }
            };
            if retries == self.retries_max {
                return Err(LimiterError::Unavailable {
                    retry_after_ms: hint_ms,
                });
            }
            retries += 1;
            // A server not yet tried in this call is tried at once; coming back to
            // one already tried waits its hint, as a retry on one server always has.
            if retries as usize % servers == 0 {
                tokio::time::sleep(Duration::from_millis(hint_ms.min(self.retry_wait_ms_max))).await;
            }
        }
    }

    async fn attempt(&self, method: Method, uri: Uri, body: Bytes) -> Result<Attempt, LimiterError> {
        let mut request = Request::builder().method(method).uri(uri);
        if !body.is_empty() {
            request = request.header(header::CONTENT_TYPE, "application/json");
        }
        if let Some(authorization) = &self.authorization {
            request = request.header(header::AUTHORIZATION, authorization.clone());
        }
        let request = request
            .body(Full::new(body))
            .map_err(|e| LimiterError::InvalidRequest(format!("could not build the request: {e}")))?;
        let exchange = async {
            let response = self.client.request(request).await.map_err(|e| e.to_string())?;
            let status = response.status();
            let bytes = Limited::new(response.into_body(), RESPONSE_BYTES_MAX)
                .collect()
                .await
                .map_err(|e| e.to_string())?
                .to_bytes();
            Ok::<_, String>((status, bytes))
        };
        Ok(match tokio::time::timeout(self.request_timeout, exchange).await {
            Ok(Ok((status, bytes))) => Attempt::Answered(status, bytes),
            Ok(Err(why)) => Attempt::NoAnswer(why),
            Err(_) => Attempt::NoAnswer("timed out".to_owned()),
        })
    }
}

#[async_trait]
impl Limiter for HttpClient {
    async fn reserve(&self, request: &ReserveRequest) -> Result<ReserveOutcome, LimiterError> {
        let body = serde_json::to_vec(request).expect("requests serialize");
        let (status, bytes) = self.send(Method::POST, "/v1/reserve", Some(body)).await?;
        expect_ok(status, &bytes)?;
        let response: ReserveResponse = parse_json(&bytes)?;
        ReserveOutcome::try_from(&response).map_err(|e| LimiterError::Backend(e.to_string()))
    }

    async fn complete(&self, request: &CompleteRequest) -> Result<(), LimiterError> {
        let body = serde_json::to_vec(request).expect("requests serialize");
        let (status, bytes) = self.send(Method::POST, "/v1/complete", Some(body)).await?;
        expect_ok(status, &bytes)
    }
}

fn error_body(bytes: &[u8]) -> ErrorBody {
    serde_json::from_slice(bytes).unwrap_or_default()
}

fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, LimiterError> {
    serde_json::from_slice(bytes).map_err(|e| LimiterError::Backend(format!("unexpected answer: {e}")))
}

/// Maps an error status back to the [`LimiterError`] the server started from.
fn expect_ok(status: StatusCode, bytes: &[u8]) -> Result<(), LimiterError> {
    if status == StatusCode::OK {
        return Ok(());
    }
    let body = error_body(bytes);
    let error = body.error;
    Err(match status {
        StatusCode::BAD_REQUEST | StatusCode::PAYLOAD_TOO_LARGE => {
            LimiterError::InvalidRequest(error.strip_prefix("invalid_request: ").unwrap_or(&error).to_owned())
        }
        StatusCode::UNAUTHORIZED => {
            LimiterError::InvalidRequest("unauthorized: the server did not accept the token".to_owned())
        }
        StatusCode::NOT_FOUND => match error.strip_prefix("unknown_limit_key: ").map(LimitKey::new) {
            Some(Ok(key)) => LimiterError::UnknownKey(key),
            _ => LimiterError::Backend(format!("HTTP 404: {error}")),
        },
        StatusCode::CONFLICT => LimiterError::Conflict(error.strip_prefix("conflict: ").unwrap_or(&error).to_owned()),
        StatusCode::SERVICE_UNAVAILABLE => LimiterError::Unavailable {
            retry_after_ms: body.retry_after_ms.unwrap_or(RETRY_HINT_MS_DEFAULT),
        },
        StatusCode::TOO_MANY_REQUESTS => LimiterError::TooManyLeases {
            retry_after_ms: body.retry_after_ms.unwrap_or(RETRY_HINT_MS_DEFAULT),
            message: error.strip_prefix("too_many_leases: ").unwrap_or(&error).to_owned(),
        },
        other => LimiterError::Backend(format!("HTTP {}: {error}", other.as_u16())),
    })
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};

    use super::*;
    use crate::base::id::LeaseId;
    use crate::model::wire::Requirement;

    /// What the fake server does with one request.
    #[derive(Clone, Copy)]
    enum Canned {
        /// Answers this status and JSON body.
        Answer(u16, &'static str),
        /// Never answers: the client must time out.
        Silent,
        /// Closes the connection without answering: a server dying mid-request.
        HangUp,
    }
    use Canned::{Answer, HangUp, Silent};

    /// A fake server that answers each request with the next canned answer and
    /// records every request body. One request per connection keeps it simple.
    async fn fake_server(answers: Vec<Canned>) -> (String, Arc<Mutex<Vec<String>>>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let bodies = Arc::new(Mutex::new(Vec::new()));
        let seen = bodies.clone();
        tokio::spawn(async move {
            for answer in answers {
                let (mut stream, _) = listener.accept().await.unwrap();
                let body = read_request(&mut stream).await;
                seen.lock().unwrap().push(body);
                match answer {
                    Answer(status, json) => {
                        let response = format!(
                            "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{json}",
                            json.len()
                        );
                        stream.write_all(response.as_bytes()).await.unwrap();
                    }
                    // Keep the connection open and silent until the test ends.
                    Silent => drop(tokio::spawn(async move {
                        tokio::time::sleep(Duration::from_secs(60)).await;
                        drop(stream);
                    })),
                    HangUp => drop(stream),
                }
            }
        });
        (url, bodies)
    }

    async fn read_request(stream: &mut TcpStream) -> String {
        let mut data = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            let n = stream.read(&mut buf).await.unwrap();
            assert!(n > 0, "client closed early");
            data.extend_from_slice(&buf[..n]);
            let text = String::from_utf8_lossy(&data).to_string();
            if let Some(end) = text.find("\r\n\r\n") {
                let length = text[..end]
                    .lines()
                    .find_map(|l| {
                        l.to_ascii_lowercase()
                            .strip_prefix("content-length: ")
                            .map(str::to_owned)
                    })
                    .map(|v| v.trim().parse::<usize>().unwrap())
                    .unwrap_or(0);
                if data.len() >= end + 4 + length {
                    return text[end + 4..end + 4 + length].to_owned();
                }
            }
        }
    }

    fn client(url: &str, retries_max: u32) -> HttpClient {
        fleet_client(&[url], retries_max)
    }

    fn fleet_client(urls: &[&str], retries_max: u32) -> HttpClient {
        HttpClient::new(HttpClientConfig {
            request_timeout_ms: 300,
            retries_max,
            retry_wait_ms_max: 5,
            ..HttpClientConfig::fleet(urls.iter().copied())
        })
        .unwrap()
    }

    /// The URL of a port that was bound, then closed: connecting is refused.
    async fn dead_server() -> String {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        format!("http://{}", listener.local_addr().unwrap())
    }

    /// Asserts every recorded body is `request`, the same lease id included.
    fn assert_all_sent(bodies: &Mutex<Vec<String>>, request: &ReserveRequest, count: usize) {
        let bodies = bodies.lock().unwrap();
        assert_eq!(bodies.len(), count, "{bodies:?}");
        for body in bodies.iter() {
            assert_eq!(&serde_json::from_str::<ReserveRequest>(body).unwrap(), request);
        }
    }

    fn request() -> ReserveRequest {
        let requirement = Requirement {
            key: LimitKey::new("global:rpm").unwrap(),
            amount: 1,
        };
        ReserveRequest::new(LeaseId::generate(), None, vec![requirement]).unwrap()
    }

    const ALLOWED: &str = r#"{"allowed":true,"retry_after_ms":0,"reserved_at_unix_ms":1234}"#;
    const UNAVAILABLE: &str = r#"{"error":"backend_unavailable","retry_after_ms":3}"#;

    #[tokio::test]
    async fn a_503_and_a_timeout_are_retried_with_the_same_lease_id() {
        let (url, bodies) = fake_server(vec![Answer(503, UNAVAILABLE), Silent, Answer(200, ALLOWED)]).await;
        let request = request();
        let outcome = client(&url, 2).reserve(&request).await.unwrap();
        assert_eq!(
            outcome,
            ReserveOutcome::Allowed {
                reserved_at_unix_ms: 1234
            }
        );
        let bodies = bodies.lock().unwrap();
        assert_eq!(bodies.len(), 3);
        for body in bodies.iter() {
            let sent: ReserveRequest = serde_json::from_str(body).unwrap();
            assert_eq!(sent, request);
        }
    }

    #[tokio::test]
    async fn retries_are_bounded_and_end_in_unavailable() {
        let (url, bodies) = fake_server(vec![Answer(503, UNAVAILABLE), Answer(503, UNAVAILABLE)]).await;
        let error = client(&url, 1).reserve(&request()).await.unwrap_err();
        assert_eq!(error, LimiterError::Unavailable { retry_after_ms: 3 });
        assert_eq!(bodies.lock().unwrap().len(), 2);
    }

    #[tokio::test]
    async fn error_statuses_map_back_to_limiter_errors() {
        let cases: Vec<(u16, &'static str, LimiterError)> = vec![
            (
                404,
                r#"{"allowed":false,"retry_after_ms":0,"error":"unknown_limit_key: global:rpm"}"#,
                LimiterError::UnknownKey(LimitKey::new("global:rpm").unwrap()),
            ),
            (
                400,
                r#"{"error":"invalid_request: bad"}"#,
                LimiterError::InvalidRequest("bad".into()),
            ),
            (
                409,
                r#"{"error":"conflict: kind"}"#,
                LimiterError::Conflict("kind".into()),
            ),
            (
                500,
                r#"{"error":"backend_error"}"#,
                LimiterError::Backend("HTTP 500: backend_error".into()),
            ),
            (
                429,
                r#"{"error":"too_many_leases: client_tokens[0] holds 10 live leases","retry_after_ms":1000}"#,
                LimiterError::TooManyLeases {
                    retry_after_ms: 1000,
                    message: "client_tokens[0] holds 10 live leases".into(),
                },
            ),
        ];
        for (status, body, expected) in cases {
            let (url, _) = fake_server(vec![Answer(status, body)]).await;
            assert_eq!(client(&url, 0).reserve(&request()).await.unwrap_err(), expected);
        }
    }

    #[tokio::test]
    async fn denials_and_completions_are_read_back() {
        let denied = r#"{"allowed":false,"retry_after_ms":40,"reserved_at_unix_ms":0,"error":"insufficient_capacity:global:rpm"}"#;
        let (url, bodies) = fake_server(vec![Answer(200, denied), Answer(200, r#"{"ok":true}"#)]).await;
        let client = client(&url, 0);
        let outcome = client.reserve(&request()).await.unwrap();
        assert!(!outcome.is_allowed());
        let complete = CompleteRequest::new(LeaseId::generate(), None, vec![]).unwrap();
        client.complete(&complete).await.unwrap();
        assert!(bodies.lock().unwrap()[1].contains(&complete.lease_id().to_string()));
    }

    #[test]
    fn bad_configurations_are_refused() {
        assert!(HttpClient::new(HttpClientConfig::new("https://x:1")).is_err());
        assert!(HttpClient::new(HttpClientConfig::new("x:1")).is_err());
        let too_many = HttpClientConfig {
            retries_max: RETRIES_MAX_LIMIT + 1,
            ..HttpClientConfig::new("http://127.0.0.1:1")
        };
        assert!(HttpClient::new(too_many).is_err());
    }

    #[test]
    fn bad_server_lists_are_refused_with_a_reason() {
        let error = |urls: Vec<String>| HttpClient::new(HttpClientConfig::fleet(urls)).unwrap_err().to_string();
        assert!(error(vec![]).contains("at least one"));
        let many: Vec<String> = (0..=SERVERS_MAX)
            .map(|i| format!("http://127.0.0.1:{}", 1000 + i))
            .collect();
        assert!(error(many).contains(&format!("at most {SERVERS_MAX}")));
        let twice = vec!["http://127.0.0.1:1".to_owned(), "http://127.0.0.1:1/".to_owned()];
        assert!(error(twice).contains("listed twice"));
        for bad in [
            "http://",
            "http://a:1?x=1",
            "127.0.0.1:1",
            "https://a:1",
            "http://a b:1",
        ] {
            let urls = vec!["http://127.0.0.1:1".to_owned(), bad.to_owned()];
            assert!(error(urls).contains(&format!("{bad:?}")), "{bad}");
        }
        let fleet = HttpClient::new(HttpClientConfig::fleet(["http://a:1/", " http://b:2"])).unwrap();
        assert_eq!(fleet.servers(), ["http://a:1", "http://b:2"]);
        assert_eq!(fleet.preferred_server(), "http://a:1");
    }

    #[tokio::test]
    async fn a_refused_first_server_fails_over_with_the_same_lease_id() {
        let dead = dead_server().await;
        let (live, bodies) = fake_server(vec![Answer(200, ALLOWED)]).await;
        let request = request();
        let client = fleet_client(&[&dead, &live], 1);
        assert!(client.reserve(&request).await.unwrap().is_allowed());
        assert_all_sent(&bodies, &request, 1);
        assert_eq!(client.preferred_server(), live);
    }

    #[tokio::test]
    async fn a_server_dying_mid_request_costs_one_attempt_not_one_per_call() {
        let (dying, dying_bodies) = fake_server(vec![HangUp, Answer(200, ALLOWED)]).await;
        let (live, live_bodies) = fake_server(vec![Answer(200, ALLOWED), Answer(200, r#"{"ok":true}"#)]).await;
        let request = request();
        let client = fleet_client(&[&dying, &live], 1);
        assert!(client.reserve(&request).await.unwrap().is_allowed());
        assert_all_sent(&dying_bodies, &request, 1);
        assert_all_sent(&live_bodies, &request, 1);
        // Later calls, from clones too, start on the server that answered.
        let complete = CompleteRequest::new(request.lease_id(), None, vec![]).unwrap();
        client.clone().complete(&complete).await.unwrap();
        assert_eq!(dying_bodies.lock().unwrap().len(), 1);
        assert_eq!(live_bodies.lock().unwrap().len(), 2);
    }

    #[tokio::test]
    async fn a_503_fails_over_at_once_whatever_its_hint() {
        const LONG_HINT: &str = r#"{"error":"backend_unavailable","retry_after_ms":60000}"#;
        let (busy, busy_bodies) = fake_server(vec![Answer(503, LONG_HINT)]).await;
        let (live, live_bodies) = fake_server(vec![Answer(200, ALLOWED)]).await;
        let client = HttpClient::new(HttpClientConfig {
            retries_max: 1,
            retry_wait_ms_max: 60_000,
            ..HttpClientConfig::fleet([&busy, &live])
        })
        .unwrap();
        let request = request();
        let started = std::time::Instant::now();
        assert!(client.reserve(&request).await.unwrap().is_allowed());
        assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
        assert_all_sent(&busy_bodies, &request, 1);
        assert_all_sent(&live_bodies, &request, 1);
        assert_eq!(client.preferred_server(), live);
    }

    #[tokio::test]
    async fn failover_attempts_are_bounded_in_total_and_wrap_around() {
        let (a, a_bodies) = fake_server(vec![Answer(503, UNAVAILABLE), Answer(503, UNAVAILABLE)]).await;
        let (b, b_bodies) = fake_server(vec![Answer(503, UNAVAILABLE), Answer(200, ALLOWED)]).await;
        let (c, c_bodies) = fake_server(vec![Answer(503, UNAVAILABLE), Answer(200, ALLOWED)]).await;
        let request = request();
        let client = fleet_client(&[&a, &b, &c], 3);
        let error = client.reserve(&request).await.unwrap_err();
        assert_eq!(error, LimiterError::Unavailable { retry_after_ms: 3 });
        // Four attempts: a, b, c, then a again; the preference did not move.
        assert_all_sent(&a_bodies, &request, 2);
        assert_all_sent(&b_bodies, &request, 1);
        assert_all_sent(&c_bodies, &request, 1);
        assert_eq!(client.preferred_server(), a);
    }

    #[tokio::test]
    async fn denials_and_4xx_are_never_tried_elsewhere() {
        let denied = r#"{"allowed":false,"retry_after_ms":40,"reserved_at_unix_ms":0,"error":"insufficient_capacity:global:rpm"}"#;
        let (first, first_bodies) = fake_server(vec![
            Answer(200, denied),
            Answer(400, r#"{"error":"invalid_request: bad"}"#),
        ])
        .await;
        let (second, second_bodies) = fake_server(vec![Answer(200, ALLOWED)]).await;
        let client = fleet_client(&[&first, &second], 3);
        assert!(!client.reserve(&request()).await.unwrap().is_allowed());
        let error = client.reserve(&request()).await.unwrap_err();
        assert_eq!(error, LimiterError::InvalidRequest("bad".into()));
        assert_eq!(first_bodies.lock().unwrap().len(), 2);
        assert!(second_bodies.lock().unwrap().is_empty());
    }

    #[tokio::test]
    async fn admin_calls_fail_over_too() {
        let dead = dead_server().await;
        let report = r#"[]"#;
        let (live, bodies) = fake_server(vec![Answer(200, report)]).await;
        let client = fleet_client(&[&dead, &live], 1);
        assert!(client.limits().await.unwrap().is_empty());
        assert_eq!(bodies.lock().unwrap().len(), 1);
    }
}
