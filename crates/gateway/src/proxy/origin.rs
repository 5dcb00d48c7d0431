//! Requests from browsers on a gateway without keys (docs/gateway.md, "Requests
//! from browsers"): with `allow_anonymous`, a web page could make its visitor's
//! browser call the gateway, by DNS rebinding or by a cross-origin "simple"
//! request (a form or `text/plain` body, `mode: no-cors`). The limiter's rule for
//! its listener without tokens applies (`ratelimiter::origin`): `Host` must be an
//! IP address, `localhost` or a name of `allowed_hosts`; a request carrying
//! `Origin` must come from the gateway's own origin; a body must be JSON.
//! A gateway with tenants needs none of it: a page cannot send a tenant's key.

use std::future::{ready, Ready};
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::extract::Request;
use axum::http::{header, HeaderMap};
use axum::response::Response;
use futures_util::future::Either;
use ratelimiter::origin::is_json_content_type;

use super::gateway::Gateway;
use crate::wire::error::{ErrorKind, Format, GatewayError};

/// The layer around every route: refuses, in the provider's error shape, a
/// request from another origin (403) or with a body that is not JSON (415) when
/// the gateway serves anonymous callers. Nothing is read or reserved first.
/// A tower layer, not `axum::middleware::from_fn`: the check reads headers
/// only, so the route's own future is returned as it is, without the boxed
/// future and the clone of the routes that a `from_fn` middleware costs each call.
#[derive(Clone)]
pub struct RequireOrigin(pub Arc<Gateway>);

impl<S> tower::Layer<S> for RequireOrigin {
    type Service = OriginChecked<S>;

    fn layer(&self, inner: S) -> Self::Service {
        OriginChecked {
            inner,
            gateway: self.0.clone(),
        }
    }
}

/// A route behind [`RequireOrigin`].
#[derive(Clone)]
pub struct OriginChecked<S> {
    inner: S,
    gateway: Arc<Gateway>,
}

impl<S> tower::Service<Request> for OriginChecked<S>
where
    S: tower::Service<Request, Response = Response>,
{
    type Response = Response;
    type Error = S::Error;
    type Future = Either<Ready<Result<Response, S::Error>>, S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request) -> Self::Future {
        match refusal(&self.gateway, request.headers()) {
            Some(refused) => Either::Left(ready(Ok(refused))),
            None => Either::Right(self.inner.call(request)),
        }
    }
}

/// The answer refusing a request with `headers`, if the gateway's origin
/// policy refuses it; `None` when it may go on.
fn refusal(gateway: &Gateway, headers: &HeaderMap) -> Option<Response> {
    let policy = gateway.origin.as_ref()?;
    let text = |name: header::HeaderName| headers.get(name).map(|v| v.to_str().unwrap_or("\u{fffd}"));
    let refusal = match policy.check(text(header::HOST), text(header::ORIGIN)) {
        Err(refusal) => GatewayError::new(ErrorKind::PermissionDenied, refusal.to_string()),
        Ok(()) if has_body(headers) && !is_json(headers) => GatewayError::new(
            ErrorKind::UnsupportedMediaType,
            "A request body must be JSON (Content-Type: application/json).",
        ),
        Ok(()) => return None,
    };
    Some(refusal.into_response(Format::of_headers(headers)))
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
