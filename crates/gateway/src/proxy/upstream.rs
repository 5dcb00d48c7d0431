//! The HTTP client to the upstreams (docs/gateway.md, "Upstreams").
//!
//! hyper's pooled HTTP/1.1 client: already in the workspace (the library's
//! `HttpClient` and the simulator use it), no extra layer between the socket and
//! the frames the gateway forwards, and the fastest of the candidates (reqwest
//! wraps this same client), with rustls for `https://` upstreams.

use std::time::Duration;

use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, Request, Response};
use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use percent_encoding::utf8_percent_encode;

use crate::config::{UpstreamConfig, UpstreamKind};
use crate::proxy::headers::Forwarded;

/// Idle pooled connections kept per upstream host: enough for a burst of calls
/// in flight to reuse connections rather than open new ones.
pub const POOL_IDLE_PER_HOST: usize = 1_024;
/// How long an idle pooled connection is kept.
pub const POOL_IDLE_TIMEOUT_MS: u64 = 90_000;

/// Why an upstream call failed before its answer's headers.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    /// No connection could be made: nothing reached the provider.
    #[error("upstream unreachable: {0}")]
    Unreachable(String),
    /// The connection failed after the request may have been sent.
    #[error("upstream failed: {0}")]
    Failed(String),
    /// No answer within `gateway.upstream_timeout_ms`.
    #[error("upstream did not answer in time")]
    Timeout,
}

/// One configured upstream with its key, read from the environment at startup.
#[derive(Clone)]
pub struct Upstream {
    /// The configuration entry.
    pub config: UpstreamConfig,
    auth: Option<(HeaderName, HeaderValue)>,
    forwarded: Forwarded,
}

impl std::fmt::Debug for Upstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Upstream")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl Upstream {
    /// The upstream of `config`, its key taken from `api_key_env`.
    pub fn new(config: UpstreamConfig) -> Result<Self, String> {
        let auth = match &config.api_key_env {
            None => None,
            Some(var) => {
                let key = std::env::var(var).map_err(|_| {
                    format!(
                        "gateway upstream {}: environment variable {var} is not set",
                        config.name
                    )
                })?;
                // Trimmed like the tenants' keys: a key file's newline is not part of it.
                let key = key.trim().to_owned();
                if key.is_empty() {
                    return Err(format!("gateway upstream {}: the key in {var} is empty", config.name));
                }
                let (name, value) = match config.kind {
                    UpstreamKind::Anthropic => ("x-api-key", key),
                    UpstreamKind::Azure => ("api-key", key),
                    _ => ("authorization", format!("Bearer {key}")),
                };
                let mut value = HeaderValue::from_str(&value)
                    .map_err(|_| format!("gateway upstream {}: {var} is not a valid header value", config.name))?;
                value.set_sensitive(true);
                Some((HeaderName::from_static(name), value))
            }
        };
        let forwarded = Forwarded::new(&config.forward_headers);
        Ok(Self {
            config,
            auth,
            forwarded,
        })
    }
}

impl Upstream {
    /// The path of an API `path` (`/v1/chat/completions`) on this upstream, for
    /// a call to `model` (the name sent upstream): the same path, except on
    /// Azure, whose chat completions and embeddings live under the deployment
    /// (`/openai/deployments/{model}/chat/completions`) and its other paths
    /// under `/openai/` (`/openai/responses`), each with the upstream's
    /// `api-version`
    /// (<https://learn.microsoft.com/en-us/azure/ai-foundry/openai/reference>).
    pub fn path_of<'a>(&self, path: &'a str, model: &str) -> std::borrow::Cow<'a, str> {
        if self.config.kind != UpstreamKind::Azure {
            return std::borrow::Cow::Borrowed(path);
        }
        let version = self.config.api_version.as_deref().unwrap_or_default();
        let rest = path.strip_prefix("/v1/").unwrap_or(path.trim_start_matches('/'));
        let deployment = utf8_percent_encode(model, PATH_SEGMENT);
        std::borrow::Cow::Owned(match rest {
            "chat/completions" | "embeddings" => {
                format!("/openai/deployments/{deployment}/{rest}?api-version={version}")
            }
            _ => format!("/openai/{rest}?api-version={version}"),
        })
    }
}

/// The bytes escaped in a deployment's name in a path: all but the unreserved
/// ones of RFC 3986 (a deployment's name is letters, digits, `-`, `_` and `.`).
const PATH_SEGMENT: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'~');

/// The pooled client shared by every upstream.
#[derive(Clone)]
pub struct UpstreamClient {
    client: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
    timeout: Duration,
}

