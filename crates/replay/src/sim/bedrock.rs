//! Amazon Bedrock's runtime in the simulator: Claude's `InvokeModel`
//! (`POST /model/{modelId}/invoke`) and `InvokeModelWithResponseStream`
//! (`/invoke-with-response-stream`), and Bedrock's OpenAI-compatible chat
//! completions (`POST /openai/v1/chat/completions`), each served by the
//! Anthropic or OpenAI endpoint of the same ledger (so the enforced profile,
//! `bedrock` with its 5x output burn-down, applies) and answered as Bedrock
//! answers.
//!
//! Sources: <https://docs.aws.amazon.com/bedrock/latest/APIReference/API_runtime_InvokeModel.html>
//! (the model id in the path; the `x-amzn-bedrock-input-token-count` and
//! `-output-token-count` headers), <https://docs.aws.amazon.com/bedrock/latest/userguide/model-parameters-anthropic-claude-messages-request-response.html>
//! (the Messages body with `anthropic_version` and `anthropic_beta`, without
//! `model` and `stream`), <https://docs.aws.amazon.com/bedrock/latest/APIReference/CommonErrors.html>
//! (errors as `{"message": ...}` with their type in `x-amzn-ErrorType`; 403
//! `InvalidSignatureException` for a bad signature, 429
//! `ThrottlingException`) and <https://docs.aws.amazon.com/bedrock/latest/userguide/api-keys.html>
//! (a Bedrock API key as `Authorization: Bearer`).
//!
//! Every request is authenticated: a SigV4 signature checked against the
//! configured AWS keys ([`crate::sim::sigv4`]), or the simulator's key as a
//! Bedrock API key. A request that passes reaches the Anthropic or OpenAI
//! endpoint with the simulator's own key.

use std::sync::Arc;
use std::time::SystemTime;

use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{Map, Value};

use crate::sim::event_stream::{reframe, CONTENT_TYPE};
use crate::sim::server::ProviderServer;
use crate::sim::sigv4::{access_key_id, verify, AwsKeys, Refused};
use crate::sim::sts::Issued;
use crate::sim::{anthropic, openai};

/// The SigV4 service name Bedrock's runtime checks.
pub const SIGNING_SERVICE: &str = "bedrock";
/// The namespace Bedrock appends to an `x-amzn-ErrorType`.
pub const ERROR_NAMESPACE: &str = "http://internal.amazon.com/coral/com.amazon.bedrock/";
/// The largest answer re-read to add Bedrock's token-count headers.
pub const ANSWER_BYTES_MAX: usize = 16 * 1024 * 1024;

/// A request as received, for its signature.
type Received = (Method, Uri, HeaderMap, Bytes);

/// `POST /model/{modelId}/invoke` (`STREAM` false) and
/// `POST /model/{modelId}/invoke-with-response-stream` (`STREAM` true).
pub async fn invoke<const STREAM: bool>(
    State(provider): State<Arc<ProviderServer>>,
    Path(model): Path<String>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    messages(provider, model, (method, uri, headers, body), STREAM).await
}

/// `POST /openai/v1/chat/completions`: Bedrock's OpenAI-compatible chat.
pub async fn chat_completions(
    State(provider): State<Arc<ProviderServer>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let headers = match authenticate(&provider, (method, uri, headers, body.clone())) {
        Ok(headers) => headers,
        Err(refusal) => return error(StatusCode::FORBIDDEN, refusal.error_type, &refusal.message),
    };
    openai::chat_completions(State(provider), headers, body).await
}

/// Claude's Messages on Bedrock: the body checked and given `model` and
/// `stream` from the path, served by the Anthropic endpoint, answered as
/// Bedrock answers.
async fn messages(provider: Arc<ProviderServer>, model: String, request: Received, stream: bool) -> Response {
    let body = request.3.clone();
    let headers = match authenticate(&provider, request) {
        Ok(headers) => headers,
        Err(refusal) => return error(StatusCode::FORBIDDEN, refusal.error_type, &refusal.message),
    };
    let mut object = match serde_json::from_slice::<Map<String, Value>>(&body) {
        Ok(object) => object,
        Err(_) => {
            return error(
                StatusCode::BAD_REQUEST,
                "ValidationException",
                "Malformed input request: the body is not a JSON object.",
            )
        }
    };
    // Any dated version is accepted (the SDKs send their own); none is refused.
    if !object.remove("anthropic_version").is_some_and(|v| v.is_string()) {
        return error(StatusCode::BAD_REQUEST, "ValidationException", "Malformed input request: #: required key [anthropic_version] not found, please reformat your input and try again.");
    }
    if let Some(betas) = object.remove("anthropic_beta") {
        if !betas.as_array().is_some_and(|b| b.iter().all(Value::is_string)) {
            return error(
                StatusCode::BAD_REQUEST,
                "ValidationException",
                "Malformed input request: #/anthropic_beta: expected type: JSONArray of strings.",
            );
        }
    }
    for field in ["model", "stream"] {
        if object.contains_key(field) {
            let message = format!("Malformed input request: #: extraneous key [{field}] is not permitted, please reformat your input and try again.");
            return error(StatusCode::BAD_REQUEST, "ValidationException", &message);
        }
    }
    object.insert("model".to_owned(), Value::String(model));
    object.insert("stream".to_owned(), Value::Bool(stream));
    let body = Bytes::from(serde_json::to_vec(&object).expect("a map serializes"));
    let answer = anthropic::messages(State(provider), headers, body).await;
    as_bedrock(answer, stream).await
}

