//! Provider 429s cool the model down on every server of a fleet (docs/gateway.md,
//! "Provider 429s"): the gateway reserves what is left of the model's rpm (or
//! concurrency) limit on the shared backend, and gives it back when the
//! provider's `retry-after` ends. Every server's calls to the model are then
//! denied by the backend itself, with its own retry hint, until then; if this
//! server dies meanwhile, the hold ends with its window or timeout.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::http::HeaderMap;
use ratelimiter::{Actual, Backend, CompleteRequest, LeaseId, LimitKind, Requirement, ReserveOutcome, ReserveRequest};

use crate::limits::ModelKeys;

/// The longest cooldown: the provider's windows are a minute, and the hold on
/// the rpm key ends with its one-minute window anyway.
pub const COOLDOWN_MS_MAX: u64 = 60_000;
/// The cooldown when the provider's 429 names no time.
pub const COOLDOWN_MS_DEFAULT: u64 = 1_000;

/// When this server's last cooldown of a model ends. The hold on the backend
/// denies with the hint of the held key (the end of its one-minute window); the
/// gateway's 429 hints the provider's own time instead, which this server knows.
/// Other servers of a fleet answer the backend's hint (docs/gateway.md).
#[derive(Debug, Default)]
pub struct Cooldown {
    until_unix_ms: AtomicU64,
}

fn now_unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

impl Cooldown {
    /// The time left, in ms, while a cooldown runs.
    pub fn left_ms(&self) -> Option<u64> {
        let left = self.until_unix_ms.load(Ordering::Relaxed).saturating_sub(now_unix_ms());
        (left > 0).then_some(left)
    }

    fn extend_to(&self, until_unix_ms: u64) {
        self.until_unix_ms.fetch_max(until_unix_ms, Ordering::Relaxed);
    }
}

/// The key a cooldown holds: the model's rpm limit, else its concurrency limit.
pub fn key(keys: &ModelKeys) -> Option<&ratelimiter::LimitKey> {
    keys.rpm.as_ref().or(keys.concurrency.as_ref())
}

/// The provider's retry hint: `retry-after-ms`, else `retry-after` in seconds, as
/// the library reads them ([`ratelimiter::provider_headers::read_headers`]).
pub fn retry_after_ms(headers: &HeaderMap) -> Option<u64> {
    provider_headers(headers).retry_after_ms
}

/// A response's rate-limit headers, read by the library.
pub fn provider_headers(headers: &HeaderMap) -> ratelimiter::provider_headers::ProviderHeaders {
    let pairs = headers
        .iter()
        .filter_map(|(name, value)| Some((name.as_str(), value.to_str().ok()?)));
    ratelimiter::provider_headers::read_headers(pairs)
}

/// Holds the free part of the model's rpm (else concurrency) limit for the
/// provider's retry hint, then gives it back. Runs in the background.
pub fn start(backend: Arc<dyn Backend>, keys: &ModelKeys, headers: &HeaderMap, cooldown: &Cooldown) {
    let Some(key) = key(keys).cloned() else {
        return;
    };
    let hold_ms = retry_after_ms(headers)
        .unwrap_or(COOLDOWN_MS_DEFAULT)
        .clamp(1, COOLDOWN_MS_MAX);
    cooldown.extend_to(now_unix_ms().saturating_add(hold_ms));
    tokio::spawn(async move {
        let Ok(Some(report)) = backend.limit_report(&key).await else {
            return;
        };
        let free = report.state.definition().capacity().saturating_sub(report.in_use);
        if free == 0 {
            return;
        }
        let lease_id = LeaseId::generate();
        let requirement = Requirement {
            key: key.clone(),
            amount: free,
        };
        let Ok(request) = ReserveRequest::new(lease_id, Some("gateway-cooldown".into()), vec![requirement]) else {
            return;
        };
        if !matches!(backend.reserve(&request).await, Ok(ReserveOutcome::Allowed { .. })) {
            return;
        }
        tracing::warn!(%key, hold_ms, "gateway: the provider answered 429; the model is cooled down");
        tokio::time::sleep(Duration::from_millis(hold_ms)).await;
        let actuals = match report.state.definition().kind() {
            LimitKind::Rolling => vec![Actual { key, actual_amount: 0 }],
            LimitKind::Concurrency => Vec::new(),
        };
        if let Ok(complete) = CompleteRequest::new(lease_id, None, actuals) {
            let _ = backend.complete(&complete).await;
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    #[test]
    fn a_cooldown_counts_down_and_only_grows() {
        let cooldown = Cooldown::default();
        assert_eq!(cooldown.left_ms(), None);
        cooldown.extend_to(now_unix_ms() + 5_000);
        cooldown.extend_to(now_unix_ms() + 1_000);
        let left = cooldown.left_ms().unwrap();
        assert!(left > 1_000 && left <= 5_000, "{left}");
    }

    #[test]
    fn hints_in_ms_win_over_seconds() {
        let mut headers = HeaderMap::new();
        assert_eq!(retry_after_ms(&headers), None);
        headers.insert("retry-after", HeaderValue::from_static("2"));
        assert_eq!(retry_after_ms(&headers), Some(2000));
        headers.insert("retry-after-ms", HeaderValue::from_static("150.5"));
        assert_eq!(retry_after_ms(&headers), Some(151));
    }
}
