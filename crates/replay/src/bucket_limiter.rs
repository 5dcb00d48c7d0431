//! A token-bucket limit kind, prototyped in the replay only (`replay --limiter-kind
//! bucket`, `local` strategy): every rolling definition becomes a bucket of its
//! capacity, full at the start and refilled continuously at its capacity per
//! window, as Anthropic enforces its limits (docs/provider-profiles.md,
//! "Anthropic"). It measures what such a kind would give against a provider
//! that keeps buckets (BENCHMARKS.md, "Provider profiles"), before anyone
//! builds it into the backends; nothing outside the replay uses it.
//!
//! Why it can differ from a rolling window of the same capacity: a call's
//! output reservation (`max_tokens`) is held until its Complete gives back the
//! excess E. A rolling window charges that excess for every instant it is held
//! and then returns it whole, so the window's room is short by the sum of the
//! excesses in flight the whole time; a bucket takes E once and refunds it, so
//! in steady state it admits exactly the refill rate of what is finally charged.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use ratelimiter::{
    Clock, CompleteRequest, Denial, LeaseId, LimitDefinition, LimitKey, LimitKind, Limiter, LimiterError,
    ReserveOutcome, ReserveRequest,
};

/// The retry hint of a full concurrency limit, in ms: no time frees a slot, a
/// Complete does, and the scheduler resumes a queue at the Complete of one of
/// its leases; the hint only bounds the wait when the holder is elsewhere.
pub const CONCURRENCY_RETRY_MS: u64 = 1_000;

/// One limit's state.
#[derive(Debug, Clone)]
enum Limit {
    /// A bucket of `capacity` tokens, refilled at `capacity` per window.
    Bucket {
        capacity: u64,
        /// Refill per ms: the capacity over the window.
        refill_per_ms: f64,
        level: f64,
        updated_ms: u64,
    },
    /// Calls in flight.
    Concurrency { capacity: u64, held: u64 },
}

impl Limit {
    fn capacity(&self) -> u64 {
        match self {
            Limit::Bucket { capacity, .. } | Limit::Concurrency { capacity, .. } => *capacity,
        }
    }

    /// Brings a bucket's level to `now_ms`.
    fn refill(&mut self, now_ms: u64) {
        if let Limit::Bucket {
            capacity,
            refill_per_ms,
            level,
            updated_ms,
        } = self
        {
            let elapsed_ms = now_ms.saturating_sub(*updated_ms) as f64;
            *level = (*level + elapsed_ms * *refill_per_ms).min(*capacity as f64);
            *updated_ms = (*updated_ms).max(now_ms);
        }
    }

    /// `None` when `amount` fits now, else the ms until it would.
    fn wait_ms(&self, amount: u64) -> Option<u64> {
        match self {
            Limit::Bucket {
                refill_per_ms, level, ..
            } => {
                let missing = amount as f64 - level;
                (missing > 0.0).then(|| ((missing / refill_per_ms).ceil() as u64).max(1))
            }
            Limit::Concurrency { capacity, held } => (held + amount > *capacity).then_some(CONCURRENCY_RETRY_MS),
        }
    }

    fn take(&mut self, amount: u64) {
        match self {
            Limit::Bucket { level, .. } => *level -= amount as f64,
            Limit::Concurrency { held, .. } => *held += amount,
        }
    }

    /// Gives back what a completed lease held beyond `used` (a bucket; `used` is
    /// capped at what was held) or its slots (concurrency).
    fn give_back(&mut self, held_amount: u64, used: u64) {
        match self {
            Limit::Bucket { capacity, level, .. } => {
                let refund = held_amount.saturating_sub(used) as f64;
                *level = (*level + refund).min(*capacity as f64);
            }
            Limit::Concurrency { held, .. } => *held = held.saturating_sub(held_amount),
        }
    }
}

