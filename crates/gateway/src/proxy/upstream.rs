//! The HTTP client to the upstreams (docs/gateway.md, "Upstreams").
//!
//! hyper's pooled HTTP/1.1 client: already in the workspace (the library's
//! `HttpClient` and the simulator use it), no extra layer between the socket and
//! the frames the gateway forwards, and the fastest of the candidates (reqwest
//! wraps this same client), with rustls for `https://` upstreams.

use std::sync::Arc;
use std::time::Duration;

use std::borrow::Cow;

use axum::http::header::CONTENT_TYPE;
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, Request, Response};
use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use percent_encoding::utf8_percent_encode;

use crate::config::{UpstreamConfig, UpstreamKind};
use crate::observe::trace::TraceHeaders;
use crate::proxy::credentials::{AwsSigner, Credentials};
use crate::proxy::headers::Forwarded;
use crate::proxy::vertex_token::VertexToken;
use crate::wire::envelope::Envelope;

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
    /// The gateway's credentials for the upstream could not be had (a token
    /// not renewed, a signature not made): nothing was sent.
    #[error("upstream credentials unavailable: {0}")]
    Credentials(String),
}

/// One configured upstream with its key, read from the environment at startup.
#[derive(Clone)]
pub struct Upstream {
    /// The configuration entry.
    pub config: UpstreamConfig,
    credentials: Credentials,
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
    /// The upstream of `config`, its key taken from `api_key_env`, or its
    /// kind's own credentials; an error naming the upstream and what is
    /// missing when they cannot be had.
    pub fn new(config: UpstreamConfig) -> Result<Self, String> {
        let credentials = match (&config.api_key_env, config.kind) {
            (None, UpstreamKind::Bedrock) => {
                let region = config.region.as_deref().expect("validated: bedrock has a region");
                let env = |var: &str| std::env::var(var).ok();
                Credentials::Aws(std::sync::Arc::new(AwsSigner::from_env(&config.name, region, &env)?))
            }
            (None, UpstreamKind::Vertex) => Credentials::Vertex(Arc::new(VertexToken::of_upstream(&config)?)),
            (Some(_), UpstreamKind::Vertex) => {
                return Err(format!(
                    "gateway upstream {}: kind vertex authenticates with a service account's key \
                     (credentials_file, or GOOGLE_APPLICATION_CREDENTIALS), not api_key_env",
                    config.name
                ))
            }
            (None, _) => Credentials::None,
            (Some(var), _) => {
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
                Credentials::Header(HeaderName::from_static(name), value)
            }
        };
        let forwarded = Forwarded::new(&config.forward_headers);
        Ok(Self {
            config,
            credentials,
            forwarded,
        })
    }

    /// The client's headers this upstream is passed (its `forward_headers`):
    /// what its envelope may carry in the body.
    pub fn forwarded_headers(&self, client_headers: &HeaderMap) -> HeaderMap {
        let mut out = HeaderMap::new();
        self.forwarded.copy(client_headers, &mut out);
        out
    }

    /// The envelope of calls to `model` (the name sent upstream) here.
    pub fn envelope(&self, model: &str) -> Envelope {
        Envelope::of(&self.config, model)
    }
}

