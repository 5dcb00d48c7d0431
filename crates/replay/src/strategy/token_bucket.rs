//! `token-bucket`: the OpenAI cookbook's parallel request processor. Two buckets,
//! requests and tokens, start full at the per-minute limits and refill
//! continuously at that rate; a request takes 1 request and its prompt tokens plus
//! `max_tokens` (the cookbook counts the prompt with the provider's tokenizer), in
//! arrival order. After a 429 every send pauses until the provider's retry-after,
//! and the request is retried, at most [`ATTEMPTS_MAX`] times in all. Calls in
//! flight are capped at the provider's concurrency limit, as any careful client does.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::{Mutex, Semaphore};

use super::{Caller, Strategy};
use crate::outcome::{ReplayRequest, RequestOutcome};
use crate::sim::client::CallOutcome;
use crate::sim::limits::ProviderLimits;

/// Attempts per request, the cookbook's `max_attempts`.
pub const ATTEMPTS_MAX: u32 = 5;

/// Both buckets' levels, refilled lazily from the elapsed time.
#[derive(Debug)]
struct Buckets {
    requests: f64,
    tokens: f64,
    updated_unix_ms: u64,
}

/// The cookbook's client-side limiter.
#[derive(Debug)]
pub struct TokenBucket {
    caller: Caller,
    limits: ProviderLimits,
    gate: Mutex<Buckets>,
    /// No send before this time (Unix ms): set by a 429, read by the request first in line.
    paused_until_unix_ms: AtomicU64,
    in_flight: Arc<Semaphore>,
}

impl TokenBucket {
    /// Buckets sized to `limits`, full at the start.
    pub fn new(caller: Caller, limits: ProviderLimits) -> Self {
        let now = caller.clock().now_unix_ms();
        let concurrency = usize::try_from(limits.concurrency).expect("concurrency fits usize");
        Self {
            gate: Mutex::new(Buckets {
                requests: limits.rpm as f64,
                tokens: limits.tpm as f64,
                updated_unix_ms: now,
            }),
            paused_until_unix_ms: AtomicU64::new(0),
            in_flight: Arc::new(Semaphore::new(concurrency.min(Semaphore::MAX_PERMITS))),
            caller,
            limits,
        }
    }

    /// Waits, first in line, until both buckets hold what `tokens` needs, and takes it.
    async fn take(&self, tokens: f64) {
        // tokio's mutex is fair: waiters pass the gate in arrival order.
        let mut buckets = self.gate.lock().await;
        loop {
            let now = self.caller.clock().now_unix_ms();
            self.refill(&mut buckets, now);
            let paused_until = self.paused_until_unix_ms.load(Ordering::SeqCst);
            let wait_ms = if now < paused_until {
                paused_until - now
            } else if buckets.requests < 1.0 || buckets.tokens < tokens {
                self.refill_wait_ms(&buckets, tokens)
            } else {
                buckets.requests -= 1.0;
                buckets.tokens -= tokens;
                return;
            };
            tokio::time::sleep(Duration::from_millis(wait_ms.max(1))).await;
        }
    }

    fn refill(&self, buckets: &mut Buckets, now: u64) {
        let elapsed_ms = now.saturating_sub(buckets.updated_unix_ms) as f64;
        let window_ms = self.limits.window_ms as f64;
        buckets.requests =
            (buckets.requests + elapsed_ms * self.limits.rpm as f64 / window_ms).min(self.limits.rpm as f64);
        buckets.tokens = (buckets.tokens + elapsed_ms * self.limits.tpm as f64 / window_ms).min(self.limits.tpm as f64);
        buckets.updated_unix_ms = buckets.updated_unix_ms.max(now);
    }

    fn refill_wait_ms(&self, buckets: &Buckets, tokens: f64) -> u64 {
        let window_ms = self.limits.window_ms as f64;
        let for_requests = (1.0 - buckets.requests).max(0.0) * window_ms / self.limits.rpm as f64;
        let for_tokens = (tokens - buckets.tokens).max(0.0) * window_ms / self.limits.tpm as f64;
        for_requests.max(for_tokens).ceil() as u64
    }
}

#[async_trait]
impl Strategy for TokenBucket {
    async fn run(&self, request: ReplayRequest) -> RequestOutcome {
        let mut outcome = self.caller.outcome(&request);
        let tokens = (request.record.input_tokens + request.max_tokens) as f64;
        if tokens > self.limits.tpm as f64 {
            self.caller
                .fail(&mut outcome, "request larger than the token bucket".to_owned());
            return outcome;
        }
        while outcome.attempts < ATTEMPTS_MAX {
            let _slot = self.in_flight.acquire().await.expect("the semaphore is never closed");
            self.take(tokens).await;
            match self.caller.attempt(&request, &mut outcome).await {
                CallOutcome::Throttled { retry_after_ms } => {
                    let until = self.caller.clock().now_unix_ms() + retry_after_ms;
                    self.paused_until_unix_ms.fetch_max(until, Ordering::SeqCst);
                }
                CallOutcome::Done(_) | CallOutcome::Failed(_) => return outcome,
            }
        }
        self.caller
            .fail(&mut outcome, format!("still throttled after {ATTEMPTS_MAX} attempts"));
        outcome
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::client::ProviderClient;
    use crate::sim::limits::Accounting;
    use ratelimiter::{Clock, FakeClock};

    fn bucket(clock: &FakeClock) -> TokenBucket {
        let limits = ProviderLimits {
            rpm: 60,
            tpm: 600,
            window_ms: 60_000,
            concurrency: 2,
            ms_per_output_token: 0,
            accounting: Accounting::Actual,
        };
        let caller = Caller::new(
            ProviderClient::new("http://127.0.0.1:9", "m"),
            Arc::new(clock.clone()),
            limits.accounting,
        );
        TokenBucket::new(caller, limits)
    }

    #[tokio::test]
    async fn buckets_start_full_and_refill_at_the_per_window_rate() {
        let clock = FakeClock::new(1_000_000);
        let bucket = bucket(&clock);
        bucket.take(600.0).await;
        let mut buckets = bucket.gate.lock().await;
        assert_eq!((buckets.requests, buckets.tokens), (59.0, 0.0));
        // 300 tokens refill in half a window; one request in a sixtieth of it.
        assert_eq!(bucket.refill_wait_ms(&buckets, 300.0), 30_000);
        clock.advance_ms(15_000);
        bucket.refill(&mut buckets, clock.now_unix_ms());
        assert_eq!(buckets.tokens, 150.0);
        assert_eq!(bucket.refill_wait_ms(&buckets, 300.0), 15_000);
        // Levels never pass the limits, however long the bucket idles.
        clock.advance_ms(10 * 60_000);
        bucket.refill(&mut buckets, clock.now_unix_ms());
        assert_eq!((buckets.requests, buckets.tokens), (60.0, 600.0));
        assert_eq!(bucket.refill_wait_ms(&buckets, 600.0), 0);
    }

    #[tokio::test]
    async fn a_request_larger_than_the_bucket_fails_without_a_call() {
        let clock = FakeClock::new(0);
        let bucket = bucket(&clock);
        let request = ReplayRequest {
            index: 3,
            record: crate::trace::TraceRecord {
                offset_ms: 0,
                input_tokens: 500,
                output_tokens: 1,
            },
            arrival_unix_ms: 0,
            max_tokens: 200,
        };
        let outcome = bucket.run(request).await;
        assert!(!outcome.completed);
        assert_eq!(outcome.attempts, 0);
        assert_eq!(outcome.error.as_deref(), Some("request larger than the token bucket"));
    }
}