/// What the limiter holds.
#[derive(Debug, Default)]
struct State {
    limits: HashMap<LimitKey, Limit>,
    /// Granted leases: when, and what each holds per key.
    leases: HashMap<LeaseId, (u64, Vec<(LimitKey, u64)>)>,
}

/// A [`Limiter`] whose rolling limits are token buckets.
#[derive(Debug)]
pub struct BucketLimiter {
    clock: Arc<dyn Clock>,
    state: Mutex<State>,
}

impl BucketLimiter {
    /// Buckets for the rolling `definitions`, full now, and counters for the
    /// concurrency ones.
    pub fn new(clock: Arc<dyn Clock>, definitions: &[LimitDefinition]) -> Self {
        let now_ms = clock.now_unix_ms();
        let limits = (definitions.iter())
            .map(|d| {
                let limit = match d.kind() {
                    LimitKind::Rolling | LimitKind::Bucket => Limit::Bucket {
                        capacity: d.capacity(),
                        refill_per_ms: d.capacity() as f64 / (d.window_seconds() * 1_000) as f64,
                        level: d.capacity() as f64,
                        updated_ms: now_ms,
                    },
                    LimitKind::Concurrency => Limit::Concurrency {
                        capacity: d.capacity(),
                        held: 0,
                    },
                };
                (d.key().clone(), limit)
            })
            .collect();
        Self {
            clock,
            state: Mutex::new(State {
                limits,
                leases: HashMap::new(),
            }),
        }
    }
}

#[async_trait]
impl Limiter for BucketLimiter {
    async fn reserve(&self, request: &ReserveRequest) -> Result<ReserveOutcome, LimiterError> {
        let now_ms = self.clock.now_unix_ms();
        let mut state = self.state.lock().expect("bucket limiter lock");
        if let Some((reserved_at_unix_ms, _)) = state.leases.get(&request.lease_id()) {
            return Ok(ReserveOutcome::Allowed {
                reserved_at_unix_ms: *reserved_at_unix_ms,
            });
        }
        // The longest wait among the limits that cannot take their amount: all fit then.
        let mut denied: Option<(LimitKey, u64)> = None;
        for requirement in request.requirements() {
            let limit = (state.limits.get_mut(&requirement.key))
                .ok_or_else(|| LimiterError::UnknownKey(requirement.key.clone()))?;
            if requirement.amount > limit.capacity() {
                let key = requirement.key.clone();
                return Ok(ReserveOutcome::Denied(Denial::ExceedsCapacity { key }));
            }
            limit.refill(now_ms);
            if let Some(wait_ms) = limit.wait_ms(requirement.amount) {
                if denied.as_ref().is_none_or(|(_, longest)| wait_ms > *longest) {
                    denied = Some((requirement.key.clone(), wait_ms));
                }
            }
        }
        if let Some((key, retry_after_ms)) = denied {
            return Ok(ReserveOutcome::Denied(Denial::InsufficientCapacity {
                key,
                retry_after_ms,
            }));
        }
        let mut holds = Vec::with_capacity(request.requirements().len());
        for requirement in request.requirements() {
            let limit = state.limits.get_mut(&requirement.key).expect("checked above");
            limit.take(requirement.amount);
            holds.push((requirement.key.clone(), requirement.amount));
        }
        state.leases.insert(request.lease_id(), (now_ms, holds));
        Ok(ReserveOutcome::Allowed {
            reserved_at_unix_ms: now_ms,
        })
    }

