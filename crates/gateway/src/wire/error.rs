//! The gateway's one error type, answered in the wire format of the endpoint's
//! provider (docs/gateway.md, "Error shapes"): the SDKs parse these bodies into
//! their own exception classes, so the shape matters as much as the status.

use std::borrow::Cow;

use axum::http::{HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;

/// The provider whose API an endpoint speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// OpenAI's API (and OpenAI-compatible servers).
    OpenAi,
    /// Anthropic's Messages API.
    Anthropic,
}

/// What went wrong, as the client needs to know it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ErrorKind {
    /// Malformed JSON, a missing or wrongly typed field, or a call that can never fit.
    InvalidRequest,
    /// A missing or wrong gateway key.
    Authentication,
    /// A valid key asking for what it may not have (a higher class than its own).
    PermissionDenied,
    /// A model the gateway does not serve on this endpoint.
    ModelNotFound,
    /// A path the gateway does not serve.
    RouteNotFound,
    /// A body over `gateway.body_bytes_max`.
    TooLarge,
    /// A body that did not arrive within `gateway.client_body_timeout_ms`.
    ClientTimeout,
    /// A body of another type than JSON on a listener without keys: what a web
    /// page can send to another origin without asking (docs/gateway.md,
    /// "Requests from browsers").
    UnsupportedMediaType,
    /// A `previous_response_id` the gateway did not hand to this tenant: answered
    /// as OpenAI answers an unknown id.
    PreviousResponseNotFound,
    /// A `conversation` the gateway did not hand to this tenant: answered like
    /// an unknown conversation, whoever's it is.
    ConversationNotFound,
    /// Denied by the gateway's limits after the wait; `budget` when the tenant's
    /// daily budget is spent (retrying the same day cannot help).
    RateLimited {
        /// The tenant's daily budget is what denied.
        budget: bool,
    },
    /// The upstream failed or could not be reached.
    BadGateway,
    /// The upstream did not answer in time.
    Timeout,
    /// The backend failed; details are logged, not answered.
    Internal,
}

/// The most bytes of a client's value (a model name, a response id) the
/// gateway echoes back in an error: far more than any provider's model name or
/// id, so a real one is shown whole, while a 1 MB name costs no 1 MB answer.
pub const ECHO_BYTES_MAX: usize = 256;

/// `value` as an error shows it: whole up to [`ECHO_BYTES_MAX`] bytes; longer,
/// its first bytes (cut on a character boundary), then `…` and its length.
pub fn echoed(value: &str) -> Cow<'_, str> {
    if value.len() <= ECHO_BYTES_MAX {
        return Cow::Borrowed(value);
    }
    let mut end = ECHO_BYTES_MAX;
    while !value.is_char_boundary(end) {
        end -= 1;
    }
    Cow::Owned(format!("{}… ({} bytes)", &value[..end], value.len()))
}

/// An error answer: kind, message and extra headers (retry hints, rate limits).
#[derive(Debug, Clone)]
pub struct GatewayError {
    /// What went wrong.
    pub kind: ErrorKind,
    /// The sentence the client sees.
    pub message: String,
    /// Headers sent with the error (a list: most errors have none, and the
    /// error stays small on the hot path's `Result`s).
    pub headers: Vec<(HeaderName, HeaderValue)>,
}

