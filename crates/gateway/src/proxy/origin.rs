//! Requests from browsers on a gateway without keys (docs/gateway.md, "Requests
//! from browsers"): with `allow_anonymous`, a web page could make its visitor's
//! browser call the gateway, by DNS rebinding or by a cross-origin "simple"
//! request (a form or `text/plain` body, `mode: no-cors`). The limiter's rule for
//! its listener without tokens applies (`ratelimiter::origin`): `Host` must be an
//! IP address, `localhost` or a name of `allowed_hosts`; a request carrying
//! `Origin` must come from the gateway's own origin; a body must be JSON.
//! A gateway with tenants needs none of it: a page cannot send a tenant's key.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap};
use axum::middleware::Next;
use axum::response::Response;
use ratelimiter::origin::is_json_content_type;

use super::gateway::Gateway;
use crate::wire::error::{ErrorKind, Format, GatewayError};

/// Middleware around every route: refuses, in the provider's error shape, a
/// request from another origin (403) or with a body that is not JSON (415) when
/// the gateway serves anonymous callers. Nothing is read or reserved first.
pub async fn require_origin(State(gateway): State<Arc<Gateway>>, request: Request, next: Next) -> Response {
    let Some(policy) = &gateway.origin else {
        return next.run(request).await;
    };
    let headers = request.headers();
    let text = |name: header::HeaderName| headers.get(name).map(|v| v.to_str().unwrap_or("\u{fffd}"));
    let refusal = match policy.check(text(header::HOST), text(header::ORIGIN)) {
        Err(refusal) => Some(GatewayError::new(ErrorKind::PermissionDenied, refusal.to_string())),
        Ok(()) if has_body(headers) && !is_json(headers) => Some(GatewayError::new(
            ErrorKind::UnsupportedMediaType,
            "A request body must be JSON (Content-Type: application/json).",
        )),
        Ok(()) => None,
    };
    match refusal {
        Some(error) => error.into_response(Format::of_headers(headers)),
        None => next.run(request).await,
    }
}

/// True when the request declares a body: a `Content-Length` above 0 or a
/// chunked one. A GET or an empty POST needs no content type.
fn has_body(headers: &HeaderMap) -> bool {
    let declared = (headers.get(header::CONTENT_LENGTH))
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    declared.is_some_and(|length| length > 0) || headers.contains_key(header::TRANSFER_ENCODING)
}

/// True when the `Content-Type` is JSON.
fn is_json(headers: &HeaderMap) -> bool {
    (headers.get(header::CONTENT_TYPE))
        .and_then(|v| v.to_str().ok())
        .is_some_and(is_json_content_type)
}
