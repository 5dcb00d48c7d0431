//! Bearer-token authentication (docs/http-api.md, "Authentication"). Tokens are compared
//! through their SHA-256 digests with a constant-time equality, so neither the position
//! of the first wrong byte nor the token's length shows in the response time. A rejection
//! never says whether the header was missing, malformed or wrong.

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};

use ratelimiter::origin::OriginPolicy;
use ratelimiter::LeaseOwner;

use crate::client_tokens::{ClientTokenConfig, KeyScope};
use crate::error::ApiError;

type TokenDigest = [u8; 32];

/// The lease owner of requests made with the admin token.
const ADMIN_OWNER: &str = "admin_token";

/// Who made a reserve or complete: the keys it may use and whose leases it
/// makes (docs/http-api.md, "Scoped client tokens").
#[derive(Debug, Clone)]
pub struct Caller {
    /// The keys the token may use.
    pub scope: KeyScope,
    /// The owner of the leases it reserves: its token's entry, so the memory
    /// backend bounds each token's share of the lease table; a scoped token's
    /// owner keeps its lease ids in a namespace of its own. `None` when the
    /// client endpoints are open (no token tells callers apart).
    pub owner: Option<LeaseOwner>,
}

/// One `client_tokens` entry, resolved.
#[derive(Debug, Clone)]
struct ClientToken {
    /// `None`: an entry whose token could not be read; it matches nothing (and
    /// still keeps the client endpoints closed).
    digest: Option<TokenDigest>,
    caller: Caller,
}

/// The configured tokens, kept only as digests, each client token with its scope.
#[derive(Debug, Clone, Default)]
pub struct Auth {
    /// Which hosts and origins the listener answers (checked before the tokens).
    origin: OriginPolicy,
    admin: Option<TokenDigest>,
    /// Who a client request with the admin token is (built once).
    admin_caller: Option<Caller>,
    clients: Vec<ClientToken>,
}

impl Auth {
    /// Guards admin endpoints with `admin_token` when set, and reserve/complete with
    /// `client_tokens` when non-empty (the admin token is accepted there too).
    pub fn new(admin_token: Option<&str>, client_tokens: &[String]) -> Self {
        let entries: Vec<ClientTokenConfig> = client_tokens.iter().cloned().map(ClientTokenConfig::from).collect();
        Self::from_config(admin_token, &entries)
    }

    /// [`Auth::new`] of the configuration's entries, scoped ones included (read
    /// from the environment, validated at load).
    pub fn from_config(admin_token: Option<&str>, client_tokens: &[ClientTokenConfig]) -> Self {
        let clients: Vec<ClientToken> = client_tokens
            .iter()
            .enumerate()
            .map(|(i, entry)| {
                let owner = LeaseOwner::new(format!("client_tokens[{i}]"));
                match entry.resolve() {
                    Ok((token, scope)) => {
                        let digest = digest(&token);
                        // A scoped token's lease ids live in a namespace only
                        // its holder can aim at: another scope that learns one
                        // can neither complete it nor tell whether it is live.
                        let owner = match scope {
                            KeyScope::All => owner,
                            KeyScope::Prefixes(_) => owner.with_lease_namespace(&digest),
                        };
                        let caller = Caller {
                            scope,
                            owner: Some(owner),
                        };
                        ClientToken {
                            digest: Some(digest),
                            caller,
                        }
                    }
                    Err(e) => {
                        tracing::error!(error = %e, "a client token could not be read; it is refused");
                        let caller = Caller {
                            scope: KeyScope::Prefixes(Vec::new().into()),
                            owner: Some(owner),
                        };
                        ClientToken { digest: None, caller }
                    }
                }
            })
            .collect();
        let admin_caller = admin_token.map(|_| Caller {
            scope: KeyScope::All,
            owner: Some(LeaseOwner::new(ADMIN_OWNER)),
        });
        for (i, client) in clients.iter().enumerate() {
            for prefix in client.caller.scope.unterminated_prefixes() {
                tracing::warn!(entry = %format!("server.client_tokens[{i}]"), %prefix,
                    "a key prefix does not end with ':' or '/': it also covers keys that only start alike \
                     (\"svc:a\" covers \"svc:ab:rpm\"); end it with its separator");
            }
        }
        let mut auth = Self {
            origin: OriginPolicy::default(),
            admin: admin_token.map(digest),
            admin_caller,
            clients,
        };
        auth.origin = OriginPolicy::new(&[], !auth.every_endpoint_needs_a_token());
        auth
    }

