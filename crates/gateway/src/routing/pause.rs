//! Provider 429s cool the model down on every server of a fleet (docs/gateway.md,
//! "Provider 429s"): a [`ratelimiter::pause::Pause`] holds what is left of the
//! model's rpm (or concurrency) limit on the shared backend for the provider's time
//! (`retry-after-ms`, `retry-after`, else its limits' resets), with `hold_ms`, so
//! every server's calls to the model are denied by the backend itself, with a hint
//! no later than that time (exact on the memory backend; TigerBeetle's hints are a
//! backoff of at most 1 s), capacity freed meanwhile is held again every 100 ms,
//! and the hold ends by itself then, even if this server dies meanwhile.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use axum::http::HeaderMap;
use ratelimiter::clock::Clock;
use ratelimiter::pause::{Pause, REHOLD_INTERVAL_MS};
use ratelimiter::Backend;

use crate::limits::ModelKeys;

/// When this server's last cooldown of a model ends. The hold on the backend
/// denies with the hint of the held key (the end of its one-minute window); the
/// gateway's 429 hints the provider's own time instead, which this server knows.
/// Other servers of a fleet answer the backend's hint (docs/gateway.md).
#[derive(Debug)]
pub struct Cooldown {
    until_unix_ms: AtomicU64,
    /// The gateway's clock.
    clock: Arc<dyn Clock>,
}

impl Cooldown {
    /// No cooldown yet, on `clock`.
    pub fn new(clock: Arc<dyn Clock>) -> Self {
        Self {
            until_unix_ms: AtomicU64::new(0),
            clock,
        }
    }

    fn now_unix_ms(&self) -> u64 {
        self.clock.now_unix_ms()
    }

    /// The time left, in ms, while a cooldown runs.
    pub fn left_ms(&self) -> Option<u64> {
        let left = self
            .until_unix_ms
            .load(Ordering::Relaxed)
            .saturating_sub(self.now_unix_ms());
        (left > 0).then_some(left)
    }

    /// When the cooldown ends (unix ms), while one runs.
    pub fn until_unix_ms(&self) -> Option<u64> {
        let until = self.until_unix_ms.load(Ordering::Relaxed);
        (until > self.now_unix_ms()).then_some(until)
    }

    /// Makes the cooldown last until `until_unix_ms` at least; true when that is a
    /// re-hold interval or more past the pause already running, so that a new pause is
    /// worth starting. The burst of 429s of the calls in flight when the provider's
    /// limit ran out then starts one pause, not one per call.
    fn extend_to(&self, until_unix_ms: u64) -> bool {
        let before = self.until_unix_ms.fetch_max(until_unix_ms, Ordering::Relaxed);
        until_unix_ms >= before.saturating_add(REHOLD_INTERVAL_MS)
    }
}

/// The key a cooldown holds: the model's rpm limit, else its concurrency limit.
pub fn key(keys: &ModelKeys) -> Option<&ratelimiter::LimitKey> {
    keys.rpm.as_ref().or(keys.concurrency.as_ref())
}

/// A response's rate-limit headers, read by the library.
pub fn provider_headers(headers: &HeaderMap) -> ratelimiter::provider_headers::ProviderHeaders {
    let pairs = headers
        .iter()
        .filter_map(|(name, value)| Some((name.as_str(), value.to_str().ok()?)));
    ratelimiter::provider_headers::read_headers(pairs)
}

/// Pauses the model's rpm (else concurrency) key for the provider's time: holds its
/// free part on the backend, re-holds what frees meanwhile, and gives it back at the
/// end. Runs in the background.
pub fn start(backend: Arc<dyn Backend>, keys: &ModelKeys, headers: &HeaderMap, cooldown: &Cooldown) {
    let Some(key) = key(keys).cloned() else {
        return;
    };
    let pause = Pause::after_429(&provider_headers(headers));
    let hold_ms = pause.duration_ms();
    if !cooldown.extend_to(cooldown.now_unix_ms().saturating_add(hold_ms)) {
        return;
    }
    tokio::spawn(async move {
        match pause.hold(backend, std::slice::from_ref(&key)).await {
            Ok(paused) => {
                tracing::warn!(%key, hold_ms, "gateway: the provider answered 429; the model is paused");
                paused.run().await;
            }
            Err(error) => tracing::warn!(%key, %error, "gateway: the provider answered 429; the pause failed"),
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    #[test]
    fn a_cooldown_counts_down_on_the_gateways_clock_and_only_grows() {
        let clock = Arc::new(ratelimiter::clock::FakeClock::new(1_000_000));
        let cooldown = Cooldown::new(clock.clone());
        let now = || clock.now_unix_ms();
        assert_eq!(cooldown.left_ms(), None);
        assert!(cooldown.extend_to(now() + 5_000), "the first pause starts");
        assert!(!cooldown.extend_to(now() + 1_000), "one ending sooner does not");
        assert!(!cooldown.extend_to(now() + 5_010), "nor one ending a few ms later");
        assert_eq!(cooldown.left_ms(), Some(5_010));
        clock.advance_ms(2_000);
        assert_eq!(cooldown.left_ms(), Some(3_010), "it counts down with the clock");
        assert_eq!(cooldown.until_unix_ms(), Some(1_005_010));
        clock.advance_ms(3_010);
        assert_eq!(cooldown.left_ms(), None, "and ends with it");
        assert_eq!(cooldown.until_unix_ms(), None);
        assert!(cooldown.extend_to(now() + 60_000), "a new pause starts");
    }

    #[test]
    fn hints_in_ms_win_over_seconds() {
        let mut headers = HeaderMap::new();
        let retry_after_ms = |headers: &HeaderMap| provider_headers(headers).retry_after_ms;
        assert_eq!(retry_after_ms(&headers), None);
        headers.insert("retry-after", HeaderValue::from_static("2"));
        assert_eq!(retry_after_ms(&headers), Some(2000));
        headers.insert("retry-after-ms", HeaderValue::from_static("150.5"));
        assert_eq!(retry_after_ms(&headers), Some(151));
    }
}
