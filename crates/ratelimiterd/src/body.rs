//! The JSON request body extractor. It reads the body itself, so every rejection
//! is one of the API's JSON errors: 415 for a body of another content type than
//! JSON (a web page can send a form or `text/plain` body to any server without
//! asking, never a JSON one: `ratelimiter::origin`), 413 past the size limit,
//! `invalid_json` for bytes that are not JSON, `invalid_request` for JSON that
//! breaks a rule.

use std::time::Duration;

use axum::body::Body;
use axum::extract::{FromRequest, Request};
use axum::http::{header, HeaderMap};
use http_body_util::BodyExt;
use serde::de::{DeserializeOwned, IgnoredAny};

use crate::error::ApiError;
use crate::state::AppState;

/// The most bytes of an oversized body read and thrown away before the 413 is
/// sent. Most HTTP clients (Python's `urllib`, `requests`, `httpx`) send the
/// whole body before they read the answer: closing with their bytes unread
/// makes the kernel reset the connection, and they see "connection reset"
/// instead of the 413. Twice the largest configurable `body_bytes_max`, so any
/// body a client could mistake for acceptable is drained; beyond it the
/// connection is closed as before, so a client cannot keep the server reading
/// forever.
pub const OVERSIZED_BODY_DRAIN_BYTES_MAX: u64 = 2 * crate::config::BODY_BYTES_MAX_LIMIT as u64;
/// The longest an oversized body is drained: 32 MiB take well under a second
/// on any link a rate limiter's clients use; a slower sender is cut off (the
/// connection closed as before) rather than holding a connection slot.
pub const OVERSIZED_BODY_DRAIN_MS_MAX: u64 = 2_000;

/// A request body parsed as `T`, read up to `server.body_bytes_max` bytes.
#[derive(Debug)]
pub struct JsonBody<T>(pub T);

impl<T: DeserializeOwned> FromRequest<AppState> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &AppState) -> Result<Self, Self::Rejection> {
        let limit_bytes = state.body_bytes_max();
        let too_large = ApiError::PayloadTooLarge { limit_bytes };
        let (parts, mut body) = request.into_parts();
        let declared = declared_length(&parts.headers);
        // Refuse a declared oversized body before keeping a byte of it.
        if declared.is_some_and(|length| length > limit_bytes as u64) {
            if drains(&parts.headers, declared) {
                drain(body, 0).await;
            }
            return Err(too_large);
        }
        if has_body(&parts.headers, declared) && !is_json(&parts.headers) {
            if drains(&parts.headers, declared) {
                drain(body, 0).await;
            }
            return Err(ApiError::UnsupportedMediaType);
        }
        let mut bytes = Vec::new();
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| ApiError::InvalidJson(format!("could not read the body: {e}")))?;
            let Ok(data) = frame.into_data() else { continue };
            if bytes.len() + data.len() > limit_bytes {
                if drains(&parts.headers, declared) {
                    drain(body, (bytes.len() + data.len()) as u64).await;
                }
                return Err(too_large);
            }
            bytes.extend_from_slice(&data);
        }
        parse(&bytes).map(JsonBody)
    }
}

/// True when the request has a body: a `Content-Length` above 0, or a
/// chunked one. A GET or an empty POST needs no content type.
fn has_body(headers: &HeaderMap, declared: Option<u64>) -> bool {
    declared.is_some_and(|length| length > 0) || headers.contains_key(header::TRANSFER_ENCODING)
}

/// True when the `Content-Type` is JSON.
fn is_json(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(ratelimiter::origin::is_json_content_type)
}

/// The `Content-Length`, when the request declares a valid one.
fn declared_length(headers: &HeaderMap) -> Option<u64> {
    headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
}

/// True when the rest of an oversized body is worth reading so the client can
/// read its 413: not when the client waits for `100-continue` (it sends
/// nothing unless asked, and reading would ask), nor when the body is declared
/// longer than [`OVERSIZED_BODY_DRAIN_BYTES_MAX`].
fn drains(headers: &HeaderMap, declared: Option<u64>) -> bool {
    let expects_continue = headers
        .get(header::EXPECT)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"));
    !expects_continue && declared.is_none_or(|length| length <= OVERSIZED_BODY_DRAIN_BYTES_MAX)
}

/// Reads and discards the rest of `body`, of which `read_bytes` were read,
/// within [`OVERSIZED_BODY_DRAIN_BYTES_MAX`] and [`OVERSIZED_BODY_DRAIN_MS_MAX`].
/// Past either bound it stops; the connection is then closed unread, as when
/// nothing is drained.
async fn drain(mut body: Body, mut read_bytes: u64) {
    let drained = tokio::time::timeout(Duration::from_millis(OVERSIZED_BODY_DRAIN_MS_MAX), async {
        while let Some(Ok(frame)) = body.frame().await {
            if let Ok(data) = frame.into_data() {
                read_bytes += data.len() as u64;
                if read_bytes > OVERSIZED_BODY_DRAIN_BYTES_MAX {
                    return;
                }
            }
        }
    })
    .await;
    if drained.is_err() {
        tracing::debug!(read_bytes, "oversized body not drained within the time bound");
    }
}

/// Parses JSON bytes, telling bad JSON from JSON that breaks the schema's rules.
pub fn parse<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(bytes).map_err(|e| match e.classify() {
        // A schema error can come before a syntax error later in the text
        // (`[1,2`): only text that is valid JSON as a whole is `invalid_request`.
        serde_json::error::Category::Data => match serde_json::from_slice::<IgnoredAny>(bytes) {
            Ok(_) => ApiError::InvalidRequest(e.to_string()),
            Err(syntax) => ApiError::InvalidJson(syntax.to_string()),
        },
        serde_json::error::Category::Syntax | serde_json::error::Category::Eof | serde_json::error::Category::Io => {
            ApiError::InvalidJson(e.to_string())
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use ratelimiter::ReserveRequest;

    #[test]
    fn oversized_bodies_are_drained_unless_the_client_waits_or_declares_too_much() {
        let mut headers = HeaderMap::new();
        assert!(drains(&headers, None), "chunked: drained up to the bound");
        assert!(drains(&headers, Some(OVERSIZED_BODY_DRAIN_BYTES_MAX)));
        assert!(!drains(&headers, Some(OVERSIZED_BODY_DRAIN_BYTES_MAX + 1)));
        headers.insert(header::EXPECT, "100-Continue".parse().unwrap());
        assert!(
            !drains(&headers, Some(1 << 20)),
            "the client sends nothing unless asked"
        );
    }

    #[test]
    fn bad_json_and_bad_values_get_distinct_codes() {
        let code = |body: &str| parse::<ReserveRequest>(body.as_bytes()).unwrap_err().to_string();
        assert!(code("{").starts_with("invalid_json: "));
        assert!(code("").starts_with("invalid_json: "));
        assert!(code("not json").starts_with("invalid_json: "));
        assert!(code("[1,2").starts_with("invalid_json: "));
        assert!(code(r#"{"lease_id":1,"#).starts_with("invalid_json: "));
        assert!(code(r#"{"lease_id":"nope","requirements":[{"key":"a","amount":1}]}"#).starts_with("invalid_request: "));
        assert!(
            code(r#"{"lease_id":"01ARZ3NDEKTSV4RRFFQ69G5FAV","requirements":[{"key":"a","amount":"1"}]}"#)
                .starts_with("invalid_request: ")
        );
        assert!(code(r#"{"lease_id":"01ARZ3NDEKTSV4RRFFQ69G5FAV","requirements":[]}"#).contains("1..=32"));
    }
}
