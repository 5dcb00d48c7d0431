//! Issue 21 item 4 on TigerBeetle: a Complete of a lease reserved by another
//! process (another server of the fleet, or this one before a restart) whose
//! wall clock stands an hour ahead of or behind the reserving one's. The
//! usage above the reservation is held for exactly the rest of the original
//! window, timed by the cluster's clock: not dropped as if the window were
//! over (an hour ahead: over-admission against the provider's window), not
//! held a whole window from the Complete (an hour behind: capacity idle).
//!
//! Checked on the cluster's own stamps, not by timing: the re-reservation of
//! the overage ends no earlier than the original reservation does, and at
//! most [`EXTRA_HOLD_MAX`] later. The completing server's clock is injected
//! ([`FakeClock`]); the cluster is real.

#![cfg(feature = "tigerbeetle")]

mod tigerbeetle_common;

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ratelimiter::tigerbeetle::{client as tb, ids, SubmitMode, TigerBeetleBackend};
use ratelimiter::{
    Actual, Backend, Clock, CompleteRequest, Denial, FakeClock, LeaseId, LimitDefinition, LimitKey, Limiter,
    ReserveOutcome, SystemClock,
};
use tigerbeetle_common::{backend_with, reserve, reserve_lease, unique_key};

/// The limit's window: long enough that nothing expires during a test.
const WINDOW_SECONDS: u64 = 60;
/// The limit's capacity, all of it used by the lease's actual.
const CAPACITY: u64 = 100;
/// What the lease reserves; the overage is the rest of the capacity.
const RESERVED: u64 = 10;
/// The step between the reserving and the completing clock: an hour, as a
/// time zone or NTP mistake makes.
const STEP_MS: i64 = 3_600_000;
/// Real time between the reserve and the Complete: a Complete that held the
/// overage for a whole window from its own moment would outlast the original
/// window by this much, beyond [`EXTRA_HOLD_MAX`].
const BEFORE_COMPLETE: Duration = Duration::from_secs(4);
/// The most the overage's hold may outlast the original reservation:
/// TigerBeetle's whole-second timeouts (under 1 s), plus the probe's round
/// trip, the drift discount and the moments between the Complete's reading
/// and its chain's commit, generously for a loaded 2-core machine.
const EXTRA_HOLD_MAX: Duration = Duration::from_secs(3);
/// Nanoseconds in a second: TigerBeetle's stamps are ns, its timeouts s.
const NANOS_PER_SECOND: i128 = 1_000_000_000;

/// The wall time now, in ms since the epoch.
fn wall_ms() -> u64 {
    u64::try_from(SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis()).unwrap()
}

/// A clock `step_ms` away from the wall clock, as the completing server's.
fn stepped_clock(step_ms: i64) -> Arc<dyn Clock> {
    Arc::new(FakeClock::new(wall_ms().checked_add_signed(step_ms).unwrap()))
}

/// A rolling limit of [`CAPACITY`] per [`WINDOW_SECONDS`], held to its window
/// exactly (no margin), defined through `backend`.
async fn define(backend: &TigerBeetleBackend, name: &str) -> LimitKey {
    let key = unique_key(name);
    let definition = LimitDefinition::rolling(key.clone(), CAPACITY, WINDOW_SECONDS)
        .unwrap()
        .with_window_margin_ms(Some(0))
        .unwrap();
    backend.apply_definition(&definition).await.unwrap();
    key
}

/// Reserves [`RESERVED`] of `key` on `backend`; the lease.
async fn reserve_some(backend: &TigerBeetleBackend, key: &LimitKey) -> LeaseId {
    let lease = LeaseId::generate();
    let outcome = backend
        .reserve(&reserve_lease(lease, &[(key, RESERVED)]))
        .await
        .unwrap();
    assert!(matches!(outcome, ReserveOutcome::Allowed { .. }), "{outcome:?}");
    lease
}

/// Completes `lease` on `backend` with the whole capacity used.
async fn complete_all_used(backend: &TigerBeetleBackend, lease: LeaseId, key: &LimitKey) {
    let actuals = vec![Actual {
        key: key.clone(),
        actual_amount: CAPACITY,
    }];
    backend
        .complete(&CompleteRequest::new(lease, None, actuals).unwrap())
        .await
        .unwrap();
}

