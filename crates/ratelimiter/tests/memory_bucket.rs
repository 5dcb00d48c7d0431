//! Token-bucket limits on the memory backend (docs/bucket-limits.md), on a fake
//! clock: exact answers, the provider's bucket never overdrawn by what we grant,
//! and a snapshot that keeps the level across a restart and a clock step.

use std::sync::Arc;

use ratelimiter::bucket::BucketShape;
use ratelimiter::definition::{LimitDefinition, LimitState};
use ratelimiter::memory::{MemoryBackend, MemoryConfig, MemorySnapshot};
use ratelimiter::wire::{Actual, CompleteRequest, Denial, Requirement, ReserveOutcome, ReserveRequest};
use ratelimiter::{Backend, Clock, FakeClock, LeaseId, LimitKey, Limiter};

/// A start on a whole second, so slot boundaries fall on round instants.
const START_UNIX_MS: u64 = 1_800_000_000_000;
/// Anthropic-like output limit: 6,000 per minute, 100 per 1 s slot.
const CAPACITY: u64 = 6_000;
const WINDOW_SECONDS: u64 = 60;

fn key() -> LimitKey {
    LimitKey::new("anthropic:m:otpm").unwrap()
}

fn definition() -> LimitDefinition {
    LimitDefinition::bucket(key(), CAPACITY, WINDOW_SECONDS).unwrap()
}

/// The burst under the memory backend's default margin (240 ms for a minute).
fn burst() -> u64 {
    BucketShape::new(&definition(), ratelimiter::WINDOW_MARGIN_MS_DEFAULT)
        .unwrap()
        .burst()
}

async fn backend(clock: &FakeClock) -> MemoryBackend {
    let backend = MemoryBackend::new(Arc::new(clock.clone()), MemoryConfig::default());
    backend.apply_state(&LimitState::active(definition())).await.unwrap();
    backend
}

async fn reserve(backend: &MemoryBackend, lease: LeaseId, amount: u64) -> ReserveOutcome {
    let requirements = vec![Requirement { key: key(), amount }];
    let request = ReserveRequest::new(lease, None, requirements).unwrap();
    backend.reserve(&request).await.unwrap()
}

async fn complete(backend: &MemoryBackend, lease: LeaseId, actual_amount: u64) {
    let actuals = vec![Actual {
        key: key(),
        actual_amount,
    }];
    let request = CompleteRequest::new(lease, None, actuals).unwrap();
    backend.complete(&request).await.unwrap();
}

async fn in_use(backend: &MemoryBackend) -> u64 {
    backend.limit_report(&key()).await.unwrap().unwrap().in_use
}

fn hint_ms(outcome: &ReserveOutcome) -> u64 {
    match outcome {
        ReserveOutcome::Denied(Denial::InsufficientCapacity { retry_after_ms, .. }) => *retry_after_ms,
        other => panic!("expected insufficient_capacity, got {other:?}"),
    }
}

#[tokio::test]
async fn the_burst_then_the_refill_exactly_with_exact_hints() {
    let clock = FakeClock::new(START_UNIX_MS);
    let backend = backend(&clock).await;
    assert_eq!(burst(), 6_000 - 124, "a slot and 240 ms of refill kept back");
    let over = reserve(&backend, LeaseId::generate(), burst() + 1).await;
    assert_eq!(over, ReserveOutcome::Denied(Denial::ExceedsCapacity { key: key() }));
    assert!(matches!(
        reserve(&backend, LeaseId::generate(), burst()).await,
        ReserveOutcome::Allowed { .. }
    ));
    clock.advance_ms(250);
    // 150 units: two boundaries (at 1 s and 2 s) from now, 1,750 ms, plus the
    // rolling jitter (at most 50 ms).
    let hint = hint_ms(&reserve(&backend, LeaseId::generate(), 150).await);
    assert!((1_750..=1_800).contains(&hint), "hint {hint}");
    clock.advance_ms(1_749);
    assert!(matches!(
        reserve(&backend, LeaseId::generate(), 101).await,
        ReserveOutcome::Denied(_)
    ));
    clock.advance_ms(1);
    assert!(matches!(
        reserve(&backend, LeaseId::generate(), 150).await,
        ReserveOutcome::Allowed { .. }
    ));
    assert_eq!(in_use(&backend).await, burst() - 50);
    // A whole window later the bucket is full, never above its burst.
    clock.advance_ms(3_600_000);
    assert_eq!(in_use(&backend).await, 0);
}

