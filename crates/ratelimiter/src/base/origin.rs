//! Which requests a listener answers, so that a web page cannot use a server
//! that needs no token (docs/http-api.md, "Requests from browsers"). A page's
//! script can make the browser send requests to a server on loopback or on the
//! local network: by DNS rebinding (its own host name, made to resolve to the
//! server, so the browser calls it same-origin), or by a cross-origin "simple"
//! request that needs no preflight (a form or `text/plain` body, `mode:
//! no-cors`). Three rules close both, as browsers' rules for local servers and
//! development servers do:
//!
//! - `Host` must be an IP address, `localhost` (or a name under it), or a name
//!   the operator configured: a rebinding page's requests name its own host;
//! - a request carrying `Origin` must come from the server's own origin (the
//!   scheme and the `Host` it was sent to): browsers set `Origin` on every
//!   cross-origin request and on same-origin ones that change something;
//! - a body must be `Content-Type: application/json`
//!   ([`is_json_content_type`]): a page can send that type to another origin
//!   only after a preflight, which the server never answers.
//!
//! The checks take header values as text, so any HTTP stack can call them.

use std::net::IpAddr;

/// The most names `allowed_hosts` may hold: each is compared per request.
pub const ALLOWED_HOSTS_MAX: usize = 32;
/// The longest DNS name.
const HOST_NAME_BYTES_MAX: usize = 253;

/// Why a request was refused. The `Display` form is meant for the caller.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OriginRefusal {
    /// `Host` names neither an IP address, `localhost` nor a configured name.
    #[error("the host {0:?} is not one this server answers to without a token (an IP address, localhost, or a name of allowed_hosts)")]
    ForeignHost(String),
    /// `Origin` is another site's (or `null`, a sandboxed page's).
    #[error("requests from the web page origin {0:?} are refused: only this server's own pages may call it")]
    ForeignOrigin(String),
}

/// The hosts a listener answers to, and whether it checks `Host` at all.
#[derive(Debug, Clone, Default)]
pub struct OriginPolicy {
    /// Lower-case names, without a trailing dot.
    allowed_hosts: Vec<String>,
    /// False when every endpoint needs a token: a page cannot send one, so
    /// the name it used does not matter.
    check_host: bool,
}

impl OriginPolicy {
    /// A policy answering to IP addresses, `localhost` and `allowed_hosts`
    /// (checked with [`check_allowed_hosts`]) when `check_host`; to any host
    /// otherwise. `Origin` is checked either way.
    pub fn new(allowed_hosts: &[String], check_host: bool) -> Self {
        Self {
            allowed_hosts: allowed_hosts.iter().map(|h| normalized(h)).collect(),
            check_host,
        }
    }

    /// Checks a request's `Host` and `Origin` header values (`None`: absent).
    /// A request without `Host` comes from no browser, which always sends it.
    pub fn check(&self, host: Option<&str>, origin: Option<&str>) -> Result<(), OriginRefusal> {
        if self.check_host {
            if let Some(host) = host {
                if !self.answers_to(host) {
                    return Err(OriginRefusal::ForeignHost(clip(host)));
                }
            }
        }
        let Some(origin) = origin else {
            return Ok(());
        };
        let same = host.is_some_and(|host| {
            let origin = origin.to_ascii_lowercase();
            let host = host.to_ascii_lowercase();
            ["http://", "https://"]
                .iter()
                .any(|scheme| origin.strip_prefix(scheme) == Some(host.as_str()))
        });
        if same {
            Ok(())
        } else {
            Err(OriginRefusal::ForeignOrigin(clip(origin)))
        }
    }

    /// True when `host` (a `Host` value, port included or not) is an IP
    /// address, `localhost`, a name under `.localhost`, or a configured name.
    fn answers_to(&self, host: &str) -> bool {
        let Some(name) = host_name(host) else {
            return false;
        };
        if name.starts_with('[') {
            return name
                .strip_prefix('[')
                .and_then(|n| n.strip_suffix(']'))
                .is_some_and(|ip| ip.parse::<std::net::Ipv6Addr>().is_ok());
        }
        if name.parse::<IpAddr>().is_ok() {
            return true;
        }
        let name = normalized(name);
        name == "localhost" || name.ends_with(".localhost") || self.allowed_hosts.contains(&name)
    }
}

/// The name part of a `Host` value: without its `:port`; `None` when the
/// port is not a number.
fn host_name(host: &str) -> Option<&str> {
    let (name, port) = match host.rfind(':') {
        // An IPv6 literal keeps its colons inside brackets.
        Some(i) if !host[i..].contains(']') => (&host[..i], Some(&host[i + 1..])),
        _ => (host, None),
    };
    if port.is_some_and(|p| p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit())) {
        return None;
    }
    Some(name)
}

