//! Limits with a calendar period on the memory backend (docs/decisions.md, "Model"),
//! on a fake clock: every hold ends at the period's end in UTC, the limit resets at
//! the boundary and not a millisecond before, a reconciled reservation keeps that
//! end, and what cannot fit before the period ends is refused as final.

use std::sync::Arc;

use ratelimiter::definition::{LimitDefinition, LimitState};
use ratelimiter::memory::{MemoryBackend, MemoryConfig};
use ratelimiter::wire::{Actual, CompleteRequest, Denial, Requirement, ReserveOutcome, ReserveRequest};
use ratelimiter::{Backend, FakeClock, LeaseId, LimitKey, Limiter, Period};

/// A budget of $20, in micro-dollars.
const CAPACITY: u64 = 20_000_000;

fn key() -> LimitKey {
    LimitKey::new("tenant:acme:budget:usd_micro").unwrap()
}

async fn backend(clock: &FakeClock, period: Period) -> MemoryBackend {
    let backend = MemoryBackend::new(Arc::new(clock.clone()), MemoryConfig::default());
    let definition = LimitDefinition::per_period(key(), CAPACITY, period).unwrap();
    backend.apply_state(&LimitState::active(definition)).await.unwrap();
    backend
}

async fn reserve_held(backend: &MemoryBackend, lease: LeaseId, amount: u64, hold_ms: Option<u64>) -> ReserveOutcome {
    let requirements = vec![Requirement { key: key(), amount }];
    let request = ReserveRequest::new(lease, None, requirements)
        .unwrap()
        .with_hold_ms(hold_ms)
        .unwrap();
    backend.reserve(&request).await.unwrap()
}

async fn reserve(backend: &MemoryBackend, amount: u64) -> ReserveOutcome {
    reserve_held(backend, LeaseId::generate(), amount, None).await
}

async fn complete(backend: &MemoryBackend, lease: LeaseId, actual_amount: u64) {
    let actuals = vec![Actual {
        key: key(),
        actual_amount,
    }];
    backend
        .complete(&CompleteRequest::new(lease, None, actuals).unwrap())
        .await
        .unwrap();
}

async fn in_use(backend: &MemoryBackend) -> u64 {
    backend.limit_report(&key()).await.unwrap().unwrap().in_use
}

fn granted(outcome: &ReserveOutcome) -> bool {
    matches!(outcome, ReserveOutcome::Allowed { .. })
}

/// `date -u -d <day> +%s` × 1000.
const SAT_2026_11_28: u64 = 1_795_824_000_000;
const MON_2026_11_30: u64 = 1_795_996_800_000;
const TUE_2026_12_01: u64 = 1_796_083_200_000;
const DAY_MS: u64 = 86_400_000;

/// Spends the whole budget shortly after `start`, checks that it stays spent until
/// one millisecond before `boundary` and that the boundary gives it all back.
async fn resets_exactly_at(period: Period, start: u64, boundary: u64) {
    let clock = FakeClock::new(start);
    let backend = backend(&clock, period).await;
    let lease = LeaseId::generate();
    assert!(
        granted(&reserve_held(&backend, lease, CAPACITY, None).await),
        "{period}"
    );
    // Reconciled to less: the difference is free at once, the rest still held to the boundary.
    complete(&backend, lease, CAPACITY - 1_000).await;
    assert_eq!(in_use(&backend).await, CAPACITY - 1_000, "{period}");
    assert!(
        granted(&reserve(&backend, 1_000).await),
        "{period}: the reconciled room"
    );
    clock.advance_ms(boundary - 1 - start);
    assert_eq!(
        reserve(&backend, 1).await,
        ReserveOutcome::Denied(Denial::ExceedsCapacity { key: key() }),
        "{period}: spent until the period ends, and said to be final"
    );
    assert_eq!(
        in_use(&backend).await,
        CAPACITY,
        "{period}: a millisecond before the boundary"
    );
    clock.advance_ms(1);
    assert_eq!(in_use(&backend).await, 0, "{period}: reset at the boundary");
    assert!(
        granted(&reserve(&backend, CAPACITY).await),
        "{period}: the new period's whole budget"
    );
    // A hold made at the boundary belongs to the new period: it lasts all of it.
    let next = period.end_unix_ms(boundary);
    clock.advance_ms(next - 1 - boundary);
    assert_eq!(
        in_use(&backend).await,
        CAPACITY,
        "{period}: held through the new period"
    );
    clock.advance_ms(1);
    assert_eq!(in_use(&backend).await, 0, "{period}: until its end");
}

#[tokio::test]
async fn a_day_budget_resets_at_midnight_utc() {
    resets_exactly_at(Period::Day, SAT_2026_11_28 + 23 * 3_600_000, SAT_2026_11_28 + DAY_MS).await;
}

#[tokio::test]
async fn a_week_budget_resets_on_monday_utc() {
    // From Saturday 06:00 to Monday 00:00: the ISO week.
    resets_exactly_at(Period::Week, SAT_2026_11_28 + 6 * 3_600_000, MON_2026_11_30).await;
}

#[tokio::test]
async fn a_month_budget_resets_on_the_first_utc() {
    resets_exactly_at(Period::Month, SAT_2026_11_28, TUE_2026_12_01).await;
}

#[tokio::test]
async fn only_what_cannot_fit_before_the_period_ends_is_final() {
    let clock = FakeClock::new(SAT_2026_11_28);
    let backend = backend(&clock, Period::Day).await;
    // A hold of its own 10 s ends long before midnight: what waits for it is "not now".
    let paused = reserve_held(&backend, LeaseId::generate(), CAPACITY, Some(10_000)).await;
    assert!(granted(&paused));
    match reserve(&backend, 1).await {
        ReserveOutcome::Denied(Denial::InsufficientCapacity { key: k, retry_after_ms }) => {
            assert_eq!(k, key());
            assert!((10_000..=11_000).contains(&retry_after_ms), "{retry_after_ms}");
        }
        other => panic!("expected a transient denial, got {other:?}"),
    }
    clock.advance_ms(10_000);
    assert!(granted(&reserve(&backend, CAPACITY).await));
    // Now everything is held to midnight: a retry cannot succeed today.
    let denied = LeaseId::generate();
    let never = reserve_held(&backend, denied, 1, None).await;
    assert_eq!(never, ReserveOutcome::Denied(Denial::ExceedsCapacity { key: key() }));
    if let ReserveOutcome::Denied(denial) = &never {
        assert_eq!(denial.retry_after_ms(), 0, "no retry hint");
    }
    assert_eq!(
        reserve_held(&backend, denied, 1, None).await,
        ReserveOutcome::Denied(Denial::LeaseAlreadyFailed),
        "a real attempt: the lease id is burnt, as on TigerBeetle"
    );
}
