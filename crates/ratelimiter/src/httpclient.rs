//! The remote [`Limiter`] (spec §11.3): reserve and complete over HTTP against
//! `ratelimiterd`, plus the admin calls its operator CLI needs.
//!
//! Connections are kept alive and reused. Every request has a timeout. A request
//! that times out, cannot connect, or is answered 503 is retried a bounded number
//! of times with the very same body, hence the same lease id, so a retry can never
//! reserve twice (ADR 0004). Plain HTTP/1.1 only: put a TLS proxy in front when
//! the network needs it.

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

use crate::definition::{LimitDefinition, LimitReport};
use crate::error::LimiterError;
use crate::key::LimitKey;
use crate::limiter::Limiter;
use crate::wire::{CompleteRequest, ReserveOutcome, ReserveRequest, ReserveResponse};

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

/// Why an [`HttpClient`] could not be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("http client: {0}")]
pub struct HttpClientError(String);

/// How the client reaches the server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpClientConfig {
    /// `http://host:port` of `ratelimiterd`.
    pub base_url: String,
    /// Sent as `Authorization: Bearer <token>` when set (client or admin token).
    pub token: Option<String>,
    /// How long one attempt may take, connecting included.
    pub request_timeout_ms: u64,
    /// How long connecting may take.
    pub connect_timeout_ms: u64,
    /// Retries after a timeout, a connection failure or a 503; 0..=10.
    pub retries_max: u32,
    /// The longest wait before one retry, whatever the server's hint.
    pub retry_wait_ms_max: u64,
}

impl HttpClientConfig {
    /// Defaults for `base_url`: 2 s per attempt, 1 s to connect, 2 retries waiting
    /// at most 1 s each.
    pub fn new(base_url: impl Into<String>) -> Self {
        Self {
            base_url: base_url.into(),
            token: None,
            request_timeout_ms: 2_000,
            connect_timeout_ms: 1_000,
            retries_max: 2,
            retry_wait_ms_max: 1_000,
        }
    }
}

/// A [`Limiter`] backed by a remote `ratelimiterd`. Clones share connections.
#[derive(Debug, Clone)]
pub struct HttpClient {
    client: Client<HttpConnector, Full<Bytes>>,
    base_url: String,
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
        let base_url = config.base_url.trim_end_matches('/').to_owned();
        if !base_url.starts_with("http://") {
            return invalid(format!(
                "base_url {base_url:?} must start with http:// (TLS is not built in)"
            ));
        }
        if base_url.parse::<Uri>().is_err() {
            return invalid(format!("base_url {base_url:?} is not a URL"));
        }
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
        let client = Client::builder(TokioExecutor::new())
            .pool_timer(TokioTimer::new())
            .pool_idle_timeout(Duration::from_millis(POOL_IDLE_TIMEOUT_MS))
            .pool_max_idle_per_host(POOL_IDLE_PER_HOST_MAX)
            .build(connector);
        Ok(Self {
            client,
            base_url,
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

    /// Sends one request, retrying it unchanged while there is no answer or a 503.
    async fn send(
        &self,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<(StatusCode, Bytes), LimiterError> {
        let uri: Uri = format!("{}{path}", self.base_url)
            .parse()
            .map_err(|e| LimiterError::InvalidRequest(format!("bad path {path:?}: {e}")))?;
        let body = Bytes::from(body.unwrap_or_default());
        let mut retries = 0;
        loop {
            let attempt = self.attempt(method.clone(), uri.clone(), body.clone()).await?;
            let hint_ms = match &attempt {
                Attempt::Answered(status, bytes) if *status == StatusCode::SERVICE_UNAVAILABLE => {
                    error_body(bytes).retry_after_ms.unwrap_or(RETRY_HINT_MS_DEFAULT)
                }
                Attempt::Answered(status, bytes) => return Ok((*status, bytes.clone())),
                Attempt::NoAnswer(why) => {
                    tracing::debug!(%uri, %why, retries, "no answer");
                    RETRY_BACKOFF_MS_BASE << retries
                }
            };
            if retries == self.retries_max {
                return Err(LimiterError::Unavailable {
                    retry_after_ms: hint_ms,
                });
            }
            retries += 1;
            tokio::time::sleep(Duration::from_millis(hint_ms.min(self.retry_wait_ms_max))).await;
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
        other => LimiterError::Backend(format!("HTTP {}: {error}", other.as_u16())),
    })
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};

    use super::*;
    use crate::id::LeaseId;
    use crate::wire::Requirement;

    /// A canned answer: `None` never answers (the client must time out).
    type Canned = Option<(u16, &'static str)>;

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
                    Some((status, json)) => {
                        let response = format!(
                            "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{json}",
                            json.len()
                        );
                        stream.write_all(response.as_bytes()).await.unwrap();
                    }
                    // Keep the connection open and silent until the test ends.
                    None => drop(tokio::spawn(async move {
                        tokio::time::sleep(Duration::from_secs(60)).await;
                        drop(stream);
                    })),
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
        HttpClient::new(HttpClientConfig {
            request_timeout_ms: 300,
            retries_max,
            retry_wait_ms_max: 5,
            ..HttpClientConfig::new(url)
        })
        .unwrap()
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
        let (url, bodies) = fake_server(vec![Some((503, UNAVAILABLE)), None, Some((200, ALLOWED))]).await;
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
        let (url, bodies) = fake_server(vec![Some((503, UNAVAILABLE)), Some((503, UNAVAILABLE))]).await;
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
        ];
        for (status, body, expected) in cases {
            let (url, _) = fake_server(vec![Some((status, body))]).await;
            assert_eq!(client(&url, 0).reserve(&request()).await.unwrap_err(), expected);
        }
    }

    #[tokio::test]
    async fn denials_and_completions_are_read_back() {
        let denied = r#"{"allowed":false,"retry_after_ms":40,"reserved_at_unix_ms":0,"error":"insufficient_capacity:global:rpm"}"#;
        let (url, bodies) = fake_server(vec![Some((200, denied)), Some((200, r#"{"ok":true}"#))]).await;
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
}