    async fn complete(&self, request: &CompleteRequest) -> Result<(), LimiterError> {
        let now_ms = self.clock.now_unix_ms();
        let mut state = self.state.lock().expect("bucket limiter lock");
        let Some((_, holds)) = state.leases.remove(&request.lease_id()) else {
            return Ok(());
        };
        for (key, held_amount) in holds {
            // A token limit without an actual keeps its whole reservation (what the
            // call used is unknown), as the backends do.
            let used = (request.actuals().iter())
                .find(|a| a.key == key)
                .map_or(held_amount, |a| a.actual_amount);
            let limit = state.limits.get_mut(&key).expect("a held key is defined");
            limit.refill(now_ms);
            limit.give_back(held_amount, used);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ratelimiter::{Actual, FakeClock, Requirement};

    fn key(dimension: &str) -> LimitKey {
        LimitKey::llm_dimension("anthropic", "m", dimension).unwrap()
    }

    fn reserve_request(lease: u128, otpm: u64) -> ReserveRequest {
        let requirements = vec![
            Requirement {
                key: key("otpm"),
                amount: otpm,
            },
            Requirement {
                key: key("concurrency"),
                amount: 1,
            },
        ];
        ReserveRequest::new(LeaseId::from_u128(lease), None, requirements).unwrap()
    }

    fn limiter(clock: &FakeClock) -> BucketLimiter {
        let definitions = [
            LimitDefinition::rolling(key("otpm"), 600, 60).unwrap(),
            LimitDefinition::concurrency(key("concurrency"), 2, 300).unwrap(),
        ];
        BucketLimiter::new(Arc::new(clock.clone()), &definitions)
    }

    fn retry_after(outcome: ReserveOutcome) -> u64 {
        match outcome {
            ReserveOutcome::Denied(Denial::InsufficientCapacity { retry_after_ms, .. }) => retry_after_ms,
            other => panic!("expected a denial for now, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn a_bucket_starts_full_refills_at_its_rate_and_refunds_at_complete() {
        let clock = FakeClock::new(1_000_000);
        let limiter = limiter(&clock);
        assert!(limiter.reserve(&reserve_request(1, 500)).await.unwrap().is_allowed());
        // 100 left; 300 more need 200 refilled at 10 a second: 20 s.
        assert_eq!(
            retry_after(limiter.reserve(&reserve_request(2, 300)).await.unwrap()),
            20_000
        );
        clock.advance_ms(10_000);
        assert_eq!(
            retry_after(limiter.reserve(&reserve_request(3, 300)).await.unwrap()),
            10_000
        );
        // The call wrote 150 of its 500: 350 come back at once.
        let actuals = vec![Actual {
            key: key("otpm"),
            actual_amount: 150,
        }];
        let complete = CompleteRequest::new(LeaseId::from_u128(1), None, actuals).unwrap();
        limiter.complete(&complete).await.unwrap();
        assert!(limiter.reserve(&reserve_request(4, 300)).await.unwrap().is_allowed());
        // Completing twice changes nothing; a level never passes the capacity.
        limiter.complete(&complete).await.unwrap();
        clock.advance_ms(3_600_000);
        assert!(matches!(
            limiter.reserve(&reserve_request(5, 601)).await.unwrap(),
            ReserveOutcome::Denied(Denial::ExceedsCapacity { .. })
        ));
        // Leases 4 and 6 hold both calls in flight.
        assert!(limiter.reserve(&reserve_request(6, 600)).await.unwrap().is_allowed());
        assert_eq!(
            retry_after(limiter.reserve(&reserve_request(7, 1)).await.unwrap()),
            CONCURRENCY_RETRY_MS
        );
    }

    #[tokio::test]
    async fn a_denied_reserve_takes_nothing_and_an_unknown_key_is_an_error() {
        let clock = FakeClock::new(0);
        let limiter = limiter(&clock);
        assert!(limiter.reserve(&reserve_request(1, 600)).await.unwrap().is_allowed());
        retry_after(limiter.reserve(&reserve_request(2, 1)).await.unwrap());
        let concurrency = limiter.state.lock().unwrap().limits[&key("concurrency")].clone();
        assert!(matches!(concurrency, Limit::Concurrency { held: 1, .. }));
        let unknown = ReserveRequest::new(
            LeaseId::from_u128(3),
            None,
            vec![Requirement {
                key: key("rpm"),
                amount: 1,
            }],
        )
        .unwrap();
        assert!(matches!(
            limiter.reserve(&unknown).await,
            Err(LimiterError::UnknownKey(_))
        ));
    }
}
