//! The replay's HTTP client for the provider: one chat call, and its outcome in
//! the terms a strategy acts on (done with usage, throttled with a hint, failed).

use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::{Method, Request, StatusCode};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use crate::sim::wire::{ChatRequest, Message, Usage, ADMITTED_HEADER};

/// How long one call may take before it counts as failed: far above any
/// simulated call, so it only ends calls to a provider that stopped answering.
pub const CALL_TIMEOUT_MS: u64 = 600_000;
/// The largest response body read, in bytes.
pub const RESPONSE_BYTES_MAX: usize = 4 * 1024 * 1024;
/// The retry hint assumed when a 429 carries none, in ms (OpenAI's cookbook waits 15 s;
/// the simulated provider always sends one, so this is only a fallback).
pub const RETRY_AFTER_DEFAULT_MS: u64 = 1_000;

/// A served call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Served {
    /// The provider's usage.
    pub usage: Usage,
    /// When the provider admitted the call, Unix ms ([`ADMITTED_HEADER`]);
    /// `None` from a provider that does not say.
    pub admitted_unix_ms: Option<u64>,
}

/// What one call came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallOutcome {
    /// Served: the usage and the admission instant.
    Done(Served),
    /// HTTP 429: retry after the hint.
    Throttled {
        /// The provider's `retry-after-ms`, or `retry-after` in seconds.
        retry_after_ms: u64,
    },
    /// Anything else: a refusal for good or a transport failure.
    Failed(String),
}

/// A pooled HTTP/1.1 client for one provider.
#[derive(Debug, Clone)]
pub struct ProviderClient {
    client: Client<HttpConnector, Full<Bytes>>,
    url: String,
    model: String,
}

impl ProviderClient {
    /// A client for the provider at `base_url` (`http://127.0.0.1:port`), calling `model`.
    pub fn new(base_url: &str, model: &str) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .build(connector);
        Self {
            client,
            url: format!("{}/v1/chat/completions", base_url.trim_end_matches('/')),
            model: model.to_owned(),
        }
    }

    /// Sends `prompt` with the `max_tokens` bound; the simulated model writes
    /// `sim_output_tokens` (capped by the bound).
    pub async fn call(&self, prompt: String, max_tokens: u64, sim_output_tokens: u64) -> CallOutcome {
        let body = ChatRequest {
            model: self.model.clone(),
            messages: vec![Message {
                role: "user".to_owned(),
                content: prompt,
            }],
            max_tokens: Some(max_tokens),
            sim_output_tokens: Some(sim_output_tokens),
        };
        let body = serde_json::to_vec(&body).expect("a chat request serializes");
        let request = Request::builder()
            .method(Method::POST)
            .uri(&self.url)
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body)))
            .expect("a valid request");
        let call = async {
            let response = self
                .client
                .request(request)
                .await
                .map_err(|e| format!("provider call: {e}"))?;
            let status = response.status();
            let retry_after_ms = retry_after_ms(response.headers());
            let headers = response.headers().clone();
            let limited = http_body_util::Limited::new(response.into_body(), RESPONSE_BYTES_MAX);
            let bytes = limited
                .collect()
                .await
                .map_err(|e| format!("provider body: {e}"))?
                .to_bytes();
            Ok::<_, String>((status, retry_after_ms, headers, bytes))
        };
        let (status, retry_after_ms, headers, bytes) =
            match tokio::time::timeout(Duration::from_millis(CALL_TIMEOUT_MS), call).await {
                Ok(Ok(answer)) => answer,
                Ok(Err(message)) => return CallOutcome::Failed(message),
                Err(_) => return CallOutcome::Failed(format!("no answer within {CALL_TIMEOUT_MS} ms")),
            };
        match status {
            StatusCode::OK => match serde_json::from_slice::<serde_json::Value>(&bytes)
                .ok()
                .and_then(|v| serde_json::from_value::<Usage>(v.get("usage")?.clone()).ok())
            {
                Some(usage) => CallOutcome::Done(Served {
                    usage,
                    admitted_unix_ms: header_u64(&headers, ADMITTED_HEADER),
                }),
                None => CallOutcome::Failed("provider answered 200 without usage".to_owned()),
            },
            StatusCode::TOO_MANY_REQUESTS => CallOutcome::Throttled {
                retry_after_ms: retry_after_ms.unwrap_or(RETRY_AFTER_DEFAULT_MS),
            },
            other => CallOutcome::Failed(format!(
                "provider answered {other}: {}",
                String::from_utf8_lossy(&bytes)
            )),
        }
    }
}

/// Reads `retry-after-ms`, else `retry-after` in whole seconds.
fn retry_after_ms(headers: &hyper::HeaderMap) -> Option<u64> {
    header_u64(headers, "retry-after-ms").or_else(|| header_u64(headers, "retry-after").map(|s| s * 1000))
}

/// A header's value as a whole number.
fn header_u64(headers: &hyper::HeaderMap, name: &str) -> Option<u64> {
    headers.get(name)?.to_str().ok()?.trim().parse::<u64>().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_prefers_milliseconds() {
        let mut headers = hyper::HeaderMap::new();
        assert_eq!(retry_after_ms(&headers), None);
        headers.insert("retry-after", "3".parse().unwrap());
        assert_eq!(retry_after_ms(&headers), Some(3_000));
        headers.insert("retry-after-ms", "2500".parse().unwrap());
        assert_eq!(retry_after_ms(&headers), Some(2_500));
    }
}