    /// The same tokens, with `allowed_hosts` (validated at load) answered
    /// besides IP addresses and `localhost` while an endpoint needs no token.
    pub fn with_allowed_hosts(mut self, allowed_hosts: &[String]) -> Self {
        self.origin = OriginPolicy::new(allowed_hosts, !self.every_endpoint_needs_a_token());
        self
    }

    /// Refuses a request from a browser page of another origin, or naming a
    /// host that is not this server's while an endpoint needs no token
    /// (docs/http-api.md, "Requests from browsers").
    pub fn check_origin(&self, headers: &HeaderMap) -> Result<(), ApiError> {
        let text = |name: header::HeaderName| headers.get(name).map(|v| v.to_str().unwrap_or("\u{fffd}"));
        self.origin
            .check(text(header::HOST), text(header::ORIGIN))
            .map_err(|refusal| ApiError::ForbiddenOrigin(refusal.to_string()))
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

    /// True when every endpoint needs a token: an admin token and client
    /// tokens are configured. Otherwise a browser page could reach an open
    /// endpoint, so the listener checks where requests come from
    /// ([`ratelimiter::origin`]).
    pub fn every_endpoint_needs_a_token(&self) -> bool {
        self.admin.is_some() && !self.clients.is_empty()
    }

    /// Who the request is: every key and no owner when client endpoints are
    /// open; every key when it carries the admin token or a plain client
    /// token; a scoped token's prefixes; else 401.
    pub fn check_client(&self, headers: &HeaderMap) -> Result<Caller, ApiError> {
        if self.clients.is_empty() {
            return Ok(Caller {
                scope: KeyScope::All,
                owner: None,
            });
        }
        let presented = presented_digest(headers);
        // Compare with every token, without stopping at a match, so the time does
        // not tell which token matched.
        let mut matched = self
            .admin
            .as_ref()
            .is_some_and(|a| constant_time_eq(&presented, a))
            .then(|| self.admin_caller.clone())
            .flatten();
        for token in &self.clients {
            if token.digest.as_ref().is_some_and(|t| constant_time_eq(&presented, t)) && matched.is_none() {
                matched = Some(token.caller.clone());
            }
        }
        matched.ok_or(ApiError::Unauthorized)
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

/// Paths answered whatever the `Host`: a balancer's health check names the
/// server as it knows it, and the answer carries nothing.
const HOST_EXEMPT_PATHS: [&str; 1] = ["/healthz"];

/// Middleware around every route: [`Auth::check_origin`].
pub async fn require_origin(State(auth): State<std::sync::Arc<Auth>>, request: Request, next: Next) -> Response {
    let exempt = HOST_EXEMPT_PATHS.contains(&request.uri().path()) && !request.headers().contains_key(header::ORIGIN);
    if exempt {
        return next.run(request).await;
    }
    match auth.check_origin(request.headers()) {
        Ok(()) => next.run(request).await,
        Err(e) => e.into_response(),
    }
}

/// Middleware for admin routes.
pub async fn require_admin(State(auth): State<std::sync::Arc<Auth>>, request: Request, next: Next) -> Response {
    match auth.check_admin(request.headers()) {
        Ok(()) => next.run(request).await,
        Err(e) => e.into_response(),
    }
}

/// Middleware for reserve and complete: the [`Caller`] goes to the handler,
/// which checks the request's keys against its scope.
pub async fn require_client(State(auth): State<std::sync::Arc<Auth>>, mut request: Request, next: Next) -> Response {
    match auth.check_client(request.headers()) {
        Ok(caller) => {
            request.extensions_mut().insert(caller);
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
