//! The JSON request body extractor. It reads the body itself, whatever the
//! `Content-Type`, so every rejection is one of the API's JSON errors: 413 past
//! the size limit, `invalid_json` for bytes that are not JSON, `invalid_request`
//! for JSON that breaks a rule.

use axum::extract::{FromRequest, Request};
use axum::http::header;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use serde::de::{DeserializeOwned, IgnoredAny};

use crate::error::ApiError;
use crate::state::AppState;

/// A request body parsed as `T`, read up to `server.body_bytes_max` bytes.
#[derive(Debug)]
pub struct JsonBody<T>(pub T);

impl<T: DeserializeOwned> FromRequest<AppState> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &AppState) -> Result<Self, Self::Rejection> {
        let limit_bytes = state.body_bytes_max();
        let declared = request
            .headers()
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        // Refuse a declared oversized body before reading a byte of it.
        if declared.is_some_and(|length| length > limit_bytes as u64) {
            return Err(ApiError::PayloadTooLarge { limit_bytes });
        }
        let bytes = match Limited::new(request.into_body(), limit_bytes).collect().await {
            Ok(collected) => collected.to_bytes(),
            Err(e) if e.downcast_ref::<LengthLimitError>().is_some() => {
                return Err(ApiError::PayloadTooLarge { limit_bytes })
            }
            Err(e) => return Err(ApiError::InvalidJson(format!("could not read the body: {e}"))),
        };
        parse(&bytes).map(JsonBody)
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