impl Upstream {
    /// The path of an API `path` (`/v1/chat/completions`) on this upstream, for
    /// a call to `model` (the name sent upstream), streamed or not; `None` when
    /// the upstream serves no such API for the model. The same path, except:
    /// - on Azure, whose chat completions and embeddings live under the
    ///   deployment (`/openai/deployments/{model}/chat/completions`) and its
    ///   other paths under `/openai/` (`/openai/responses`), each with the
    ///   upstream's `api-version`
    ///   (<https://learn.microsoft.com/en-us/azure/ai-foundry/openai/reference>);
    /// - on Bedrock, where Claude's Messages are `InvokeModel`
    ///   (`/model/{model}/invoke`, or `/invoke-with-response-stream`,
    ///   <https://docs.aws.amazon.com/bedrock/latest/APIReference/API_runtime_InvokeModel.html>)
    ///   and other models' chat completions Bedrock's OpenAI-compatible
    ///   `/openai/v1/chat/completions`
    ///   (<https://docs.aws.amazon.com/bedrock/latest/userguide/inference-chat-completions.html>).
    pub fn path_of<'a>(&self, path: &'a str, model: &str, stream: bool) -> Option<Cow<'a, str>> {
        let rest = path.strip_prefix("/v1/").unwrap_or(path.trim_start_matches('/'));
        // A model id in a path is one segment: `:` and `/` (a Bedrock ARN) escaped,
        // as Bedrock's SigV4 canonical request expects.
        let segment = utf8_percent_encode(model, PATH_SEGMENT);
        match self.config.kind {
            UpstreamKind::Azure => {
                let version = self.config.api_version.as_deref().unwrap_or_default();
                Some(Cow::Owned(match rest {
                    "chat/completions" | "embeddings" => {
                        format!("/openai/deployments/{segment}/{rest}?api-version={version}")
                    }
                    _ => format!("/openai/{rest}?api-version={version}"),
                }))
            }
            UpstreamKind::Bedrock => match (self.envelope(model), rest) {
                (Envelope::BedrockMessages, "messages") if stream => {
                    Some(Cow::Owned(format!("/model/{segment}/invoke-with-response-stream")))
                }
                (Envelope::BedrockMessages, "messages") => Some(Cow::Owned(format!("/model/{segment}/invoke"))),
                (Envelope::Plain, "chat/completions") => Some(Cow::Borrowed("/openai/v1/chat/completions")),
                _ => None,
            },
            UpstreamKind::Vertex => self.vertex_path_of(rest, model, stream),
            _ => Some(Cow::Borrowed(path)),
        }
    }

    /// A Vertex AI path: Claude's Messages are `rawPredict`, or
    /// `streamRawPredict`, on the publisher's model
    /// (<https://docs.anthropic.com/en/api/claude-on-vertex-ai>), other models'
    /// chat completions the OpenAI-compatible endpoint
    /// (<https://cloud.google.com/vertex-ai/generative-ai/docs/start/openai>),
    /// each under the upstream's project and region.
    fn vertex_path_of(&self, rest: &str, model: &str, stream: bool) -> Option<Cow<'static, str>> {
        let project = self.config.project.as_deref().unwrap_or_default();
        let region = self.config.region.as_deref().unwrap_or_default();
        let location = format!("/v1/projects/{project}/locations/{region}");
        let segment = utf8_percent_encode(model, VERTEX_MODEL_SEGMENT);
        let action = if stream { "streamRawPredict" } else { "rawPredict" };
        match (self.envelope(model), rest) {
            (Envelope::VertexMessages, "messages") => Some(Cow::Owned(format!(
                "{location}/publishers/anthropic/models/{segment}:{action}"
            ))),
            (Envelope::Plain, "chat/completions") => {
                Some(Cow::Owned(format!("{location}/endpoints/openapi/chat/completions")))
            }
            _ => None,
        }
    }
}