impl GatewayError {
    /// An error without extra headers.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
            headers: Vec::new(),
        }
    }

    /// A 400.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::InvalidRequest, message)
    }

    /// A 404 `model_not_found`, echoing the name at most [`ECHO_BYTES_MAX`] long.
    pub fn model_not_found(model: &str) -> Self {
        Self::new(
            ErrorKind::ModelNotFound,
            format!(
                "The model `{}` does not exist or is not served on this endpoint by this gateway.",
                echoed(model)
            ),
        )
    }

    /// A 400 `previous_response_not_found`: OpenAI's answer to a stored
    /// response id it does not know; the id echoed at most [`ECHO_BYTES_MAX`] long.
    pub fn previous_response_not_found(id: &str) -> Self {
        Self::new(
            ErrorKind::PreviousResponseNotFound,
            format!("Previous response with id '{}' not found.", echoed(id)),
        )
    }

    /// A 404 for a conversation id this tenant was not handed: the answer of
    /// OpenAI's Conversations API to an id it does not know; the id echoed at
    /// most [`ECHO_BYTES_MAX`] long.
    pub fn conversation_not_found(id: &str) -> Self {
        Self::new(
            ErrorKind::ConversationNotFound,
            format!("Conversation with id '{}' not found.", echoed(id)),
        )
    }

    /// Adds a header; names and values are built by the gateway, so they are valid.
    pub fn with_header(mut self, name: impl AsRef<str>, value: String) -> Self {
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(name.as_ref().as_bytes()),
            HeaderValue::from_str(&value),
        ) {
            self.headers.retain(|(n, _)| *n != name);
            self.headers.push((name, value));
        }
        self
    }

    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        match self.kind {
            ErrorKind::InvalidRequest => StatusCode::BAD_REQUEST,
            ErrorKind::Authentication => StatusCode::UNAUTHORIZED,
            ErrorKind::PermissionDenied => StatusCode::FORBIDDEN,
            ErrorKind::ModelNotFound | ErrorKind::RouteNotFound => StatusCode::NOT_FOUND,
            ErrorKind::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            ErrorKind::ClientTimeout => StatusCode::REQUEST_TIMEOUT,
            ErrorKind::UnsupportedMediaType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ErrorKind::PreviousResponseNotFound => StatusCode::BAD_REQUEST,
            ErrorKind::ConversationNotFound => StatusCode::NOT_FOUND,
            ErrorKind::RateLimited { .. } => StatusCode::TOO_MANY_REQUESTS,
            ErrorKind::BadGateway => StatusCode::BAD_GATEWAY,
            ErrorKind::Timeout => StatusCode::GATEWAY_TIMEOUT,
            ErrorKind::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The body in `format`'s shape.
    pub fn body(&self, format: Format) -> serde_json::Value {
        match format {
            Format::OpenAi => {
                let (kind, code) = match self.kind {
                    ErrorKind::InvalidRequest | ErrorKind::RouteNotFound => ("invalid_request_error", None),
                    ErrorKind::Authentication => ("invalid_request_error", Some("invalid_api_key")),
                    ErrorKind::PermissionDenied => ("invalid_request_error", Some("permission_denied")),
                    ErrorKind::ModelNotFound => ("invalid_request_error", Some("model_not_found")),
                    ErrorKind::TooLarge => ("invalid_request_error", Some("request_too_large")),
                    ErrorKind::ClientTimeout => ("invalid_request_error", Some("request_timeout")),
                    ErrorKind::UnsupportedMediaType => ("invalid_request_error", Some("unsupported_media_type")),
                    ErrorKind::PreviousResponseNotFound => {
                        ("invalid_request_error", Some("previous_response_not_found"))
                    }
                    ErrorKind::ConversationNotFound => ("invalid_request_error", Some("conversation_not_found")),
                    ErrorKind::RateLimited { budget: false } => ("requests", Some("rate_limit_exceeded")),
                    ErrorKind::RateLimited { budget: true } => ("insufficient_quota", Some("insufficient_quota")),
                    ErrorKind::BadGateway | ErrorKind::Timeout | ErrorKind::Internal => ("server_error", None),
                };
                let param = match self.kind {
                    ErrorKind::PreviousResponseNotFound => Some("previous_response_id"),
                    ErrorKind::ConversationNotFound => Some("conversation"),
                    _ => None,
                };
                json!({"error": {"message": self.message, "type": kind, "param": param, "code": code}})
            }
            Format::Anthropic => {
                let kind = match self.kind {
                    ErrorKind::InvalidRequest
                    | ErrorKind::ClientTimeout
                    | ErrorKind::UnsupportedMediaType
                    | ErrorKind::PreviousResponseNotFound => "invalid_request_error",
                    ErrorKind::ConversationNotFound => "not_found_error",
                    ErrorKind::Authentication => "authentication_error",
                    ErrorKind::PermissionDenied => "permission_error",
                    ErrorKind::ModelNotFound | ErrorKind::RouteNotFound => "not_found_error",
                    ErrorKind::TooLarge => "request_too_large",
                    ErrorKind::RateLimited { .. } => "rate_limit_error",
                    ErrorKind::Timeout => "timeout_error",
                    ErrorKind::BadGateway | ErrorKind::Internal => "api_error",
                };
                json!({"type": "error", "error": {"type": kind, "message": self.message}})
            }
        }
    }

    /// The whole answer in `format`'s shape.
    pub fn into_response(self, format: Format) -> Response {
        let mut response = (self.status(), axum::Json(self.body(format))).into_response();
        response.headers_mut().extend(self.headers);
        response
    }
}

/// An error bound to the format it is answered in.
pub struct Shaped(pub Format, pub GatewayError);

impl IntoResponse for Shaped {
    fn into_response(self) -> Response {
        self.1.into_response(self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_model_name_is_echoed_cut() {
        let short = "gpt-4o-mini";
        assert_eq!(echoed(short), short);
        let long = "é".repeat(500_000);
        let echoed = echoed(&long);
        assert!(echoed.len() <= ECHO_BYTES_MAX + 30, "{}", echoed.len());
        assert!(echoed.ends_with("… (1000000 bytes)"), "{echoed}");
        let message = GatewayError::model_not_found(&long).message;
        assert!(message.len() < 2 * ECHO_BYTES_MAX, "{}", message.len());
    }

    #[test]
    fn shapes_follow_each_provider() {
        let error = GatewayError::model_not_found("nope");
        let openai = error.body(Format::OpenAi);
        assert_eq!(openai["error"]["code"], "model_not_found");
        assert_eq!(openai["error"]["type"], "invalid_request_error");
        let anthropic = error.body(Format::Anthropic);
        assert_eq!(anthropic["type"], "error");
        assert_eq!(anthropic["error"]["type"], "not_found_error");
        let budget = GatewayError::new(ErrorKind::RateLimited { budget: true }, "spent");
        assert_eq!(budget.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(budget.body(Format::OpenAi)["error"]["code"], "insufficient_quota");
        assert_eq!(
            GatewayError::new(ErrorKind::Timeout, "slow").body(Format::Anthropic)["error"]["type"],
            "timeout_error"
        );
    }
}
