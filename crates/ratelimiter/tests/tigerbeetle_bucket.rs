//! Token-bucket limits on the TigerBeetle backend against a real local cluster
//! (docs/tigerbeetle-backend.md, "Buckets"; docs/bucket-limits.md): the burst,
//! the exact retry hint, refills timed by the cluster's clock and shared by a
//! fleet, refunds and overage on Complete, and capacity changes.
//!
//! Timing is asserted as bounds, never instants: what a bucket grants over an
//! interval is at most its burst plus the refill of that interval and one slot,
//! whatever the machine's load.

#![cfg(feature = "tigerbeetle")]

mod tigerbeetle_common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ratelimiter::bucket::BucketShape;
use ratelimiter::tigerbeetle::TigerBeetleBackend;
use ratelimiter::{Backend, Denial, LeaseId, LimitDefinition, LimitKey, LimitStatus, Limiter, Overage, ReserveOutcome};
use tigerbeetle_common::{backend, complete, in_use, reserve, reserve_lease, unique_key};

/// The test backends' default margin (tigerbeetle_common::options): 0.
const MARGIN_MS: u64 = 0;
/// A fast bucket: 6,000 units refilled over 3 s, so 100 units per 50 ms slot
/// and a burst of 5,900.
const FAST_CAPACITY: u64 = 6_000;
/// The fast bucket's window.
const FAST_WINDOW_SECONDS: u64 = 3;
/// A slow bucket's window: 31 days (the longest), so its 12.4 h slots pass
/// no boundary during a test and its level moves only by the test's requests.
const SLOW_WINDOW_SECONDS: u64 = 2_678_400;
/// The slow bucket's capacity: 1 unit a second.
const SLOW_CAPACITY: u64 = 2_678_400;
/// How long the fleet test hammers the shared bucket.
const HAMMER: Duration = Duration::from_millis(1_500);
/// Each hammering reservation's units.
const HAMMER_UNITS: u64 = 50;

/// Defines a bucket of `capacity` per `window_seconds` on `backend`; its shape.
async fn define(
    backend: &TigerBeetleBackend,
    name: &str,
    capacity: u64,
    window_seconds: u64,
) -> (LimitKey, BucketShape) {
    let key = unique_key(name);
    let definition = LimitDefinition::bucket(key.clone(), capacity, window_seconds).unwrap();
    backend.apply_definition(&definition).await.unwrap();
    (key, BucketShape::new(&definition, MARGIN_MS).unwrap())
}

