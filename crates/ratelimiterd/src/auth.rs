//! Bearer-token authentication (docs/http-api.md, "Authentication"). Tokens are compared
//! through their SHA-256 digests with a constant-time equality, so neither the position
//! of the first wrong byte nor the token's length shows in the response time. A rejection
//! never says whether the header was missing, malformed or wrong.

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};

use crate::client_tokens::{ClientTokenConfig, KeyScope};
use crate::error::ApiError;

type TokenDigest = [u8; 32];

/// The configured tokens, kept only as digests, each client token with its scope.
#[derive(Debug, Clone, Default)]
pub struct Auth {
    admin: Option<TokenDigest>,
    /// `None`: an entry whose token could not be read; it matches nothing (and
    /// still keeps the client endpoints closed).
    clients: Vec<(Option<TokenDigest>, KeyScope)>,
}

impl Auth {
    /// Guards admin endpoints with `admin_token` when set, and reserve/complete with
    /// `client_tokens` when non-empty (the admin token is accepted there too).
    pub fn new(admin_token: Option<&str>, client_tokens: &[String]) -> Self {
        Self {
            admin: admin_token.map(digest),
            clients: client_tokens.iter().map(|t| (Some(digest(t)), KeyScope::All)).collect(),
        }
    }

    /// [`Auth::new`] of the configuration's entries, scoped ones included (read
    /// from the environment, validated at load).
    pub fn from_config(admin_token: Option<&str>, client_tokens: &[ClientTokenConfig]) -> Self {
        let clients = client_tokens
            .iter()
            .map(|entry| match entry.resolve() {
                Ok((token, scope)) => (Some(digest(&token)), scope),
                Err(e) => {
                    tracing::error!(error = %e, "a client token could not be read; it is refused");
                    (None, KeyScope::Prefixes(Vec::new().into()))
                }
            })
            .collect();
        Self {
            admin: admin_token.map(digest),
            clients,
        }
    }

    /// `Ok` when admin endpoints are open or the request carries the admin token.
    pub fn check_admin(&self, headers: &HeaderMap) -> Result<(), ApiError> {
        let Some(admin) = &self.admin else {
            return Ok(());
        };
        let presented = presented_digest(headers);
        if constant_time_eq(&presented, admin) {
            Ok(())
        } else {
            Err(ApiError::Unauthorized)
        }
    }

    /// The keys the request may use: every key when client endpoints are open or
    /// the request carries the admin token or a plain client token; a scoped
    /// token's prefixes; else 401.
    pub fn check_client(&self, headers: &HeaderMap) -> Result<KeyScope, ApiError> {
        if self.clients.is_empty() {
            return Ok(KeyScope::All);
        }
        let presented = presented_digest(headers);
        // Compare with every token, without stopping at a match, so the time does
        // not tell which token matched.
        let mut matched = self
            .admin
            .as_ref()
            .is_some_and(|a| constant_time_eq(&presented, a))
            .then_some(&KeyScope::All);
        for (token, scope) in &self.clients {
            if token.as_ref().is_some_and(|t| constant_time_eq(&presented, t)) && matched.is_none() {
                matched = Some(scope);
            }
        }
        matched.cloned().ok_or(ApiError::Unauthorized)
    }
}

/// The digest of the bearer token, or of a value no configured token can have
/// (tokens are at least 16 bytes), so a missing header costs the same as a wrong one.
fn presented_digest(headers: &HeaderMap) -> TokenDigest {
    let token = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
    digest(token)
}

fn digest(token: &str) -> TokenDigest {
    Sha256::digest(token.as_bytes()).into()
}

/// Equality whose time does not depend on where the digests differ.
fn constant_time_eq(a: &TokenDigest, b: &TokenDigest) -> bool {
    let difference = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(difference) == 0
}

/// Middleware for admin routes.
pub async fn require_admin(State(auth): State<std::sync::Arc<Auth>>, request: Request, next: Next) -> Response {
    match auth.check_admin(request.headers()) {
        Ok(()) => next.run(request).await,
        Err(e) => e.into_response(),
    }
}

/// Middleware for reserve and complete: the token's [`KeyScope`] goes to the
/// handler, which checks the request's keys against it.
pub async fn require_client(State(auth): State<std::sync::Arc<Auth>>, mut request: Request, next: Next) -> Response {
    match auth.check_client(request.headers()) {
        Ok(scope) => {
            request.extensions_mut().insert(scope);
            next.run(request).await
        }
        Err(e) => e.into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    const ADMIN: &str = "admin-token-0123456789";
    const CLIENT: &str = "client-token-0123456789";

    fn headers(value: Option<&str>) -> HeaderMap {
        let mut headers = HeaderMap::new();
        if let Some(v) = value {
            headers.insert(header::AUTHORIZATION, HeaderValue::from_str(v).unwrap());
        }
        headers
    }

    #[test]
    fn open_when_no_token_is_configured() {
        let auth = Auth::new(None, &[]);
        assert!(auth.check_admin(&headers(None)).is_ok());
        assert!(auth.check_client(&headers(Some("Bearer anything"))).is_ok());
    }

    #[test]
    fn tokens_are_checked() {
        let auth = Auth::new(Some(ADMIN), &[CLIENT.to_owned()]);
        assert!(auth.check_admin(&headers(Some(&format!("Bearer {ADMIN}")))).is_ok());
        for bad in [None, Some("Bearer "), Some(ADMIN), Some(&format!("Basic {ADMIN}")[..])] {
            assert!(auth.check_admin(&headers(bad)).is_err(), "{bad:?}");
        }
        assert!(auth.check_admin(&headers(Some(&format!("Bearer {CLIENT}")))).is_err());
        assert!(auth.check_client(&headers(Some(&format!("Bearer {CLIENT}")))).is_ok());
        assert!(auth.check_client(&headers(Some(&format!("Bearer {ADMIN}")))).is_ok());
        assert!(auth
            .check_client(&headers(Some("Bearer client-token-012345678")))
            .is_err());
        assert!(auth.check_client(&headers(None)).is_err());
    }
}
