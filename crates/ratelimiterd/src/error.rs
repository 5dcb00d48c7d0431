//! The one error type of the HTTP API. Every rejection is JSON with a stable `error` code
//! (docs/http-api.md, "Errors"); details of server-side failures go to the log, never
//! into a response body.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use ratelimiter::{LimitKey, LimiterError};
use serde_json::json;

/// The retry hint of a shed request: short, because shedding ends as soon as a
/// request in flight finishes.
pub const OVERLOADED_RETRY_AFTER_MS: u64 = 50;

/// Why a request was not served. The `Display` form is the wire `error` text.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The body is not JSON (400).
    #[error("invalid_json: {0}")]
    InvalidJson(String),
    /// The body is JSON but breaks a rule: wrong types, bad ULID, bad counts,
    /// duplicate keys, an invalid definition (400).
    #[error("invalid_request: {0}")]
    InvalidRequest(String),
    /// The body is larger than `server.body_bytes_max` (413).
    #[error("payload_too_large: the body is larger than {limit_bytes} bytes")]
    PayloadTooLarge {
        /// The configured limit.
        limit_bytes: usize,
    },
    /// A reserve names an undefined key (404, with the reserve answer's fields).
    #[error("unknown_limit_key: {0}")]
    UnknownReserveKey(LimitKey),
    /// Another request names an undefined key (404).
    #[error("unknown_limit_key: {0}")]
    UnknownKey(LimitKey),
    /// The request conflicts with existing state, such as a kind change (409).
    #[error("conflict: {0}")]
    Conflict(String),
    /// The bearer token is missing or wrong; which of the two is not said (401).
    #[error("unauthorized")]
    Unauthorized,
    /// The token is scoped to key prefixes this key is outside of (403).
    #[error("forbidden: this token may not use the key {0}")]
    Forbidden(LimitKey),
    /// The backend did not answer, or its answer is unknown (503). Retrying with
    /// the same lease id is safe.
    #[error("backend_unavailable")]
    Unavailable {
        /// When to retry.
        retry_after_ms: u64,
    },
    /// The caller holds its whole share of the memory backend's lease table, or
    /// the table is full of leases in force (429): nothing was reserved and the
    /// lease id is not burnt, so the same request may be sent again after the hint.
    #[error("too_many_leases: {message}")]
    TooManyLeases {
        /// When to retry.
        retry_after_ms: u64,
        /// Which bound was reached.
        message: String,
    },
    /// A body sent with another content type than JSON (415): a browser's
    /// form or `text/plain` post from another site is refused before it is read.
    #[error("unsupported_media_type: send the body as Content-Type: application/json")]
    UnsupportedMediaType,
    /// A request from a browser page of another origin, or naming a host that
    /// is not this server's (403), on a listener whose endpoints need no token.
    #[error("forbidden: {0}")]
    ForbiddenOrigin(String),
    /// Too many requests in flight: this one was shed before doing anything (503).
    #[error("overloaded")]
    Overloaded,
    /// The backend answered something unexpected (500). The detail is logged.
    #[error("backend_error")]
    Backend(String),
    /// The server failed, for instance to persist the registry (500). The detail is logged.
    #[error("internal_error")]
    Internal(String),
    /// A definition could not be written to the registry file, a full or
    /// read-only disk (500, code `internal_error` as every server failure):
    /// the message says so and that nothing changed, so an operator knows to
    /// free space and retry. The file's path is logged, not sent.
    #[error("internal_error: the registry file could not be written ({reason}); the limit was not changed")]
    NotPersisted {
        /// The operating system's reason, without paths.
        reason: String,
        /// The whole error, for the log.
        detail: String,
    },
    /// The admin API names a tenant or key that does not exist (404).
    #[error("not_found: {0}")]
    UnknownRecord(String),
    /// The gateway's tenants and keys could not be written (500, code
    /// `internal_error`): the message says so and that nothing changed.
    #[error("internal_error: the tenants and keys could not be written ({reason}); nothing changed")]
    NotRecorded {
        /// The operating system's or the cluster's reason, without paths.
        reason: String,
        /// The whole error, for the log.
        detail: String,
    },
    /// No route has this path (404).
    #[error("not_found: no endpoint {0}")]
    RouteNotFound(String),
    /// The path exists but not with this method (405).
    #[error("method_not_allowed: {0}")]
    MethodNotAllowed(String),
}

impl ApiError {
    /// The HTTP status of this error.
    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::InvalidJson(_) | ApiError::InvalidRequest(_) => StatusCode::BAD_REQUEST,
            ApiError::PayloadTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::UnknownReserveKey(_)
            | ApiError::UnknownKey(_)
            | ApiError::RouteNotFound(_)
            | ApiError::UnknownRecord(_) => StatusCode::NOT_FOUND,
            ApiError::Conflict(_) => StatusCode::CONFLICT,
            ApiError::Unauthorized => StatusCode::UNAUTHORIZED,
            ApiError::Forbidden(_) | ApiError::ForbiddenOrigin(_) => StatusCode::FORBIDDEN,
            ApiError::TooManyLeases { .. } => StatusCode::TOO_MANY_REQUESTS,
            ApiError::UnsupportedMediaType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ApiError::Unavailable { .. } | ApiError::Overloaded => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Backend(_)
            | ApiError::Internal(_)
            | ApiError::NotPersisted { .. }
            | ApiError::NotRecorded { .. } => StatusCode::INTERNAL_SERVER_ERROR,
            ApiError::MethodNotAllowed(_) => StatusCode::METHOD_NOT_ALLOWED,
        }
    }

    /// Maps a limiter error of a reserve: an unknown key gets the reserve shape.
    pub fn from_reserve(error: LimiterError) -> Self {
        match error {
            LimiterError::UnknownKey(key) => ApiError::UnknownReserveKey(key),
            other => other.into(),
        }
    }

    fn body(&self) -> serde_json::Value {
        match self {
            ApiError::UnknownReserveKey(_) => json!({
                "allowed": false,
                "retry_after_ms": 0,
                "error": self.to_string(),
            }),
            ApiError::Unavailable { retry_after_ms } => json!({
                "error": self.to_string(),
                "retry_after_ms": retry_after_ms,
            }),
            ApiError::Overloaded => json!({
                "error": self.to_string(),
                "retry_after_ms": OVERLOADED_RETRY_AFTER_MS,
            }),
            ApiError::TooManyLeases { retry_after_ms, .. } => json!({
                "error": self.to_string(),
                "retry_after_ms": retry_after_ms,
            }),
            _ => json!({ "error": self.to_string() }),
        }
    }

    fn retry_after_ms(&self) -> Option<u64> {
        match self {
            ApiError::Unavailable { retry_after_ms } => Some(*retry_after_ms),
            ApiError::Overloaded => Some(OVERLOADED_RETRY_AFTER_MS),
            ApiError::TooManyLeases { retry_after_ms, .. } => Some(*retry_after_ms),
            _ => None,
        }
    }
}