/// `name` in lower case without a trailing dot.
fn normalized(name: &str) -> String {
    name.trim_end_matches('.').to_ascii_lowercase()
}

/// The first characters of a refused value, so a huge header makes no huge error.
fn clip(value: &str) -> String {
    const CLIP_CHARS_MAX: usize = 100;
    value.chars().take(CLIP_CHARS_MAX).collect()
}

/// Checks the names of an `allowed_hosts` setting: at most
/// [`ALLOWED_HOSTS_MAX`] DNS names (letters, digits, `-` and `.`), no port.
pub fn check_allowed_hosts(hosts: &[String]) -> Result<(), String> {
    if hosts.len() > ALLOWED_HOSTS_MAX {
        return Err(format!("at most {ALLOWED_HOSTS_MAX} names, got {}", hosts.len()));
    }
    for host in hosts {
        let valid = !host.is_empty()
            && host.len() <= HOST_NAME_BYTES_MAX
            && host
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.');
        if !valid {
            return Err(format!(
                "{host:?} is not a host name (letters, digits, '-' and '.', without a port)"
            ));
        }
    }
    Ok(())
}

/// True when a `Content-Type` value is JSON: `application/json`, with
/// parameters (`; charset=utf-8`) or not, in any case.
pub fn is_json_content_type(value: &str) -> bool {
    let media_type = value.split(';').next().unwrap_or("").trim();
    media_type.eq_ignore_ascii_case("application/json")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_answered_without_a_token() {
        let policy = OriginPolicy::new(&["limiter.internal".to_owned()], true);
        for host in [
            "127.0.0.1:8080",
            "127.0.0.1",
            "10.0.0.5:80",
            "[::1]:8080",
            "[::1]",
            "localhost:8080",
            "LOCALHOST",
            "app.localhost:3000",
            "limiter.internal:8080",
            "Limiter.Internal.",
        ] {
            assert_eq!(policy.check(Some(host), None), Ok(()), "{host}");
        }
        for host in [
            "attacker.example:8080",
            "limiter.internal.attacker.example",
            "localhost.attacker.example",
            "127.0.0.1.nip.io",
            "[::1]:x",
            "localhost:",
            "[not-an-ip]",
        ] {
            assert!(
                matches!(policy.check(Some(host), None), Err(OriginRefusal::ForeignHost(_))),
                "{host}"
            );
        }
        assert_eq!(policy.check(None, None), Ok(()), "no browser omits Host");
        let open = OriginPolicy::new(&[], false);
        assert_eq!(open.check(Some("any.example"), None), Ok(()));
    }

    #[test]
    fn only_the_servers_own_origin_may_carry_origin() {
        for policy in [OriginPolicy::new(&[], true), OriginPolicy::new(&[], false)] {
            let host = Some("127.0.0.1:8080");
            assert_eq!(policy.check(host, Some("http://127.0.0.1:8080")), Ok(()));
            assert_eq!(policy.check(host, Some("HTTPS://127.0.0.1:8080")), Ok(()));
            for origin in [
                "http://attacker.example",
                "null",
                "http://127.0.0.1:8081",
                "http://127.0.0.1",
            ] {
                assert!(
                    matches!(policy.check(host, Some(origin)), Err(OriginRefusal::ForeignOrigin(_))),
                    "{origin}"
                );
            }
            assert!(policy.check(None, Some("http://127.0.0.1:8080")).is_err());
        }
    }

    #[test]
    fn json_content_types() {
        for json in [
            "application/json",
            "Application/JSON; charset=utf-8",
            " application/json ;x=1",
        ] {
            assert!(is_json_content_type(json), "{json}");
        }
        for other in [
            "text/plain",
            "application/x-www-form-urlencoded",
            "multipart/form-data; boundary=x",
            "",
        ] {
            assert!(!is_json_content_type(other), "{other}");
        }
    }

    #[test]
    fn allowed_hosts_are_names_without_ports() {
        assert!(check_allowed_hosts(&["limiter.internal".to_owned(), "a-b.c".to_owned()]).is_ok());
        for bad in ["", "limiter.internal:8080", "a b", "http://x"] {
            assert!(check_allowed_hosts(&[bad.to_owned()]).is_err(), "{bad}");
        }
        assert!(check_allowed_hosts(&vec!["a".to_owned(); ALLOWED_HOSTS_MAX + 1]).is_err());
    }
}