/// The headers the Anthropic or OpenAI endpoint is called with once the
/// request is authenticated: the simulator's own key in both formats.
fn authenticate(provider: &ProviderServer, (method, uri, headers, body): Received) -> Result<HeaderMap, Refused> {
    let authorization = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let key = provider.control.api_key();
    if let Some(sent) = authorization.strip_prefix("Bearer ") {
        // A Bedrock API key.
        if key.is_some_and(|key| key != sent) {
            return Err(Refused {
                error_type: "UnrecognizedClientException",
                message: "The security token included in the request is invalid.".to_owned(),
            });
        }
    } else if let Some(keys) = keys_of(provider, &headers)? {
        verify(
            &keys,
            SIGNING_SERVICE,
            (&method, &uri, &headers, &body),
            SystemTime::now(),
        )?;
    } else if key.is_some() {
        return Err(Refused {
            error_type: "MissingAuthenticationTokenException",
            message: "Missing Authentication Token".to_owned(),
        });
    }
    let mut inner = HeaderMap::new();
    if let Some(key) = key.and_then(|k| HeaderValue::from_str(k).ok()) {
        inner.insert("x-api-key", key.clone());
        let bearer = HeaderValue::from_str(&format!("Bearer {}", key.to_str().unwrap_or_default()));
        inner.insert("authorization", bearer.expect("a key is a header value"));
    }
    Ok(inner)
}

/// The keys a SigV4 request is checked with: those STS issued it, while
/// valid, else the configured ones; `None` when no AWS keys are configured
/// (signatures are not checked).
fn keys_of(provider: &ProviderServer, headers: &HeaderMap) -> Result<Option<AwsKeys>, Refused> {
    let configured = provider.control.aws_keys();
    let Some(sts) = provider.control.sts() else {
        return Ok(configured.cloned());
    };
    let id = access_key_id(headers).unwrap_or_default();
    match (sts.lookup(id, SystemTime::now()), configured) {
        (Issued::Valid(keys), _) => Ok(Some(keys)),
        (Issued::Expired, _) => Err(Refused {
            error_type: "ExpiredTokenException",
            message: "The security token included in the request is expired".to_owned(),
        }),
        (Issued::Unknown, Some(keys)) => Ok(Some(keys.clone())),
        (Issued::Unknown, None) => Err(Refused {
            error_type: "UnrecognizedClientException",
            message: "The security token included in the request is invalid.".to_owned(),
        }),
    }
}

/// An Anthropic endpoint's answer as Bedrock gives it: no rate-limit headers
/// (Bedrock sends none), errors in Bedrock's shape, a whole answer with its
/// token-count headers, a stream in event-stream frames.
async fn as_bedrock(answer: Response, stream: bool) -> Response {
    let (mut parts, body) = answer.into_parts();
    let names: Vec<_> = (parts.headers.keys())
        .filter(|n| n.as_str().starts_with("anthropic-ratelimit") || n.as_str().starts_with("retry-after"))
        .cloned()
        .collect();
    for name in names {
        parts.headers.remove(name);
    }
    if !parts.status.is_success() {
        if parts.headers.contains_key("x-amzn-errortype") {
            // The `bedrock` profile's own 429, already in Bedrock's shape.
            return Response::from_parts(parts, body);
        }
        let bytes = axum::body::to_bytes(body, ANSWER_BYTES_MAX).await.unwrap_or_default();
        let message = serde_json::from_slice::<Value>(&bytes)
            .ok()
            .and_then(|v| v["error"]["message"].as_str().map(str::to_owned))
            .unwrap_or_else(|| "The request failed.".to_owned());
        return error(parts.status, error_type_of(parts.status), &message);
    }
    if stream {
        parts
            .headers
            .insert("content-type", HeaderValue::from_static(CONTENT_TYPE));
        parts.headers.insert(
            "x-amzn-bedrock-content-type",
            HeaderValue::from_static("application/json"),
        );
        return Response::from_parts(parts, reframe(body));
    }
    let bytes = axum::body::to_bytes(body, ANSWER_BYTES_MAX).await.unwrap_or_default();
    if let Ok(answer) = serde_json::from_slice::<Value>(&bytes) {
        let usage = &answer["usage"];
        let count = |name: &str| usage.get(name).and_then(Value::as_u64).unwrap_or(0);
        let input = count("input_tokens");
        for (name, value) in [
            ("x-amzn-bedrock-input-token-count", input),
            ("x-amzn-bedrock-output-token-count", count("output_tokens")),
            (
                "x-amzn-bedrock-cache-read-input-token-count",
                count("cache_read_input_tokens"),
            ),
            (
                "x-amzn-bedrock-cache-write-input-token-count",
                count("cache_creation_input_tokens"),
            ),
        ] {
            parts.headers.insert(name, HeaderValue::from(value));
        }
    }
    parts.headers.remove("content-length");
    Response::from_parts(parts, Body::from(bytes))
}

/// Bedrock's exception of an HTTP status.
fn error_type_of(status: StatusCode) -> &'static str {
    match status.as_u16() {
        400 | 413 => "ValidationException",
        401 | 403 => "AccessDeniedException",
        404 => "ResourceNotFoundException",
        408 => "ModelTimeoutException",
        424 => "ModelErrorException",
        429 => "ThrottlingException",
        503 | 529 => "ServiceUnavailableException",
        _ => "InternalServerException",
    }
}

/// An error as Bedrock answers it: `{"message": ...}`, the type in `x-amzn-ErrorType`.
pub fn error(status: StatusCode, error_type: &str, message: &str) -> Response {
    let mut response = (status, Json(serde_json::json!({ "message": message }))).into_response();
    let value = HeaderValue::from_str(&format!("{error_type}:{ERROR_NAMESPACE}")).expect("ascii");
    response.headers_mut().insert("x-amzn-errortype", value);
    response
}
