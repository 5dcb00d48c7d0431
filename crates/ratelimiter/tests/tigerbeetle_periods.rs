//! Limits with a calendar period on TigerBeetle (docs/tigerbeetle-backend.md,
//! "Calendar periods"): a reservation's pending timeout runs to the period's end,
//! computed from the server's injected clock; Complete's re-reservation ends there
//! too; a day budget refuses what does not fit as "not now" while calls in flight
//! hold it and as final once completed calls settled it (read from the key's
//! settled account), and resets when the boundary passes, its settled account
//! with it. The server's clock is a [`FakeClock`] set just before a UTC
//! midnight; the cluster is real.

#![cfg(feature = "tigerbeetle")]

mod tigerbeetle_common;

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ratelimiter::tigerbeetle::{client as tb, ids, SubmitMode, TigerBeetleBackend};
use ratelimiter::{Backend, Denial, FakeClock, LeaseId, LimitDefinition, LimitKey, Limiter, Period, ReserveOutcome};
use tigerbeetle_common::{backend_with, complete, in_use, reserve, reserve_lease, unique_key};

/// A budget of $1, in micro-dollars.
const CAPACITY: u64 = 1_000_000;
/// Milliseconds in a day.
const DAY_MS: u64 = 86_400_000;
/// 2026-11-28T00:00:00Z (`date -u -d 2026-11-28 +%s`).
const SAT_2026_11_28_MS: u64 = 1_795_824_000_000;
/// How long after its timeout TigerBeetle may take to expire a pending transfer on a
/// loaded machine: it expires them on its own pulse, not at the exact instant.
const EXPIRY_SLACK: Duration = Duration::from_secs(8);

/// The wall time now, in ms since the epoch.
fn wall_ms() -> u64 {
    u64::try_from(SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis()).unwrap()
}

async fn define(backend: &TigerBeetleBackend, period: Period) -> LimitKey {
    let key = unique_key("budget");
    let definition = LimitDefinition::per_period(key.clone(), CAPACITY, period).unwrap();
    backend.apply_definition(&definition).await.unwrap();
    key
}

/// The pending timeout, in seconds, of the transfer `id`, and when it ends on the
/// cluster's clock (ns).
async fn timeout_of(id: u128) -> (u32, u64) {
    let client = tb::Client::new(0, tigerbeetle_common::cluster().address()).unwrap();
    let found = client.lookup_transfers(vec![id]).await.unwrap();
    let transfer = found.first().expect("the transfer exists");
    let end_ns = transfer.as_raw().timestamp + u64::from(transfer.timeout()) * 1_000_000_000;
    (transfer.timeout(), end_ns)
}

/// What completed calls hold on the period key `key`: its settled account's
/// pending debits.
async fn settled(key: &LimitKey) -> u64 {
    let client = tb::Client::new(0, tigerbeetle_common::cluster().address()).unwrap();
    let found = client
        .lookup_accounts(vec![ids::settled_account_id(key)])
        .await
        .unwrap();
    let account = found.first().expect("a period key has a settled account");
    u64::try_from(account.debits_pending()).unwrap()
}