impl From<LimiterError> for ApiError {
    fn from(error: LimiterError) -> Self {
        match error {
            LimiterError::UnknownKey(key) => ApiError::UnknownKey(key),
            LimiterError::InvalidRequest(message) => ApiError::InvalidRequest(message),
            LimiterError::Conflict(message) => ApiError::Conflict(message),
            LimiterError::Unavailable { retry_after_ms } => ApiError::Unavailable { retry_after_ms },
            LimiterError::TooManyLeases {
                retry_after_ms,
                message,
            } => ApiError::TooManyLeases {
                retry_after_ms,
                message,
            },
            LimiterError::Backend(detail) => ApiError::Backend(detail),
        }
    }
}

impl From<ratelimiter::admin::AdminError> for ApiError {
    fn from(error: ratelimiter::admin::AdminError) -> Self {
        match error {
            ratelimiter::admin::AdminError::Limiter(e) => e.into(),
            ratelimiter::admin::AdminError::Persist { reason, detail } => ApiError::NotPersisted { reason, detail },
        }
    }
}

impl From<ratelimiter::directory::DirectoryError> for ApiError {
    fn from(error: ratelimiter::directory::DirectoryError) -> Self {
        use ratelimiter::directory::DirectoryError as E;
        match error {
            E::Invalid { .. } => ApiError::InvalidRequest(error.to_string()),
            E::UnknownTenant(_) | E::UnknownKey(_) => ApiError::UnknownRecord(error.to_string()),
            E::Exists(_) | E::Conflict(_) | E::Full(_) => ApiError::Conflict(error.to_string()),
            E::NotPersisted { reason, detail } => ApiError::NotRecorded { reason, detail },
            E::Unavailable { retry_after_ms } => ApiError::Unavailable { retry_after_ms },
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        match &self {
            ApiError::Backend(detail) => tracing::error!(%detail, "backend error"),
            ApiError::Internal(detail) => tracing::error!(%detail, "internal error"),
            ApiError::NotPersisted { detail, .. } => {
                tracing::error!(%detail, "limit definition refused: the registry file could not be written")
            }
            ApiError::NotRecorded { detail, .. } => {
                tracing::error!(%detail, "a change of the gateway's tenants and keys could not be written")
            }
            ApiError::Unavailable { .. } => tracing::warn!("backend unavailable"),
            _ => tracing::debug!(error = %self, "request rejected"),
        }
        let mut response = (self.status(), Json(self.body())).into_response();
        let headers = response.headers_mut();
        if let Some(ms) = self.retry_after_ms() {
            // Retry-After is in whole seconds: round up so it is never too early.
            headers.insert(header::RETRY_AFTER, HeaderValue::from(ms.div_ceil(1000).max(1)));
        }
        if matches!(self, ApiError::Unauthorized) {
            headers.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn body_of(error: ApiError) -> (StatusCode, serde_json::Value) {
        let response = error.into_response();
        let status = response.status();
        let bytes = axum::body::to_bytes(response.into_body(), 1 << 16).await.unwrap();
        (status, serde_json::from_slice(&bytes).unwrap())
    }

    #[tokio::test]
    async fn server_failures_do_not_leak_details() {
        let (status, body) = body_of(ApiError::Backend("tb code 42 at 10.0.0.1".into())).await;
        assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(body, json!({"error": "backend_error"}));
        let (status, body) = body_of(ApiError::Internal("/secret/path: EIO".into())).await;
        assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(body, json!({"error": "internal_error"}));
        let not_persisted = ApiError::NotPersisted {
            reason: "no storage space".into(),
            detail: "registry /secret/limits.json: No space left on device".into(),
        };
        let (status, body) = body_of(not_persisted).await;
        assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(
            body,
            json!({"error": "internal_error: the registry file could not be written (no storage space); the limit was not changed"})
        );
    }

    #[tokio::test]
    async fn reserve_and_unavailable_shapes_match_the_contract() {
        let key = LimitKey::new("global:x").unwrap();
        let (status, body) = body_of(ApiError::from_reserve(LimiterError::UnknownKey(key))).await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        assert_eq!(
            body,
            json!({"allowed": false, "retry_after_ms": 0, "error": "unknown_limit_key: global:x"})
        );
        let (status, body) = body_of(LimiterError::Unavailable { retry_after_ms: 250 }.into()).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(body, json!({"error": "backend_unavailable", "retry_after_ms": 250}));
    }
}
