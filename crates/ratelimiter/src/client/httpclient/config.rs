//! What an HTTP client is built from: its servers, token, timeout and retries,
//! checked once, and the bounds they are checked against.

/// The largest response read: a list of 100,000 limits is about 30 MiB.
use hyper::Uri;

/// The largest response read: a list of 100,000 limits is about 30 MiB.
pub const RESPONSE_BYTES_MAX: usize = 64 * 1024 * 1024;
/// The most retries that may be configured: each one repeats a request that may
/// already be holding the server up.
pub const RETRIES_MAX_LIMIT: u32 = 10;
/// Idle connections kept per server; more concurrent callers open more connections
/// that close after use.
pub const POOL_IDLE_PER_HOST_MAX: usize = 256;
/// How long an idle kept-alive connection is kept.
pub(super) const POOL_IDLE_TIMEOUT_MS: u64 = 30_000;
/// The first wait before a retry without a server hint; doubled on each retry.
pub(super) const RETRY_BACKOFF_MS_BASE: u64 = 50;
/// The retry hint reported when the server gave none.
pub(super) const RETRY_HINT_MS_DEFAULT: u64 = 100;
/// The most servers one client may list. A call tries them in turn, each try
/// costing up to a request timeout, and at most `RETRIES_MAX_LIMIT + 1` tries are
/// made, so a longer list could not even be walked once; each server also keeps
/// its own pool of idle connections. A larger fleet belongs behind a load balancer.
pub const SERVERS_MAX: usize = 16;

/// Why an [`HttpClient`](super::HttpClient) could not be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("http client: {0}")]
pub struct HttpClientError(pub(super) String);

/// How the client reaches the server or the servers of a fleet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpClientConfig {
    /// `http://host:port` of each `ratelimiterd` to use, in failover order: one for
    /// a single server or a load balancer, several for a fleet without one. From 1
    /// to [`SERVERS_MAX`], each listed once.
    pub base_urls: Vec<String>,
    /// Sent as `Authorization: Bearer <token>` when set (client or admin token).
    pub token: Option<String>,
    /// How long one attempt may take, connecting included.
    pub request_timeout_ms: u64,
    /// How long connecting may take.
    pub connect_timeout_ms: u64,
    /// Retries after a timeout, a connection failure or a 503, across all servers
    /// together; 0..=10.
    pub retries_max: u32,
    /// The longest wait before one retry, whatever the server's hint.
    pub retry_wait_ms_max: u64,
}

impl HttpClientConfig {
    /// Defaults for the one server (or load balancer) at `base_url`: 2 s per
    /// attempt, 1 s to connect, 2 retries waiting at most 1 s each.
    pub fn new(base_url: impl Into<String>) -> Self {
        Self::fleet([base_url])
    }

    /// The same defaults for the servers of a fleet, in failover order: the first
    /// is preferred until it fails to answer.
    pub fn fleet(base_urls: impl IntoIterator<Item = impl Into<String>>) -> Self {
        Self {
            base_urls: base_urls.into_iter().map(Into::into).collect(),
            token: None,
            request_timeout_ms: 2_000,
            connect_timeout_ms: 1_000,
            retries_max: 2,
            retry_wait_ms_max: 1_000,
        }
    }
}

/// Checks and normalises the server list: 1..=[`SERVERS_MAX`] distinct
/// `http://host[:port]` URLs (a path prefix, for a proxy, is kept), without a
/// trailing slash.
pub(super) fn parse_servers(base_urls: &[String]) -> Result<Vec<String>, HttpClientError> {
    let invalid = |m: String| Err(HttpClientError(m));
    if base_urls.is_empty() {
        return invalid("base_urls: at least one server URL is needed".to_owned());
    }
    if base_urls.len() > SERVERS_MAX {
        return invalid(format!(
            "base_urls: {} servers listed, at most {SERVERS_MAX} (put a larger fleet behind a load balancer)",
            base_urls.len()
        ));
    }
    let mut servers: Vec<String> = Vec::with_capacity(base_urls.len());
    for raw in base_urls {
        let base_url = raw.trim().trim_end_matches('/').to_owned();
        if !base_url.starts_with("http://") {
            return invalid(format!(
                "base_url {raw:?} must start with http:// (TLS is not built in)"
            ));
        }
        match base_url.parse::<Uri>() {
            Ok(uri) if uri.host().is_some_and(|h| !h.is_empty()) && uri.query().is_none() => {}
            _ => return invalid(format!("base_url {raw:?} is not an http://host:port URL")),
        }
        if servers.contains(&base_url) {
            return invalid(format!("base_url {raw:?} is listed twice"));
        }
        servers.push(base_url);
    }
    Ok(servers)
}
