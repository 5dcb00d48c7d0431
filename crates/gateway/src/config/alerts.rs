//! `gateway.alerts`: where budget alerts go besides the log (docs/gateway.md,
//! "Budgets and spend").

use serde::Deserialize;

/// The pause after a webhook's first failed attempt; each further one doubles it.
pub const BACKOFF_FIRST_MS: u64 = 1_000;
/// The longest pause between a webhook's attempts.
pub const BACKOFF_MAX_MS: u64 = 60_000;
/// The longest webhook URL accepted: a URL, not a document.
pub const WEBHOOK_URL_BYTES_MAX: usize = 2_048;
/// Attempts per alert by default, and at most: with the backoff's doubling from
/// one second, five attempts span about fifteen seconds, ten about seventeen minutes.
pub const ATTEMPTS_DEFAULT: u32 = 5;
/// The most attempts per alert.
pub const ATTEMPTS_LIMIT: u32 = 10;
/// Alerts waiting to be sent by default: a receiver down for a while loses none of
/// the alerts a day's periods raise.
pub const QUEUE_DEFAULT: usize = 1_000;
/// The largest queue: each waiting alert is a few hundred bytes.
pub const QUEUE_LIMIT: usize = 100_000;

/// How the webhook delivers: its URL, its attempts and queue, its backoff.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WebhookSettings {
    /// `http://` or `https://`, validated with the configuration.
    pub url: hyper::Uri,
    /// Attempts per alert, the first included.
    pub attempts_max: u32,
    /// Alerts waiting to be sent at most.
    pub queue_max: usize,
    /// The pause after a first failure (doubled after each next, up to [`BACKOFF_MAX_MS`]).
    pub backoff_first_ms: u64,
}

/// The `gateway.alerts` section.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct AlertsConfig {
    /// Each budget alert is POSTed here as one JSON event; none: alerts are logged only.
    #[serde(default)]
    pub webhook_url: Option<String>,
    /// Attempts per alert, the first included (1..=10; default 5).
    #[serde(default)]
    pub attempts_max: Option<u32>,
    /// Alerts waiting to be sent at most (1..=100000; default 1000); a full queue drops.
    #[serde(default)]
    pub queue_max: Option<usize>,
}

impl AlertsConfig {
    /// The webhook's settings (`None` without a URL), or the field that is wrong and why.
    pub fn webhook(&self) -> Result<Option<WebhookSettings>, (&'static str, String)> {
        let attempts_max = self.attempts_max.unwrap_or(ATTEMPTS_DEFAULT);
        if !(1..=ATTEMPTS_LIMIT).contains(&attempts_max) {
            return Err((
                "attempts_max",
                format!("must be 1..={ATTEMPTS_LIMIT}, got {attempts_max}"),
            ));
        }
        let queue_max = self.queue_max.unwrap_or(QUEUE_DEFAULT);
        if !(1..=QUEUE_LIMIT).contains(&queue_max) {
            return Err(("queue_max", format!("must be 1..={QUEUE_LIMIT}, got {queue_max}")));
        }
        let Some(url) = &self.webhook_url else {
            return Ok(None);
        };
        if url.len() > WEBHOOK_URL_BYTES_MAX {
            return Err(("webhook_url", format!("longer than {WEBHOOK_URL_BYTES_MAX} bytes")));
        }
        let uri: hyper::Uri = url
            .parse()
            .map_err(|e| ("webhook_url", format!("{url:?} is not a URL: {e}")))?;
        if !matches!(uri.scheme_str(), Some("http" | "https")) || uri.host().is_none_or(str::is_empty) {
            return Err((
                "webhook_url",
                format!("must be an http:// or https:// URL with a host, got {url:?}"),
            ));
        }
        Ok(Some(WebhookSettings {
            url: uri,
            attempts_max,
            queue_max,
            backoff_first_ms: BACKOFF_FIRST_MS,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(url: &str) -> AlertsConfig {
        AlertsConfig {
            webhook_url: Some(url.to_owned()),
            ..AlertsConfig::default()
        }
    }

    #[test]
    fn a_webhook_needs_an_http_url_with_a_host_and_bounded_attempts_and_queue() {
        let settings = with("https://alerts.example.com/budget").webhook().unwrap().unwrap();
        assert_eq!(settings.url.host(), Some("alerts.example.com"));
        assert_eq!(
            (settings.attempts_max, settings.queue_max),
            (ATTEMPTS_DEFAULT, QUEUE_DEFAULT)
        );
        assert!(with("http://127.0.0.1:9000/hook").webhook().unwrap().is_some());
        assert_eq!(AlertsConfig::default().webhook(), Ok(None));
        for (bad, field) in [
            (with("ftp://example.com/x"), "webhook_url"),
            (with("/relative/path"), "webhook_url"),
            (with("not a url"), "webhook_url"),
            (
                with(&format!("https://example.com/{}", "a".repeat(WEBHOOK_URL_BYTES_MAX))),
                "webhook_url",
            ),
            (
                AlertsConfig {
                    attempts_max: Some(0),
                    ..with("http://h/")
                },
                "attempts_max",
            ),
            (
                AlertsConfig {
                    attempts_max: Some(11),
                    ..with("http://h/")
                },
                "attempts_max",
            ),
            (
                AlertsConfig {
                    queue_max: Some(0),
                    ..with("http://h/")
                },
                "queue_max",
            ),
            (
                AlertsConfig {
                    queue_max: Some(QUEUE_LIMIT + 1),
                    ..with("http://h/")
                },
                "queue_max",
            ),
        ] {
            assert_eq!(bad.webhook().unwrap_err().0, field, "{bad:?}");
        }
    }
}