/// The bytes escaped in a Vertex AI model id in a path: those of
/// [`PATH_SEGMENT`] but `@`, which a path segment may hold (RFC 3986,
/// `pchar`) and which Google's ids (`claude-sonnet-4-5@20250929`) and the
/// anthropic SDK's `AnthropicVertex` write as is.
const VERTEX_MODEL_SEGMENT: &percent_encoding::AsciiSet = &PATH_SEGMENT.remove(b'@');

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
        Self::with_roots(timeout, crate::proxy::connector::webpki_roots())
    }

    /// A client that trusts `roots` only: a private CA, or a test's certificate.
    pub fn with_roots(timeout: Duration, roots: rustls::RootCertStore) -> Self {
        let connector = crate::proxy::connector::https_connector(roots);
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

    /// [`UpstreamClient::send`] with the try's trace context (`traceparent`,
    /// docs/observability.md) set on the request after the client's headers.
    pub async fn send_with(
        &self,
        upstream: &Upstream,
        (method, path): (Method, &str),
        client_headers: &HeaderMap,
        extra: Option<TraceHeaders>,
        body: Bytes,
    ) -> Result<Response<Incoming>, UpstreamError> {
        let uri = format!("{}{path}", upstream.config.base_url.trim_end_matches('/'));
        let mut builder = Request::builder().method(method).uri(uri);
        let headers = builder.headers_mut().expect("a fresh builder");
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        upstream.forwarded.copy(client_headers, headers);
        if upstream.config.kind == UpstreamKind::Anthropic && !headers.contains_key("anthropic-version") {
            headers.insert(
                "anthropic-version",
                HeaderValue::from_static(crate::wire::anthropic::API_VERSION_DEFAULT),
            );
        }
        if let Some(extra) = extra {
            extra.write_into(headers);
        }
        let mut request = builder.body(body).map_err(|e| UpstreamError::Failed(e.to_string()))?;
        // Last: a signature covers the request as sent.
        (upstream.credentials.apply(&mut request).await).map_err(|e| UpstreamError::Credentials(e.0))?;
        let request = request.map(Full::new);
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
        let path = |path, model| azure.path_of(path, model, false).unwrap();
        assert_eq!(
            path("/v1/chat/completions", "gpt-4o-prod"),
            "/openai/deployments/gpt-4o-prod/chat/completions?api-version=2024-10-21"
        );
        assert_eq!(
            path("/v1/embeddings", "embed/large v2"),
            "/openai/deployments/embed%2Flarge%20v2/embeddings?api-version=2024-10-21"
        );
        assert_eq!(
            path("/v1/responses", "gpt-4o-prod"),
            "/openai/responses?api-version=2024-10-21"
        );
        let openai = upstream("openai");
        assert_eq!(
            openai.path_of("/v1/chat/completions", "gpt-4o", true).unwrap(),
            "/v1/chat/completions"
        );
    }

    #[test]
    fn bedrock_paths_invoke_claude_by_its_escaped_id_and_other_models_by_openais_path() {
        let config = serde_yaml::from_str("{name: b, kind: bedrock, region: us-east-1, api_key_env: PATH}").unwrap();
        let bedrock = Upstream::new(config).unwrap();
        let claude = "us.anthropic.claude-sonnet-4-5-20250929-v1:0";
        assert_eq!(
            bedrock.path_of("/v1/messages", claude, false).unwrap(),
            "/model/us.anthropic.claude-sonnet-4-5-20250929-v1%3A0/invoke"
        );
        assert_eq!(
            bedrock.path_of("/v1/messages", claude, true).unwrap(),
            "/model/us.anthropic.claude-sonnet-4-5-20250929-v1%3A0/invoke-with-response-stream"
        );
        let arn = "arn:aws:bedrock:us-east-1:123456789012:inference-profile/us.anthropic.claude-v1:0";
        assert!(bedrock
            .path_of("/v1/messages", arn, false)
            .unwrap()
            .starts_with("/model/arn%3Aaws%3Abedrock%3A"));
        let oss = "openai.gpt-oss-120b-1:0";
        assert_eq!(
            bedrock.path_of("/v1/chat/completions", oss, true).unwrap(),
            "/openai/v1/chat/completions"
        );
        assert_eq!(bedrock.path_of("/v1/messages/count_tokens", claude, false), None);
        assert_eq!(bedrock.path_of("/v1/responses", oss, false), None);
    }

    #[test]
    fn vertex_paths_raw_predict_claude_and_send_other_models_to_the_openai_endpoint() {
        let dir = std::env::temp_dir().join(format!("gateway-upstream-vertex-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let key = dir.join("sa.json");
        let file = serde_json::json!({"type": "service_account", "private_key_id": "k1",
            "private_key": include_str!("../../../../tests/fixtures/vertex-test-only-key.pem"),
            "client_email": "gw@acme-ml.iam.gserviceaccount.com", "token_uri": "https://oauth2.googleapis.com/token"});
        std::fs::write(&key, file.to_string()).unwrap();
        let yaml = format!(
            "{{name: v, kind: vertex, project: acme-ml, region: us-east5, credentials_file: \"{}\"}}",
            key.display()
        );
        let vertex = Upstream::new(serde_yaml::from_str(&yaml).unwrap()).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        let claude = "claude-sonnet-4-5@20250929";
        let location = "/v1/projects/acme-ml/locations/us-east5";
        assert_eq!(
            vertex.path_of("/v1/messages", claude, false).unwrap(),
            format!("{location}/publishers/anthropic/models/claude-sonnet-4-5@20250929:rawPredict")
        );
        assert_eq!(
            vertex.path_of("/v1/messages", claude, true).unwrap(),
            format!("{location}/publishers/anthropic/models/claude-sonnet-4-5@20250929:streamRawPredict")
        );
        assert_eq!(
            vertex
                .path_of("/v1/chat/completions", "google/gemini-2.5-flash", true)
                .unwrap(),
            format!("{location}/endpoints/openapi/chat/completions")
        );
        assert_eq!(vertex.path_of("/v1/messages/count_tokens", claude, false), None);
        assert_eq!(
            vertex.path_of("/v1/embeddings", "google/text-embedding-005", false),
            None
        );
        let keyed = "{name: v, kind: vertex, project: p, region: global, api_key_env: PATH}";
        let error = Upstream::new(serde_yaml::from_str(keyed).unwrap()).unwrap_err();
        assert!(error.contains("not api_key_env"), "{error}");
    }
}
