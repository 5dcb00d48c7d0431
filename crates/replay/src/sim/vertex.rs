//! Google Vertex AI's paths, over the simulator's Anthropic and OpenAI
//! endpoints, with Google's authentication, error shapes and quota buckets.
//!
//! - Claude (<https://docs.anthropic.com/en/api/claude-on-vertex-ai>):
//!   `POST /v1/projects/{project}/locations/{region}/publishers/anthropic/models/{model}:rawPredict`
//!   and `:streamRawPredict`, the Messages body without `model` (it is in the
//!   path) and with `anthropic_version: "vertex-2023-10-16"`; the body's
//!   `stream` decides whether the answer streams, as Anthropic's SSE.
//!   `models/count-tokens:rawPredict` counts a prompt (the body names the model).
//! - Others (Gemini) through the OpenAI-compatible endpoint
//!   (<https://cloud.google.com/vertex-ai/generative-ai/docs/migrate/openai/overview>):
//!   `POST /v1/projects/{project}/locations/{region}/endpoints/openapi/chat/completions`,
//!   the model as `publisher/model` (`google/gemini-2.5-flash`).
//! - Every call carries a bearer token from the token endpoint
//!   ([`crate::sim::vertex_auth`]); without a valid one, Google's 401.
//! - Quotas: Claude's are "per model, per region", requests and input and
//!   output tokens a minute apart
//!   (<https://cloud.google.com/vertex-ai/generative-ai/docs/partner-models/claude>,
//!   <https://cloud.google.com/vertex-ai/generative-ai/docs/quotas>): each
//!   project, region and model is a bucket of its own
//!   ([`ProviderServer::bucket`]) enforcing the simulator's profile (the
//!   `anthropic` profile keeps the three limits). Gemini's dynamic shared
//!   quota is one pool: the simulator's own ledger. A refusal is Google's 429
//!   `RESOURCE_EXHAUSTED`, without rate-limit headers, as Vertex answers
//!   (<https://cloud.google.com/vertex-ai/generative-ai/docs/error-code-429>).

use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::{FromRequestParts, Path, RawPathParams, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;

use crate::sim::errors::{error, Wire};
use crate::sim::server::ProviderServer;
use crate::sim::{anthropic, openai};

/// The `anthropic_version` values accepted in a Claude body: the one Anthropic
/// documents for Vertex AI, which the anthropic SDK's `AnthropicVertex` sends too.
pub const ANTHROPIC_VERSIONS: [&str; 1] = ["vertex-2023-10-16"];
/// The longest region name accepted: Google's are at most 25 characters
/// (`northamerica-northeast1`).
pub const REGION_CHARS_MAX: usize = 40;

/// The path of a Claude call, as the route captures it.
type ClaudePath = Path<(String, String, String)>;

/// `POST /token`: Google's OAuth token endpoint for the service account.
pub async fn token(State(provider): State<Arc<ProviderServer>>, headers: HeaderMap, form: String) -> Response {
    let host = headers.get("host").and_then(|h| h.to_str().ok()).unwrap_or_default();
    provider.vertex_auth().token(host, &form, provider.clock.now_unix_ms())
}

/// `POST .../publishers/anthropic/models/{model}:rawPredict` and `:streamRawPredict`.
pub async fn claude(
    State(provider): State<Arc<ProviderServer>>,
    Path((project, region, model_action)): ClaudePath,
    Authorized(headers): Authorized,
    body: Bytes,
) -> Response {
    let Some((model, action)) = model_action.rsplit_once(':') else {
        return google_error(
            StatusCode::NOT_FOUND,
            format!("The requested URL {model_action} was not found."),
        );
    };
    if !matches!(action, "rawPredict" | "streamRawPredict") {
        return google_error(StatusCode::NOT_FOUND, format!("Method {action} is not found."));
    }
    let body = match claude_body(&body, model) {
        Ok(body) => body,
        Err(response) => return *response,
    };
    if model == "count-tokens" {
        return as_google(anthropic::count_tokens(State(provider), headers, body).await);
    }
    if !provider.control.models().iter().any(|m| m == model) {
        let name = format!("projects/{project}/locations/{region}/publishers/anthropic/models/{model}");
        return google_error(StatusCode::NOT_FOUND, format!("Publisher Model `{name}` not found."));
    }
    let Some(bucket) = provider.bucket(&format!("{project}/{region}/{model}")) else {
        return google_error(StatusCode::BAD_REQUEST, "Too many locations and models.".to_owned());
    };
    as_google(anthropic::messages(State(bucket), headers, body).await)
}

/// `POST .../endpoints/openapi/chat/completions`: OpenAI's chat completions,
/// the model a publisher's (`google/gemini-2.5-flash`).
pub async fn openapi_chat(
    State(provider): State<Arc<ProviderServer>>,
    Authorized(headers): Authorized,
    body: Bytes,
) -> Response {
    let model = serde_json::from_slice::<serde_json::Value>(&body)
        .ok()
        .and_then(|b| b["model"].as_str().map(str::to_owned));
    if model.is_some_and(|m| !m.contains('/')) {
        let message = "Model names take the form publisher/model, such as google/gemini-2.5-flash.";
        return google_error(StatusCode::BAD_REQUEST, message.to_owned());
    }
    as_google(openai::chat_completions(State(provider), headers, body).await)
}

/// A Vertex AI call's headers once the path's region and the bearer token hold
/// ([`authorized`]), checked before the call's body is read; else Google's error.
pub struct Authorized(HeaderMap);

impl FromRequestParts<Arc<ProviderServer>> for Authorized {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, provider: &Arc<ProviderServer>) -> Result<Self, Response> {
        let params = (RawPathParams::from_request_parts(parts, provider).await).map_err(IntoResponse::into_response)?;
        let region = (params.iter())
            .find(|(name, _)| *name == "region")
            .map_or("", |(_, value)| value);
        authorized(provider, region, parts.headers.clone())
            .map(Self)
            .map_err(|response| *response)
    }
}