async fn granted(backend: &TigerBeetleBackend, lease: LeaseId, key: &LimitKey, amount: u64) {
    let outcome = backend.reserve(&reserve_lease(lease, &[(key, amount)])).await.unwrap();
    assert!(matches!(outcome, ReserveOutcome::Allowed { .. }), "{outcome:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_day_budget_is_held_to_midnight_refuses_what_does_not_fit_and_resets() {
    // The server believes it is 3 s before the next UTC midnight.
    let midnight = (wall_ms() / DAY_MS + 1) * DAY_MS;
    let clock = FakeClock::new(midnight - 3_000);
    let backend = backend_with(SubmitMode::Batching, Arc::new(clock.clone())).await;
    let key = define(&backend, Period::Day).await;
    let lease = LeaseId::generate();
    granted(&backend, lease, &key, CAPACITY).await;
    let (timeout, original_end_ns) = timeout_of(ids::reservation_id(lease, 0)).await;
    assert_eq!(timeout, 3, "the seconds to midnight, not a day");

    let not_now = backend.reserve(&reserve(&[(&key, 1)])).await.unwrap();
    assert!(
        matches!(not_now, ReserveOutcome::Denied(Denial::InsufficientCapacity { .. })),
        "the call in flight may complete below its reservation: {not_now:?}"
    );

    // Reconciled to less: the rest is re-reserved to the same end, not a day.
    backend
        .complete(&complete(lease, &[(&key, CAPACITY - 100)]))
        .await
        .unwrap();
    let (retimeout, rereserved_end_ns) = timeout_of(ids::rereserve_transfer_id(lease, &key)).await;
    assert!(retimeout <= 3, "{retimeout}");
    assert!(rereserved_end_ns >= original_end_ns, "never before the original end");
    assert!(
        rereserved_end_ns - original_end_ns < 2_000_000_000,
        "{} ms past the original end",
        (rereserved_end_ns - original_end_ns) / 1_000_000
    );
    assert_eq!(in_use(&backend, &key).await, CAPACITY - 100);
    assert_eq!(settled(&key).await, CAPACITY - 100);
    let last = LeaseId::generate();
    granted(&backend, last, &key, 100).await;
    backend.complete(&complete(last, &[(&key, 100)])).await.unwrap();
    let never = backend.reserve(&reserve(&[(&key, 1)])).await.unwrap();
    assert_eq!(
        never,
        ReserveOutcome::Denied(Denial::ExceedsCapacity { key: key.clone() }),
        "final: completed calls settled the whole day"
    );

    // Midnight passes for the server and the cluster: the budget is whole again,
    // and a reservation of the new day is held for all of it.
    clock.advance_ms(3_000);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(3) + EXPIRY_SLACK;
    while in_use(&backend, &key).await > 0 || settled(&key).await > 0 {
        assert!(tokio::time::Instant::now() < deadline, "the day's holds did not expire");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let next = LeaseId::generate();
    granted(&backend, next, &key, CAPACITY).await;
    assert_eq!(timeout_of(ids::reservation_id(next, 0)).await.0, 86_400, "a whole day");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn week_and_month_holds_time_out_at_their_boundaries() {
    // Saturday 2026-11-28 00:00 UTC: Monday is 2 days away, December 3 days.
    let clock = FakeClock::new(SAT_2026_11_28_MS);
    let backend = backend_with(SubmitMode::Batching, Arc::new(clock)).await;
    for (period, days) in [(Period::Week, 2), (Period::Month, 3), (Period::Day, 1)] {
        let key = define(&backend, period).await;
        let lease = LeaseId::generate();
        granted(&backend, lease, &key, 1).await;
        let (timeout, _) = timeout_of(ids::reservation_id(lease, 0)).await;
        assert_eq!(u64::from(timeout), days * DAY_MS / 1_000, "{period}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_flight_calls_make_a_denial_retryable_and_settled_spend_makes_it_final() {
    // Saturday noon UTC for the server: nothing expires during the test.
    let clock = FakeClock::new(SAT_2026_11_28_MS + DAY_MS / 2);
    let backend = backend_with(SubmitMode::Batching, Arc::new(clock)).await;
    let key = define(&backend, Period::Day).await;
    let first = LeaseId::generate();
    granted(&backend, first, &key, CAPACITY).await;
    match backend.reserve(&reserve(&[(&key, CAPACITY)])).await.unwrap() {
        ReserveOutcome::Denied(Denial::InsufficientCapacity { key: k, retry_after_ms }) => {
            assert_eq!(k, key);
            assert!(
                (50..=2_025).contains(&retry_after_ms),
                "the backoff of Completes, not a window's: {retry_after_ms}"
            );
        }
        other => panic!("expected not now, got {other:?}"),
    }
    // Completed at a quarter: that much settled, the rest free at once.
    backend
        .complete(&complete(first, &[(&key, CAPACITY / 4)]))
        .await
        .unwrap();
    assert_eq!(settled(&key).await, CAPACITY / 4);
    let second = LeaseId::generate();
    granted(&backend, second, &key, CAPACITY / 2).await;
    let not_now = backend.reserve(&reserve(&[(&key, CAPACITY / 2 + 1)])).await.unwrap();
    assert!(
        matches!(not_now, ReserveOutcome::Denied(Denial::InsufficientCapacity { .. })),
        "{not_now:?}"
    );
    let never = backend
        .reserve(&reserve(&[(&key, CAPACITY * 3 / 4 + 1)]))
        .await
        .unwrap();
    assert_eq!(
        never,
        ReserveOutcome::Denied(Denial::ExceedsCapacity { key: key.clone() }),
        "more than the settled quarter leaves, whatever the call in flight reports"
    );
    // Completed without an actual: the whole reservation stays, settled.
    backend.complete(&complete(second, &[])).await.unwrap();
    assert_eq!(settled(&key).await, CAPACITY * 3 / 4);
    let never = backend.reserve(&reserve(&[(&key, CAPACITY / 4 + 1)])).await.unwrap();
    assert_eq!(
        never,
        ReserveOutcome::Denied(Denial::ExceedsCapacity { key: key.clone() })
    );
    // A call above its reservation: the overage is reserved and settled too.
    let third = LeaseId::generate();
    granted(&backend, third, &key, CAPACITY / 8).await;
    backend
        .complete(&complete(third, &[(&key, CAPACITY / 4)]))
        .await
        .unwrap();
    assert_eq!(settled(&key).await, CAPACITY);
    assert_eq!(in_use(&backend, &key).await, CAPACITY);
}
