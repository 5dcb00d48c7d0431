//! Which headers cross the gateway (docs/gateway.md, "Headers"): both ways by
//! allow-list, so that a header nobody thought of stays on its side.
//!
//! Upstream, a client's headers are the provider's API options used with the
//! gateway's own key: `anthropic-version` (the API's wire version, which the SDK
//! must be able to pick) passes, everything else only when the upstream's
//! `forward_headers` lists it. A client that could send `openai-organization` or
//! `openai-project` would choose whose quota and bill the gateway's key is used
//! on; `anthropic-beta` would switch on features the operator has not allowed.
//!
//! Back to the client, only the provider's answer passes: its content headers,
//! its request id, its retry hints and its rate-limit figures for the model
//! (what a gateway 429 tells of the model too). Cookies, the provider's
//! organization and project, hop-by-hop headers and any header the answer's
//! `Connection` names stay here.

use axum::http::{HeaderMap, HeaderName};

/// Client headers always passed upstream: the API version the SDK speaks.
pub const ALWAYS_FORWARDED: [&str; 1] = ["anthropic-version"];

/// The answer's headers the client gets: what the provider's answer is, who to
/// quote when asking the provider about it, and when to retry.
const ANSWER_HEADERS: [&str; 10] = [
    "content-type",
    "content-encoding",
    "cache-control",
    "x-request-id",
    "request-id",
    "openai-processing-ms",
    "openai-version",
    "retry-after",
    "retry-after-ms",
    "x-should-retry",
];

/// Prefixes of the provider's rate-limit headers, passed on: they describe the
/// model's limits at the provider, which every tenant shares.
const ANSWER_HEADER_PREFIXES: [&str; 2] = ["x-ratelimit-", "anthropic-ratelimit-"];

/// The client headers an upstream gets, parsed once at startup from its
/// `forward_headers` (validated by [`crate::config::check_forwardable`]).
#[derive(Debug, Clone)]
pub struct Forwarded {
    names: Vec<HeaderName>,
}

impl Forwarded {
    /// [`ALWAYS_FORWARDED`] and `listed`.
    pub fn new(listed: &[String]) -> Self {
        let names = ALWAYS_FORWARDED
            .iter()
            .map(|n| HeaderName::from_static(n))
            .chain(listed.iter().filter_map(|n| HeaderName::from_bytes(n.as_bytes()).ok()))
            .collect();
        Self { names }
    }

    /// Copies the allowed headers of `client` into `upstream` (every value of each).
    pub fn copy(&self, client: &HeaderMap, upstream: &mut HeaderMap) {
        for name in &self.names {
            for value in client.get_all(name) {
                upstream.append(name.clone(), value.clone());
            }
        }
    }
}

/// The answer's headers the client gets: [`ANSWER_HEADERS`] only, less any the
/// answer's `Connection` header names (hop-by-hop by the sender's word, RFC 9110
/// section 7.6.1). The upstream's map is moved, not copied.
pub fn answer_headers(upstream: HeaderMap) -> HeaderMap {
    let hop_by_hop: Vec<String> = upstream
        .get_all("connection")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|name| name.trim().to_ascii_lowercase())
        .collect();
    let mut kept = HeaderMap::with_capacity(upstream.keys_len());
    let mut current: Option<HeaderName> = None;
    for (name, value) in upstream {
        // `None`: another value of the previous name.
        if let Some(name) = name {
            let text = name.as_str();
            let allowed = ANSWER_HEADERS.contains(&text) || ANSWER_HEADER_PREFIXES.iter().any(|p| text.starts_with(p));
            current = (allowed && !hop_by_hop.iter().any(|h| h == text)).then_some(name);
        }
        if let Some(name) = &current {
            kept.append(name.clone(), value);
        }
    }
    kept
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    #[test]
    fn only_listed_client_headers_go_upstream() {
        let mut client = HeaderMap::new();
        for (name, value) in [
            ("anthropic-version", "2023-06-01"),
            ("anthropic-beta", "computer-use-2024-10-22"),
            ("openai-organization", "org-other"),
            ("openai-project", "proj-other"),
            ("authorization", "Bearer tenant-key"),
            ("x-api-key", "tenant-key"),
            ("cookie", "a=b"),
        ] {
            client.insert(name, HeaderValue::from_static(value));
        }
        let mut upstream = HeaderMap::new();
        Forwarded::new(&[]).copy(&client, &mut upstream);
        assert_eq!(upstream.len(), 1);
        assert_eq!(upstream["anthropic-version"], "2023-06-01");
        let mut upstream = HeaderMap::new();
        Forwarded::new(&["anthropic-beta".to_owned()]).copy(&client, &mut upstream);
        assert_eq!(upstream["anthropic-beta"], "computer-use-2024-10-22");
        assert!(!upstream.contains_key("openai-organization"));
    }

    #[test]
    fn only_the_answer_reaches_the_client() {
        let mut upstream = HeaderMap::new();
        for (name, value) in [
            ("content-type", "application/json"),
            ("x-request-id", "req_1"),
            ("retry-after-ms", "800"),
            ("set-cookie", "__cf_bm=x"),
            ("openai-organization", "org-gateway"),
            ("x-ratelimit-remaining-requests", "3"),
            ("anthropic-ratelimit-input-tokens-remaining", "5"),
            ("keep-alive", "timeout=5"),
            ("transfer-encoding", "chunked"),
            ("connection", "request-id, close"),
            ("request-id", "req_2"),
        ] {
            upstream.append(name, HeaderValue::from_static(value));
        }
        let kept = answer_headers(upstream);
        let mut names: Vec<_> = kept.keys().map(|k| k.as_str()).collect();
        names.sort_unstable();
        assert_eq!(
            names,
            [
                "anthropic-ratelimit-input-tokens-remaining",
                "content-type",
                "retry-after-ms",
                "x-ratelimit-remaining-requests",
                "x-request-id"
            ]
        );
    }
}