#[tokio::test]
async fn a_complete_refunds_within_the_window_only_and_once() {
    let clock = FakeClock::new(START_UNIX_MS);
    let backend = backend(&clock).await;
    let (early, late) = (LeaseId::generate(), LeaseId::generate());
    reserve(&backend, early, 4_000).await;
    reserve(&backend, late, 1_000).await;
    complete(&backend, early, 500).await;
    complete(&backend, early, 500).await;
    assert_eq!(in_use(&backend).await, 1_500, "3,500 back, once");
    // After the window and its margin a refund would return units the bucket
    // has refilled already.
    clock.advance_ms(60_240);
    complete(&backend, late, 0).await;
    assert_eq!(in_use(&backend).await, 0);
    let again = LeaseId::generate();
    reserve(&backend, again, burst()).await;
    clock.advance_ms(60_240);
    reserve(&backend, LeaseId::generate(), burst()).await;
    complete(&backend, again, 0).await;
    assert_eq!(in_use(&backend).await, burst(), "no refund after the window");
}

/// A tiny deterministic generator (xorshift64), so a failure replays.
struct Rng(u64);

impl Rng {
    fn below(&mut self, bound: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % bound
    }
}

/// The provider's bucket (docs/bucket-limits.md): capacity C refilled
/// continuously at C per window, capped at C, receiving each grant up to a
/// margin after we made it and correcting a call's count at its end, before our
/// Complete reaches us. Whatever we grant, in any pattern, it never goes below 0.
#[tokio::test]
async fn whatever_is_granted_never_overdraws_the_providers_continuous_bucket() {
    let margin_ms = 240;
    let rate_per_ms = CAPACITY as f64 / (WINDOW_SECONDS * 1_000) as f64;
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut granted_total = 0;
    for round in 0..20 {
        let clock = FakeClock::new(START_UNIX_MS + rng.below(1_000));
        let backend = backend(&clock).await;
        // (instant at the provider, units taken; negative: given back).
        let mut provider: Vec<(u64, i64)> = Vec::new();
        // (instant of our Complete, lease, actual).
        let mut completes: Vec<(u64, LeaseId, u64)> = Vec::new();
        for step in 0..600 {
            // Mostly small steps, now and then a pause long enough to refill.
            clock.advance_ms(if step % 50 == 49 { 61_000 } else { rng.below(400) });
            let now = clock.now_unix_ms();
            completes.sort_by_key(|c| std::cmp::Reverse(c.0));
            while completes.last().is_some_and(|c| c.0 <= now) {
                let (_, lease, used) = completes.pop().unwrap();
                complete(&backend, lease, used).await;
            }
            for _ in 0..1 + rng.below(8) {
                let amount = 1 + rng.below(1_500);
                let lease = LeaseId::generate();
                if let ReserveOutcome::Allowed { .. } = reserve(&backend, lease, amount).await {
                    granted_total += amount;
                    // The worst spread: a call reaches the provider at once or a whole margin later.
                    let arrival = now + margin_ms * rng.below(2);
                    provider.push((arrival, amount as i64));
                    let used = rng.below(amount + 1);
                    let duration = rng.below(5_000);
                    // The provider corrects when the call ends; our Complete follows
                    // after the response travelled back (at least the call's own
                    // delay to the provider).
                    provider.push((arrival + duration, -((amount - used) as i64)));
                    completes.push((now + margin_ms + duration, lease, used));
                }
            }
        }
        provider.sort_by_key(|&(at, units)| (at, -units));
        let mut level = CAPACITY as f64;
        let mut at_ms = provider[0].0;
        for (event_ms, units) in provider {
            level = (level + (event_ms - at_ms) as f64 * rate_per_ms).min(CAPACITY as f64);
            at_ms = event_ms;
            level = (level - units as f64).min(CAPACITY as f64);
            assert!(
                level >= -1e-6,
                "round {round}: the provider's bucket overdrawn to {level} at {at_ms}"
            );
        }
    }
    // About the refill rate over 20 rounds of ~850 s, plus bursts and refunds.
    assert!(
        granted_total > 1_500_000,
        "the stream kept the bucket busy: {granted_total}"
    );
}

#[tokio::test]
async fn a_snapshot_keeps_the_level_and_a_clock_step_neither_fills_nor_empties_it() {
    const HOUR_MS: i64 = 3_600_000;
    for step_ms in [0, HOUR_MS, -HOUR_MS] {
        let clock = FakeClock::new(START_UNIX_MS);
        let first = backend(&clock).await;
        let lease = LeaseId::generate();
        reserve(&first, lease, 5_000).await;
        let snapshot = MemorySnapshot::decode(&first.snapshot().encode()).unwrap();
        assert_eq!(snapshot, first.snapshot());

        let stepped = clock.after_wall_step(step_ms);
        let second = backend(&stepped).await;
        let report = second.restore(&snapshot).unwrap();
        assert_eq!(report.units_held, 5_000, "step {step_ms}: {report:?}");
        assert_eq!(in_use(&second).await, 5_000, "step {step_ms}: the level restored");
        // The refill goes on from the saved boundary, in real time.
        stepped.advance_ms(10_000);
        assert_eq!(in_use(&second).await, 4_000, "step {step_ms}: ten slots refilled");
        complete(&second, lease, 1_000).await;
        assert_eq!(
            in_use(&second).await,
            0,
            "step {step_ms}: the lease refunds after the restore"
        );
    }
}