/// How much later than the original reservation of `lease` the overage's
/// re-reservation ends, on the cluster's clock; panics when the overage was
/// not reserved at all (dropped as if the window were over).
async fn extra_hold(lease: LeaseId, key: &LimitKey) -> Duration {
    let client = tb::Client::new(0, tigerbeetle_common::cluster().address()).unwrap();
    let (original, overage) = (ids::reservation_id(lease, 0), ids::rereserve_transfer_id(lease, key));
    let found = client.lookup_transfers(vec![original, overage]).await.unwrap();
    let end_ns = |id: u128| {
        let transfer = found.iter().find(|t| t.id() == id)?;
        Some(i128::from(transfer.as_raw().timestamp) + i128::from(transfer.timeout()) * NANOS_PER_SECOND)
    };
    let original_end = end_ns(original).expect("the original reservation");
    let overage_end = end_ns(overage).expect("the overage was not reserved: dropped as after the window");
    let extra_ns = overage_end - original_end;
    assert!(
        extra_ns >= 0,
        "the overage's hold ends {} ms early",
        -extra_ns / 1_000_000
    );
    Duration::from_nanos(u64::try_from(extra_ns).unwrap())
}

/// The overage of `lease` is held: the whole capacity in use, a further
/// reserve denied, and its hold ends with the original window (within
/// [`EXTRA_HOLD_MAX`]). Returns how much later it ends.
async fn assert_overage_held(backend: &TigerBeetleBackend, lease: LeaseId, key: &LimitKey) -> Duration {
    let extra = extra_hold(lease, key).await;
    assert!(
        extra <= EXTRA_HOLD_MAX,
        "the overage is held {extra:?} beyond the original window (at most {EXTRA_HOLD_MAX:?})"
    );
    assert_eq!(backend.limit_report(key).await.unwrap().unwrap().in_use, CAPACITY);
    let further = backend.reserve(&reserve(&[(key, 1)])).await.unwrap();
    assert!(
        matches!(further, ReserveOutcome::Denied(Denial::InsufficientCapacity { .. })),
        "a further reserve: {further:?}"
    );
    extra
}

/// Reserves on a server on the wall clock; after [`BEFORE_COMPLETE`],
/// completes with an overage on a server whose clock is `step_ms` away:
/// another server of the fleet, or (`restart`) the reserving one restarted
/// (a new backend, its lease cache empty). The overage must be held.
async fn overage_completed_elsewhere(step_ms: i64, restart: bool) {
    let reserving = backend_with(SubmitMode::Batching, Arc::new(SystemClock::new())).await;
    let key = define(&reserving, "clock-step").await;
    let lease = reserve_some(&reserving, &key).await;
    let reserving = if restart {
        drop(reserving);
        None
    } else {
        Some(reserving)
    };
    tokio::time::sleep(BEFORE_COMPLETE).await;
    let completing = backend_with(SubmitMode::Batching, stepped_clock(step_ms)).await;
    completing.refresh_definitions().await.unwrap();
    complete_all_used(&completing, lease, &key).await;
    let extra = assert_overage_held(&completing, lease, &key).await;
    let counters = completing.counters();
    assert_eq!(counters.completes_from_cluster, 1);
    assert_eq!(counters.cluster_clock_probes, 1, "one probe timed the Complete");
    eprintln!(
        "clock {step_ms:+} ms, {}: overage held {extra:?} beyond the original window",
        if reserving.is_some() {
            "another server"
        } else {
            "after a restart"
        }
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_overage_completed_on_a_server_an_hour_ahead_is_held_for_the_rest_of_the_window() {
    overage_completed_elsewhere(STEP_MS, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_overage_completed_on_a_server_an_hour_behind_is_held_no_longer_than_the_window() {
    overage_completed_elsewhere(-STEP_MS, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_overage_completed_after_a_restart_an_hour_ahead_is_held_for_the_rest_of_the_window() {
    overage_completed_elsewhere(STEP_MS, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_overage_completed_after_a_restart_an_hour_behind_is_held_no_longer_than_the_window() {
    overage_completed_elsewhere(-STEP_MS, true).await;
}

/// Completes of many leases reserved elsewhere, at once, on a server that
/// has no reading of the cluster's clock yet: they share one probe, and each
/// overage is held for the rest of its window.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_completes_share_one_probe_of_the_cluster_clock() {
    const LEASES: usize = 8;
    let reserving = backend_with(SubmitMode::Batching, Arc::new(SystemClock::new())).await;
    let completing = Arc::new(backend_with(SubmitMode::Batching, stepped_clock(STEP_MS)).await);
    let mut keys = Vec::new();
    for _ in 0..LEASES {
        let key = define(&reserving, "clock-probe").await;
        let lease = reserve_some(&reserving, &key).await;
        keys.push((key, lease));
    }
    completing.refresh_definitions().await.unwrap();
    let tasks: Vec<_> = (keys.iter().cloned())
        .map(|(key, lease)| {
            let completing = Arc::clone(&completing);
            tokio::spawn(async move { complete_all_used(&completing, lease, &key).await })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(
        completing.counters().cluster_clock_probes,
        1,
        "the Completes shared one probe"
    );
    for (key, lease) in &keys {
        assert_overage_held(&completing, *lease, key).await;
    }
}