impl UpstreamClient {
    /// A client whose calls give up after `timeout` without an answer; `https://`
    /// upstreams are verified against Mozilla's roots (webpki-roots).
    pub fn new(timeout: Duration) -> Self {
        let roots = rustls::RootCertStore {
            roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
        };
        Self::with_roots(timeout, roots)
    }

    /// A client that trusts `roots` only: a private CA, or a test's certificate.
    pub fn with_roots(timeout: Duration, roots: rustls::RootCertStore) -> Self {
        let mut http = HttpConnector::new();
        http.set_nodelay(true);
        // The TLS connector does the scheme check itself.
        http.enforce_http(false);
        let tls =
            rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .expect("ring supports the default protocol versions")
                .with_root_certificates(roots)
                .with_no_client_auth();
        let connector = HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        let client = Client::builder(TokioExecutor::new())
            .pool_max_idle_per_host(POOL_IDLE_PER_HOST)
            .pool_idle_timeout(Duration::from_millis(POOL_IDLE_TIMEOUT_MS))
            .build(connector);
        Self { client, timeout }
    }

    /// How long a call, or a pause in a stream, may take.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Sends `body` to `upstream`'s `path` with the provider's key and the
    /// client's API options; resolves at the answer's headers.
    pub async fn send(
        &self,
        upstream: &Upstream,
        method: Method,
        path: &str,
        client_headers: &HeaderMap,
        body: Bytes,
    ) -> Result<Response<Incoming>, UpstreamError> {
        self.send_with(upstream, (method, path), client_headers, None, body)
            .await
    }

    /// [`UpstreamClient::send`] with `extra` headers set on the request after
    /// the client's (the try's `traceparent`, docs/observability.md).
    pub async fn send_with(
        &self,
        upstream: &Upstream,
        (method, path): (Method, &str),
        client_headers: &HeaderMap,
        extra: Option<HeaderMap>,
        body: Bytes,
    ) -> Result<Response<Incoming>, UpstreamError> {
        let uri = format!("{}{path}", upstream.config.base_url.trim_end_matches('/'));
        let mut builder = Request::builder().method(method).uri(uri);
        let headers = builder.headers_mut().expect("a fresh builder");
        headers.insert("content-type", HeaderValue::from_static("application/json"));
        upstream.forwarded.copy(client_headers, headers);
        if upstream.config.kind == UpstreamKind::Anthropic && !headers.contains_key("anthropic-version") {
            headers.insert(
                "anthropic-version",
                HeaderValue::from_static(crate::wire::anthropic::API_VERSION_DEFAULT),
            );
        }
        if let Some(extra) = extra {
            headers.extend(extra);
        }
        if let Some((name, value)) = &upstream.auth {
            headers.insert(name.clone(), value.clone());
        }
        let request = builder
            .body(Full::new(body))
            .map_err(|e| UpstreamError::Failed(e.to_string()))?;
        match tokio::time::timeout(self.timeout, self.client.request(request)).await {
            Err(_) => Err(UpstreamError::Timeout),
            Ok(Ok(response)) => Ok(response),
            Ok(Err(e)) if e.is_connect() => Err(UpstreamError::Unreachable(e.to_string())),
            Ok(Err(e)) => Err(UpstreamError::Failed(e.to_string())),
        }
    }
}

/// The answer's headers the client gets: the provider's answer only
/// ([`crate::proxy::headers::answer_headers`]).
pub fn response_headers(upstream: HeaderMap) -> HeaderMap {
    crate::proxy::headers::answer_headers(upstream)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn upstream(kind: &str) -> Upstream {
        let version = if kind == "azure" {
            ", api_version: \"2024-10-21\""
        } else {
            ""
        };
        let yaml = format!("{{name: u, kind: {kind}, base_url: \"https://acme.openai.azure.com\"{version}}}");
        Upstream::new(serde_yaml::from_str(&yaml).unwrap()).unwrap()
    }

    #[test]
    fn azure_paths_name_the_deployment_and_the_api_version() {
        let azure = upstream("azure");
        assert_eq!(
            azure.path_of("/v1/chat/completions", "gpt-4o-prod"),
            "/openai/deployments/gpt-4o-prod/chat/completions?api-version=2024-10-21"
        );
        assert_eq!(
            azure.path_of("/v1/embeddings", "embed/large v2"),
            "/openai/deployments/embed%2Flarge%20v2/embeddings?api-version=2024-10-21"
        );
        assert_eq!(
            azure.path_of("/v1/responses", "gpt-4o-prod"),
            "/openai/responses?api-version=2024-10-21"
        );
        let openai = upstream("openai");
        assert_eq!(openai.path_of("/v1/chat/completions", "gpt-4o"), "/v1/chat/completions");
    }
}
