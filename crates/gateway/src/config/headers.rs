//! The rule of an upstream's `forward_headers` (docs/gateway.md, "Headers"): what
//! the proxy's header allow-list may never carry upstream.

use axum::http::HeaderName;

/// Headers no `forward_headers` may list: credentials (the gateway's own key is
/// set by the gateway, the client's must never leave it), and what framing and
/// routing the gateway's HTTP client sets itself.
const NEVER_FORWARDED: [&str; 17] = [
    "authorization",
    "proxy-authorization",
    "x-api-key",
    "api-key",
    "x-goog-api-key",
    "cookie",
    "host",
    "content-length",
    "content-type",
    "transfer-encoding",
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "upgrade",
    "expect",
];

/// `Ok` when `name` may be listed in an upstream's `forward_headers`; the error
/// says why not.
pub fn check_forwardable(name: &str) -> Result<(), String> {
    let parsed = HeaderName::from_bytes(name.as_bytes()).map_err(|_| format!("{name:?} is not a header name"))?;
    if parsed.as_str() != name {
        return Err(format!("{name:?}: write header names in lower case"));
    }
    if NEVER_FORWARDED.contains(&name) {
        return Err(format!(
            "{name:?} is set by the gateway itself (credentials or framing) and cannot be forwarded"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_and_framing_cannot_be_listed() {
        check_forwardable("openai-organization").unwrap();
        for bad in [
            "authorization",
            "x-api-key",
            "host",
            "content-length",
            "Anthropic-Beta",
            "bad header",
        ] {
            assert!(check_forwardable(bad).is_err(), "{bad}");
        }
    }
}
