//! The two wire formats as the simulator's answers tell them apart: the error
//! shape each provider documents, and the retry headers of a 429.

use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;

/// The two wire formats, for the error shape and the key header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wire {
    /// `Authorization: Bearer`, `{"error":{"message","type","param","code"}}`.
    Openai,
    /// `x-api-key`, `{"type":"error","error":{"type","message"}}`.
    Anthropic,
}

/// `retry-after` (whole seconds, rounded up) and `retry-after-ms`: both SDKs read both.
pub fn retry_headers(headers: &mut HeaderMap, retry_after_ms: u64) {
    headers.insert("retry-after", HeaderValue::from(retry_after_ms.div_ceil(1000)));
    headers.insert("retry-after-ms", HeaderValue::from(retry_after_ms));
}

/// An error in the provider's shape. OpenAI: <https://platform.openai.com/docs/guides/error-codes>
/// (`{"error": {"message", "type", "param", "code"}}`); Anthropic:
/// <https://docs.anthropic.com/en/api/errors> ("errors are always returned as JSON,
/// with a top-level `error` object that always includes a `type` and `message`").
pub fn error(wire: Wire, status: StatusCode, message: String) -> Response {
    let body = match wire {
        Wire::Openai => {
            let (kind, code) = match status {
                StatusCode::UNAUTHORIZED => ("invalid_request_error", "invalid_api_key"),
                StatusCode::NOT_FOUND => ("invalid_request_error", "model_not_found"),
                StatusCode::TOO_MANY_REQUESTS => ("requests", "rate_limit_exceeded"),
                s if s.is_server_error() => ("server_error", "server_error"),
                _ => ("invalid_request_error", "invalid_request"),
            };
            serde_json::json!({"error": {"message": message, "type": kind, "param": null, "code": code}})
        }
        Wire::Anthropic => {
            let kind = match status.as_u16() {
                401 => "authentication_error",
                403 => "permission_error",
                404 => "not_found_error",
                413 => "request_too_large",
                429 => "rate_limit_error",
                529 => "overloaded_error",
                s if s >= 500 => "api_error",
                _ => "invalid_request_error",
            };
            serde_json::json!({"type": "error", "error": {"type": kind, "message": message}})
        }
    };
    (status, Json(body)).into_response()
}
