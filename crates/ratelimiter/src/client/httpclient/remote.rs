//! The client itself: requests sent to the preferred server, retried and failed
//! over as the module's documentation says, and answers mapped back to the
//! limiter's results.

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

use super::config::{
    parse_servers, HttpClientConfig, HttpClientError, POOL_IDLE_PER_HOST_MAX, POOL_IDLE_TIMEOUT_MS, RESPONSE_BYTES_MAX,
    RETRIES_MAX_LIMIT, RETRY_BACKOFF_MS_BASE, RETRY_HINT_MS_DEFAULT,
};

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
        if let Some((traceparent, tracestate)) = super::trace_context::current() {
            request = request.header("traceparent", traceparent);
            if let Some(tracestate) = tracestate {
                request = request.header("tracestate", tracestate);
            }
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