/// Checks the region's name and the bearer token, and hands the call to the
/// wire format's endpoint with the simulator's key in place of the token.
fn authorized(provider: &ProviderServer, region: &str, mut headers: HeaderMap) -> Result<HeaderMap, Box<Response>> {
    let region_ok = (1..=REGION_CHARS_MAX).contains(&region.len())
        && region
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if !region_ok {
        return Err(Box::new(google_error(
            StatusCode::BAD_REQUEST,
            format!("Invalid location: {region:.40}"),
        )));
    }
    provider
        .vertex_auth()
        .authorize(&headers, provider.clock.now_unix_ms())?;
    headers.remove("authorization");
    if let Some(key) = provider.control.api_key() {
        let key = HeaderValue::from_str(key).expect("the simulator's key is a header value");
        headers.insert("x-api-key", key.clone());
        let bearer = HeaderValue::from_str(&format!("Bearer {}", key.to_str().expect("ascii")));
        headers.insert("authorization", bearer.expect("a header value"));
    }
    Ok(headers)
}

/// The Claude body as the Messages endpoint takes it: checked for a known
/// `anthropic_version` and no `model`, then with the path's model in it.
fn claude_body(body: &[u8], model: &str) -> Result<Bytes, Box<Response>> {
    let bad = |message: String| Box::new(error(Wire::Anthropic, StatusCode::BAD_REQUEST, message));
    let mut object: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(body).map_err(|e| bad(format!("bad request body: {e}")))?;
    let version = object.remove("anthropic_version");
    if !version
        .as_ref()
        .and_then(|v| v.as_str())
        .is_some_and(|v| ANTHROPIC_VERSIONS.contains(&v))
    {
        return Err(bad(format!("anthropic_version: must be one of {ANTHROPIC_VERSIONS:?}")));
    }
    if model != "count-tokens" {
        // The model is the path's; Anthropic documents the body without it.
        if object.contains_key("model") {
            return Err(bad("model: Extra inputs are not permitted".to_owned()));
        }
        object.insert("model".to_owned(), model.into());
    }
    Ok(Bytes::from(serde_json::to_vec(&object).expect("a map serializes")))
}

/// The answer in Vertex AI's words: a 429 becomes `RESOURCE_EXHAUSTED` and a
/// 404 `NOT_FOUND` in Google's error shape, and no answer carries the wire
/// format's rate-limit headers (Vertex AI sends none).
fn as_google(mut response: Response) -> Response {
    let headers = response.headers_mut();
    let limit_headers: Vec<_> = (headers.keys())
        .filter(|name| {
            let name = name.as_str();
            name.starts_with("anthropic-ratelimit-")
                || name.starts_with("x-ratelimit-")
                || name.starts_with("retry-after")
        })
        .cloned()
        .collect();
    for name in limit_headers {
        headers.remove(name);
    }
    match response.status() {
        StatusCode::TOO_MANY_REQUESTS => {
            let message = "Resource exhausted. Please try again later. Please refer to https://cloud.google.com/vertex-ai/generative-ai/docs/error-code-429 for more details.";
            replace_body(response, message)
        }
        StatusCode::NOT_FOUND => replace_body(response, "The requested model was not found."),
        _ => response,
    }
}

fn replace_body(response: Response, message: &str) -> Response {
    let status = response.status();
    let (mut parts, _) = response.into_parts();
    let body = google_body(status, message);
    parts
        .headers
        .insert("content-type", HeaderValue::from_static("application/json"));
    parts.headers.remove("content-length");
    Response::from_parts(parts, Body::from(body.to_string()))
}

/// Google's error: `{"error": {"code", "message", "status"}}`
/// (<https://cloud.google.com/apis/design/errors#http_mapping>).
pub fn google_error(status: StatusCode, message: String) -> Response {
    (status, Json(google_body(status, &message))).into_response()
}

fn google_body(status: StatusCode, message: &str) -> serde_json::Value {
    let name = match status.as_u16() {
        400 => "INVALID_ARGUMENT",
        401 => "UNAUTHENTICATED",
        403 => "PERMISSION_DENIED",
        404 => "NOT_FOUND",
        429 => "RESOURCE_EXHAUSTED",
        503 => "UNAVAILABLE",
        _ => "INTERNAL",
    };
    serde_json::json!({"error": {"code": status.as_u16(), "message": message, "status": name}})
}