async fn granted(backend: &TigerBeetleBackend, key: &LimitKey, units: u64) -> bool {
    backend.reserve(&reserve(&[(key, units)])).await.unwrap().is_allowed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_bucket_grants_its_burst_then_denies_with_the_time_to_the_refill_that_fits() {
    let backend = backend().await;
    let (key, shape) = define(&backend, "burst", FAST_CAPACITY, FAST_WINDOW_SECONDS).await;
    assert_eq!((shape.burst(), shape.slot_ms()), (5_900, 50));
    let over = backend.reserve(&reserve(&[(&key, shape.burst() + 1)])).await.unwrap();
    assert_eq!(
        over,
        ReserveOutcome::Denied(Denial::ExceedsCapacity { key: key.clone() })
    );
    assert!(
        granted(&backend, &key, shape.burst()).await,
        "a full bucket holds its burst"
    );
    // Three slots' refill: the bucket holds it no sooner than three
    // boundaries after the burst was taken, less what refilled meanwhile.
    let wanted = 3 * shape.refill_at(1);
    let denied = backend.reserve(&reserve(&[(&key, wanted)])).await.unwrap();
    let retry_after_ms = match denied {
        ReserveOutcome::Denied(Denial::InsufficientCapacity { retry_after_ms, .. }) => retry_after_ms,
        other => panic!("expected insufficient_capacity, got {other:?}"),
    };
    eprintln!("hint for {wanted} units after the burst: {retry_after_ms} ms");
    // At most the three slots, plus the slot the burst was taken in, plus
    // the drift's stretch and the clock's lag (a few ms).
    assert!(
        (1..=4 * shape.slot_ms() + 20).contains(&retry_after_ms),
        "hint {retry_after_ms} ms"
    );
    // Not too early: once the hint has passed, the units fit.
    tokio::time::sleep(Duration::from_millis(retry_after_ms)).await;
    assert!(
        granted(&backend, &key, wanted).await,
        "denied again after the hint of {retry_after_ms} ms"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_bucket_refills_at_its_rate_and_no_faster() {
    let backend = backend().await;
    let (key, shape) = define(&backend, "refill", FAST_CAPACITY, FAST_WINDOW_SECONDS).await;
    let emptied = Instant::now();
    assert!(granted(&backend, &key, shape.burst()).await);
    let took = Instant::now();
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    let before_report = Instant::now();
    let level = shape.burst() - in_use(&backend, &key).await;
    let after_report = Instant::now();
    // 2 units a ms: at most the refill since before the burst was taken,
    // plus one slot's; at least the refill since it was granted, less two
    // slots (the slot it started in and the cluster clock's lag).
    let per_slot = shape.refill_at(1);
    let rate = |elapsed: Duration| elapsed.as_millis() as u64 * per_slot / shape.slot_ms();
    assert!(
        level <= rate(after_report - emptied) + per_slot,
        "level {level} after {:?}",
        after_report - emptied
    );
    assert!(
        level + 2 * per_slot >= rate(before_report - took),
        "level {level} after {:?}",
        before_report - took
    );
    // What the bucket holds is granted, and then nothing beyond the next refill.
    assert!(granted(&backend, &key, level).await, "the level {level} is granted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_complete_refunds_unused_units_once_and_takes_or_records_the_overage() {
    let backend = backend().await;
    let key = unique_key("refund");
    let definition = LimitDefinition::bucket(key.clone(), SLOW_CAPACITY, SLOW_WINDOW_SECONDS)
        .unwrap()
        .with_overage(Overage::Debt);
    backend.apply_definition(&definition).await.unwrap();
    let burst = BucketShape::new(&definition, MARGIN_MS).unwrap().burst();
    let lease = LeaseId::generate();
    assert!(backend
        .reserve(&reserve_lease(lease, &[(&key, 1_000)]))
        .await
        .unwrap()
        .is_allowed());
    assert_eq!(in_use(&backend, &key).await, 1_000);
    backend.complete(&complete(lease, &[(&key, 400)])).await.unwrap();
    assert_eq!(in_use(&backend, &key).await, 400, "600 units refunded");
    backend.complete(&complete(lease, &[(&key, 400)])).await.unwrap();
    assert_eq!(
        in_use(&backend, &key).await,
        400,
        "a retried Complete refunds nothing more"
    );
    // Another server completes a lease this one reserved: the same refund.
    let other = tigerbeetle_common::backend().await;
    let lease = LeaseId::generate();
    assert!(backend
        .reserve(&reserve_lease(lease, &[(&key, 100)]))
        .await
        .unwrap()
        .is_allowed());
    other.complete(&complete(lease, &[(&key, 30)])).await.unwrap();
    assert_eq!(in_use(&backend, &key).await, 430);
    // Usage above the reservation is taken from the bucket while it holds it.
    let lease = LeaseId::generate();
    assert!(backend
        .reserve(&reserve_lease(lease, &[(&key, 500)]))
        .await
        .unwrap()
        .is_allowed());
    backend.complete(&complete(lease, &[(&key, 900)])).await.unwrap();
    assert_eq!(in_use(&backend, &key).await, 1_330, "the overage of 400 taken");
    // Beyond what the bucket holds, the overage is debt.
    let lease = LeaseId::generate();
    let rest = burst - 1_330;
    assert!(backend
        .reserve(&reserve_lease(lease, &[(&key, rest)]))
        .await
        .unwrap()
        .is_allowed());
    backend.complete(&complete(lease, &[(&key, rest + 77)])).await.unwrap();
    let report = backend.limit_report(&key).await.unwrap().unwrap();
    assert_eq!((report.in_use, report.debt), (burst, 77));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_servers_hammering_one_bucket_grant_no_more_than_its_burst_and_refill() {
    let first = Arc::new(backend().await);
    let second = Arc::new(backend().await);
    let (key, shape) = define(&first, "fleet", FAST_CAPACITY, FAST_WINDOW_SECONDS).await;
    let units = Arc::new(AtomicU64::new(0));
    let defined = Instant::now();
    let mut tasks = Vec::new();
    for backend in [&first, &second, &first, &second] {
        let (backend, key, units) = (Arc::clone(backend), key.clone(), Arc::clone(&units));
        tasks.push(tokio::spawn(async move {
            while defined.elapsed() < HAMMER {
                if backend
                    .reserve(&reserve(&[(&key, HAMMER_UNITS)]))
                    .await
                    .unwrap()
                    .is_allowed()
                {
                    units.fetch_add(HAMMER_UNITS, Ordering::Relaxed);
                }
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let elapsed = defined.elapsed();
    let granted = units.load(Ordering::Relaxed);
    let per_slot = shape.refill_at(1);
    let refill = elapsed.as_millis() as u64 * per_slot / shape.slot_ms();
    eprintln!(
        "fleet: granted {granted} in {elapsed:?}, bound {}",
        shape.burst() + refill + per_slot
    );
    assert!(
        granted <= shape.burst() + refill + per_slot,
        "granted {granted} in {elapsed:?}: burst {} + refill {refill}",
        shape.burst()
    );
    assert!(
        granted >= shape.burst(),
        "the hammer took the burst at least: {granted}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refill_posted_by_two_servers_counts_once() {
    let first = backend().await;
    // 100 units a 1 s slot: two reports a moment apart see the same boundaries.
    let (key, shape) = define(&first, "twice", 6_000, 60).await;
    assert!(granted(&first, &key, shape.burst()).await);
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    let started = Instant::now();
    let seen_first = in_use(&first, &key).await;
    assert!(seen_first < shape.burst(), "a boundary passed: {seen_first}");
    // A fresh server posts the last minute's boundaries: those posted already
    // exist and move nothing again (had they counted, the bucket would be full).
    let second = backend().await;
    let seen_second = in_use(&second, &key).await;
    let passed = started.elapsed().as_millis() as u64 / shape.slot_ms() + 1;
    assert!(
        seen_second + passed * shape.refill_at(1) >= seen_first,
        "first {seen_first}, second {seen_second}"
    );
    assert!(seen_second > 0, "the refills of one minute would have filled it");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decrease_waits_for_the_level_then_takes_the_bursts_difference() {
    let backend = backend().await;
    // 100 units a 1 s slot: the level grows by at most a few hundred during the test.
    let (key, shape) = define(&backend, "decrease", 6_000, 60).await;
    let holder = LeaseId::generate();
    assert!(backend
        .reserve(&reserve_lease(holder, &[(&key, 5_000)]))
        .await
        .unwrap()
        .is_allowed());
    let smaller = LimitDefinition::bucket(key.clone(), 3_000, 60).unwrap();
    let smaller_burst = BucketShape::new(&smaller, MARGIN_MS).unwrap().burst();
    let state = backend.apply_definition(&smaller).await.unwrap();
    assert_eq!(state.status(), LimitStatus::Decreasing);
    // The level (about 900) is below the bursts' difference (2,950): it waits.
    assert!(backend.apply_pending_decreases().await.unwrap().is_empty());
    assert!(matches!(
        backend.reserve(&reserve(&[(&key, 1)])).await.unwrap(),
        ReserveOutcome::Denied(Denial::LimitDecreasing { .. })
    ));
    backend.complete(&complete(holder, &[(&key, 0)])).await.unwrap();
    let applied = backend.apply_pending_decreases().await.unwrap();
    assert_eq!(applied.len(), 1);
    assert_eq!(applied[0].definition().capacity(), 3_000);
    assert_eq!(in_use(&backend, &key).await, 0, "a full bucket of the smaller burst");
    let over = backend.reserve(&reserve(&[(&key, smaller_burst + 1)])).await.unwrap();
    assert_eq!(
        over,
        ReserveOutcome::Denied(Denial::ExceedsCapacity { key: key.clone() })
    );
    assert!(granted(&backend, &key, smaller_burst).await);
    assert!(!granted(&backend, &key, shape.refill_at(1) * 3).await, "empty");
    // An increase grows the level by the bursts' difference at once.
    let larger = LimitDefinition::bucket(key.clone(), 6_000, 60).unwrap();
    backend.apply_definition(&larger).await.unwrap();
    assert!(granted(&backend, &key, shape.burst() - smaller_burst).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_longer_margin_at_the_same_capacity_shrinks_the_burst_at_once() {
    let backend = backend().await;
    let key = unique_key("shrink");
    let tight = LimitDefinition::bucket(key.clone(), SLOW_CAPACITY, SLOW_WINDOW_SECONDS)
        .unwrap()
        .with_window_margin_ms(Some(0))
        .unwrap();
    backend.apply_definition(&tight).await.unwrap();
    let burst = BucketShape::new(&tight, MARGIN_MS).unwrap().burst();
    assert!(granted(&backend, &key, 1_000).await);
    // A minute's margin at 1 unit a second: the burst falls by 60, the
    // capacity stays, so the state is active at once.
    let loose = tight.with_window_margin_ms(Some(60_000)).unwrap();
    let state = backend.apply_definition(&loose).await.unwrap();
    assert_eq!(state.status(), LimitStatus::Active);
    let smaller = BucketShape::new(&loose, MARGIN_MS).unwrap().burst();
    assert_eq!(burst - smaller, 60);
    assert_eq!(in_use(&backend, &key).await, 1_000, "the level gave up the difference");
    assert!(granted(&backend, &key, smaller - 1_000).await);
    assert!(!granted(&backend, &key, 1).await, "no more than the smaller burst");
    // An empty bucket gives the difference up from its taken units.
    let state = backend.apply_definition(&tight).await.unwrap();
    assert_eq!(state.status(), LimitStatus::Active);
    assert!(granted(&backend, &key, burst - smaller).await, "the burst's growth");
    backend.apply_definition(&loose).await.unwrap();
    assert_eq!(in_use(&backend, &key).await, smaller, "empty, at the smaller burst");
    assert!(!granted(&backend, &key, 1).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pause_on_a_bucket_refunds_within_its_own_hold_and_not_after() {
    let backend = backend().await;
    let key = unique_key("pause");
    let definition = LimitDefinition::bucket(key.clone(), SLOW_CAPACITY, SLOW_WINDOW_SECONDS).unwrap();
    backend.apply_definition(&definition).await.unwrap();
    let pause = |lease| {
        reserve_lease(lease, &[(&key, 1_000)])
            .with_hold_ms(Some(1_000))
            .unwrap()
    };
    let released = LeaseId::generate();
    assert!(backend.reserve(&pause(released)).await.unwrap().is_allowed());
    backend.complete(&complete(released, &[(&key, 0)])).await.unwrap();
    assert_eq!(in_use(&backend, &key).await, 0, "released within its hold: refunded");
    let ended = LeaseId::generate();
    assert!(backend.reserve(&pause(ended)).await.unwrap().is_allowed());
    // The hold's 1 s is over (TigerBeetle's whole seconds), the month's window is not.
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    backend.complete(&complete(ended, &[(&key, 0)])).await.unwrap();
    assert_eq!(
        in_use(&backend, &key).await,
        1_000,
        "after its hold: nothing given back"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_on_a_bucket_and_a_rolling_limit_takes_both_or_neither() {
    let backend = backend().await;
    let key = unique_key("mixed-bucket");
    let definition = LimitDefinition::bucket(key.clone(), SLOW_CAPACITY, SLOW_WINDOW_SECONDS).unwrap();
    backend.apply_definition(&definition).await.unwrap();
    let burst = BucketShape::new(&definition, MARGIN_MS).unwrap().burst();
    let rpm = unique_key("mixed-rolling");
    backend
        .apply_definition(&LimitDefinition::rolling(rpm.clone(), 2, 60).unwrap())
        .await
        .unwrap();
    assert!(backend
        .reserve(&reserve(&[(&rpm, 1), (&key, 1_000)]))
        .await
        .unwrap()
        .is_allowed());
    // The bucket is short: the rolling limit keeps its unit.
    let short = backend.reserve(&reserve(&[(&rpm, 1), (&key, burst)])).await.unwrap();
    assert!(
        matches!(&short, ReserveOutcome::Denied(Denial::InsufficientCapacity { key: denied, .. }) if denied == &key),
        "{short:?}"
    );
    assert_eq!(in_use(&backend, &rpm).await, 1);
    // The rolling limit is short: the bucket gives nothing.
    assert!(backend.reserve(&reserve(&[(&rpm, 1)])).await.unwrap().is_allowed());
    let full = backend.reserve(&reserve(&[(&key, 500), (&rpm, 1)])).await.unwrap();
    assert!(!full.is_allowed(), "{full:?}");
    assert_eq!(in_use(&backend, &key).await, 1_000);
}
