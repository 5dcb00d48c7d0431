//! Limits with a calendar period on the memory backend (docs/decisions.md, "Model"),
//! on a fake clock: every hold ends at the period's end in UTC, the limit resets at
//! the boundary and not a millisecond before, a reconciled reservation keeps that
//! end, and a denial is final ("never") only when what completed calls settled
//! leaves no room for the amount; while calls in flight hold the room, it is
//! "not now", with a retry hint.

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
    let last = LeaseId::generate();
    assert!(
        granted(&reserve_held(&backend, last, 1_000, None).await),
        "{period}: the reconciled room"
    );
    assert!(
        matches!(
            reserve(&backend, 1).await,
            ReserveOutcome::Denied(Denial::InsufficientCapacity { .. })
        ),
        "{period}: a call in flight may still free room: not now"
    );
    complete(&backend, last, 1_000).await;
    clock.advance_ms(boundary - 1 - start);
    assert_eq!(
        reserve(&backend, 1).await,
        ReserveOutcome::Denied(Denial::ExceedsCapacity { key: key() }),
        "{period}: settled until the period ends, and said to be final"
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

/// The retry hint of a denial; panics on a grant.
fn retry_hint_ms(outcome: &ReserveOutcome) -> u64 {
    match outcome {
        ReserveOutcome::Denied(denial) => denial.retry_after_ms(),
        ReserveOutcome::Allowed { .. } => panic!("granted"),
    }
}

#[tokio::test]
async fn a_hold_ending_before_the_boundary_makes_a_denial_transient() {
    let clock = FakeClock::new(SAT_2026_11_28);
    let backend = backend(&clock, Period::Day).await;
    // A hold of its own 10 s, completed: settled, but it ends long before midnight.
    let paused = LeaseId::generate();
    assert!(granted(&reserve_held(&backend, paused, CAPACITY, Some(10_000)).await));
    complete(&backend, paused, CAPACITY).await;
    match reserve(&backend, 1).await {
        ReserveOutcome::Denied(Denial::InsufficientCapacity { key: k, retry_after_ms }) => {
            assert_eq!(k, key());
            assert!((10_000..=11_000).contains(&retry_after_ms), "{retry_after_ms}");
        }
        other => panic!("expected a transient denial, got {other:?}"),
    }
    clock.advance_ms(10_000);
    assert!(granted(&reserve(&backend, CAPACITY).await));
}

#[tokio::test]
async fn in_flight_calls_make_a_denial_retryable_and_settled_spend_makes_it_final() {
    let clock = FakeClock::new(SAT_2026_11_28 + 12 * 3_600_000);
    let backend = backend(&clock, Period::Day).await;
    // The whole budget in flight: every unit may come back when the call completes.
    let first = LeaseId::generate();
    assert!(granted(&reserve_held(&backend, first, CAPACITY, None).await));
    let not_now = reserve(&backend, CAPACITY).await;
    assert!(
        matches!(not_now, ReserveOutcome::Denied(Denial::InsufficientCapacity { .. })),
        "{not_now:?}"
    );
    let hint = retry_hint_ms(&not_now);
    assert!(
        (50..=2_025).contains(&hint),
        "retried on the backoff of Completes, not at midnight: {hint}"
    );
    // Completed at a quarter: $5 settled, the rest free at once.
    complete(&backend, first, CAPACITY / 4).await;
    let second = LeaseId::generate();
    assert!(granted(&reserve_held(&backend, second, CAPACITY / 2, None).await));
    // $5 settled, $10 in flight, $5 free: $10 more may come once the call completes.
    let not_now = reserve(&backend, CAPACITY / 2 + 1).await;
    assert!(
        matches!(not_now, ReserveOutcome::Denied(Denial::InsufficientCapacity { .. })),
        "{not_now:?}"
    );
    // Beyond what the settled $5 leaves, whatever the call in flight reports: never.
    let never = reserve(&backend, CAPACITY * 3 / 4 + 1).await;
    assert_eq!(never, ReserveOutcome::Denied(Denial::ExceedsCapacity { key: key() }));
    // Completed without an actual: its whole reservation is settled.
    let no_actual = CompleteRequest::new(second, None, Vec::new()).unwrap();
    backend.complete(&no_actual).await.unwrap();
    let denied = LeaseId::generate();
    let final_answer = reserve_held(&backend, denied, CAPACITY / 4 + 1, None).await;
    assert_eq!(
        final_answer,
        ReserveOutcome::Denied(Denial::ExceedsCapacity { key: key() })
    );
    assert_eq!(retry_hint_ms(&final_answer), 0, "no retry hint");
    assert_eq!(
        reserve_held(&backend, denied, 1, None).await,
        ReserveOutcome::Denied(Denial::LeaseAlreadyFailed),
        "a real attempt: the lease id is burnt, as on TigerBeetle"
    );
    assert!(
        granted(&reserve(&backend, CAPACITY / 4).await),
        "what the settled $15 leaves"
    );
    // Midnight: a new period, nothing settled.
    clock.advance_ms(12 * 3_600_000);
    assert!(granted(&reserve(&backend, CAPACITY).await));
}

#[tokio::test]
async fn a_restored_lease_is_still_in_flight() {
    let clock = FakeClock::new(SAT_2026_11_28);
    let first = backend(&clock, Period::Day).await;
    let lease = LeaseId::generate();
    assert!(granted(&reserve_held(&first, lease, CAPACITY, None).await));
    let snapshot = first.snapshot();
    let second = backend(&clock, Period::Day).await;
    second.restore(&snapshot).unwrap();
    assert!(
        matches!(
            reserve(&second, 1).await,
            ReserveOutcome::Denied(Denial::InsufficientCapacity { .. })
        ),
        "the restored call may still complete below its reservation"
    );
    complete(&second, lease, CAPACITY).await;
    assert_eq!(
        reserve(&second, 1).await,
        ReserveOutcome::Denied(Denial::ExceedsCapacity { key: key() })
    );
}
