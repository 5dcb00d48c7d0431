//! The TigerBeetle backend against a real local cluster: its rows of docs/testing.md,
//! "Test checklist", and the decisions of docs/decisions.md and
//! docs/tigerbeetle-backend.md, "Result codes".

#![cfg(feature = "tigerbeetle")]

mod tigerbeetle_common;

use std::sync::Arc;

use ratelimiter::tigerbeetle::SubmitMode;
use ratelimiter::{
    Backend, Denial, FakeClock, LeaseId, LimitDefinition, LimitState, LimitStatus, Limiter, LimiterError, Overage,
    ReserveOutcome, SystemClock,
};
use tigerbeetle_common::{
    backend, backend_on, backend_with, complete, config_with, in_use, reserve, reserve_lease, unique_key,
};

fn denial(outcome: ReserveOutcome) -> Denial {
    match outcome {
        ReserveOutcome::Denied(denial) => denial,
        other => panic!("expected a denial, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reserves_up_to_capacity_and_denies_beyond() {
    let backend = backend().await;
    let key = unique_key("capacity");
    backend
        .apply_definition(&LimitDefinition::rolling(key.clone(), 2, 60).unwrap())
        .await
        .unwrap();
    assert!(backend.reserve(&reserve(&[(&key, 1)])).await.unwrap().is_allowed());
    assert!(backend.reserve(&reserve(&[(&key, 1)])).await.unwrap().is_allowed());
    match denial(backend.reserve(&reserve(&[(&key, 1)])).await.unwrap()) {
        Denial::InsufficientCapacity { key: k, retry_after_ms } => {
            assert_eq!(k, key);
            assert!(retry_after_ms > 0);
        }
        other => panic!("unexpected {other:?}"),
    }
    assert_eq!(in_use(&backend, &key).await, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn same_lease_after_denial_stays_denied() {
    let backend = backend().await;
    let key = unique_key("denied");
    backend
        .apply_definition(&LimitDefinition::rolling(key.clone(), 2, 60).unwrap())
        .await
        .unwrap();
    assert!(backend.reserve(&reserve(&[(&key, 2)])).await.unwrap().is_allowed());
    let lease = LeaseId::generate();
    let request = reserve_lease(lease, &[(&key, 1)]);
    assert!(matches!(
        denial(backend.reserve(&request).await.unwrap()),
        Denial::InsufficientCapacity { .. }
    ));
    // Capacity is freed by raising it: the same lease still fails, a new one passes.
    backend
        .apply_definition(&LimitDefinition::rolling(key.clone(), 10, 60).unwrap())
        .await
        .unwrap();
    assert_eq!(
        denial(backend.reserve(&request).await.unwrap()),
        Denial::LeaseAlreadyFailed
    );
    assert!(backend.reserve(&reserve(&[(&key, 1)])).await.unwrap().is_allowed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn linked_requirements_are_all_or_nothing() {
    let backend = backend().await;
    let (tokens, slots) = (unique_key("tokens"), unique_key("slots"));
    backend
        .apply_definition(&LimitDefinition::rolling(tokens.clone(), 100, 60).unwrap())
        .await
        .unwrap();
    backend
        .apply_definition(&LimitDefinition::concurrency(slots.clone(), 1, 60).unwrap())
        .await
        .unwrap();
    assert!(backend
        .reserve(&reserve(&[(&tokens, 30), (&slots, 1)]))
        .await
        .unwrap()
        .is_allowed());
    let denied = denial(backend.reserve(&reserve(&[(&tokens, 30), (&slots, 1)])).await.unwrap());
    assert!(matches!(denied, Denial::InsufficientCapacity { ref key, .. } if *key == slots));
    // The tokens transfer of the denied chain was rolled back with it.
    assert_eq!(in_use(&backend, &tokens).await, 30);
    assert_eq!(in_use(&backend, &slots).await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrency_is_released_by_complete() {
    let backend = backend().await;
    let slots = unique_key("release");
    backend
        .apply_definition(&LimitDefinition::concurrency(slots.clone(), 1, 300).unwrap())
        .await
        .unwrap();
    let first = LeaseId::generate();
    assert!(backend
        .reserve(&reserve_lease(first, &[(&slots, 1)]))
        .await
        .unwrap()
        .is_allowed());
    assert!(!backend.reserve(&reserve(&[(&slots, 1)])).await.unwrap().is_allowed());
    backend.complete(&complete(first, &[])).await.unwrap();
    assert_eq!(in_use(&backend, &slots).await, 0);
    // Complete is idempotent: a second one changes nothing.
    backend.complete(&complete(first, &[])).await.unwrap();
    assert!(backend.reserve(&reserve(&[(&slots, 1)])).await.unwrap().is_allowed());
    assert_eq!(in_use(&backend, &slots).await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_granted_lease_is_granted_again_without_reserving_more() {
    let clock = Arc::new(FakeClock::new(1_700_000_000_000));
    let backend = backend_with(SubmitMode::Batching, clock.clone()).await;
    let key = unique_key("idempotent");
    backend
        .apply_definition(&LimitDefinition::rolling(key.clone(), 5, 60).unwrap())
        .await
        .unwrap();
    let lease = LeaseId::generate();
    let request = reserve_lease(lease, &[(&key, 3)]);
    let first = backend.reserve(&request).await.unwrap();
    clock.advance_ms(1_500);
    assert_eq!(backend.reserve(&request).await.unwrap(), first);
    assert_eq!(in_use(&backend, &key).await, 3);
    // Another server (or this one restarted), with another clock, knows the
    // key from the cluster, finds the chain there and answers the original time.
    let other = backend_with(SubmitMode::Direct, Arc::new(SystemClock::new())).await;
    assert_eq!(other.reserve(&request).await.unwrap(), first);
    assert_eq!(in_use(&other, &key).await, 3);
    // The same lease id with other requirements is a conflict.
    let changed = reserve_lease(lease, &[(&key, 4)]);
    assert!(matches!(
        backend.reserve(&changed).await,
        Err(LimiterError::Conflict(_))
    ));
    assert!(matches!(other.reserve(&changed).await, Err(LimiterError::Conflict(_))));
    assert_eq!(in_use(&other, &key).await, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconciliation_frees_unused_tokens_at_once() {
    let backend = backend().await;
    let tpm = unique_key("tpm");
    backend
        .apply_definition(&LimitDefinition::rolling(tpm.clone(), 100, 60).unwrap())
        .await
        .unwrap();
    let lease = LeaseId::generate();
    assert!(backend
        .reserve(&reserve_lease(lease, &[(&tpm, 100)]))
        .await
        .unwrap()
        .is_allowed());
    assert!(!backend.reserve(&reserve(&[(&tpm, 90)])).await.unwrap().is_allowed());
    backend.complete(&complete(lease, &[(&tpm, 10)])).await.unwrap();
    assert_eq!(in_use(&backend, &tpm).await, 10);
    assert!(backend.reserve(&reserve(&[(&tpm, 90)])).await.unwrap().is_allowed());
    assert!(!backend.reserve(&reserve(&[(&tpm, 1)])).await.unwrap().is_allowed());
    // A zero actual releases everything the lease held.
    let empty = LeaseId::generate();
    let other = unique_key("tpm-zero");
    backend
        .apply_definition(&LimitDefinition::rolling(other.clone(), 10, 60).unwrap())
        .await
        .unwrap();
    assert!(backend
        .reserve(&reserve_lease(empty, &[(&other, 10)]))
        .await
        .unwrap()
        .is_allowed());
    backend.complete(&complete(empty, &[(&other, 0)])).await.unwrap();
    assert_eq!(in_use(&backend, &other).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overage_is_reserved_or_recorded_as_debt() {
    let backend = backend().await;
    let budget = unique_key("budget");
    let definition = LimitDefinition::rolling(budget.clone(), 100, 60)
        .unwrap()
        .with_overage(Overage::Debt);
    backend.apply_definition(&definition).await.unwrap();
    let (a, b) = (LeaseId::generate(), LeaseId::generate());
    assert!(backend
        .reserve(&reserve_lease(a, &[(&budget, 50)]))
        .await
        .unwrap()
        .is_allowed());
    // Room left: the overage is reserved.
    backend.complete(&complete(a, &[(&budget, 70)])).await.unwrap();
    assert_eq!(in_use(&backend, &budget).await, 70);
    assert!(backend
        .reserve(&reserve_lease(b, &[(&budget, 30)]))
        .await
        .unwrap()
        .is_allowed());
    // No room: the overage becomes debt, once.
    let owed = backend.counters().overage_debt_units;
    backend.complete(&complete(b, &[(&budget, 45)])).await.unwrap();
    let report = backend.limit_report(&budget).await.unwrap().unwrap();
    assert_eq!((report.in_use, report.debt), (100, 15));
    backend.complete(&complete(b, &[(&budget, 45)])).await.unwrap();
    assert_eq!(backend.limit_report(&budget).await.unwrap().unwrap().debt, 15);
    assert_eq!(backend.counters().overage_debt_units - owed, 15, "debt is counted once");

    let plain = unique_key("plain");
    backend
        .apply_definition(&LimitDefinition::rolling(plain.clone(), 10, 60).unwrap())
        .await
        .unwrap();
    let c = LeaseId::generate();
    assert!(backend
        .reserve(&reserve_lease(c, &[(&plain, 10)]))
        .await
        .unwrap()
        .is_allowed());
    let dropped = backend.overage_dropped_units();
    backend.complete(&complete(c, &[(&plain, 13)])).await.unwrap();
    assert_eq!(backend.overage_dropped_units() - dropped, 3);
    let report = backend.limit_report(&plain).await.unwrap().unwrap();
    assert_eq!((report.in_use, report.debt), (10, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decrease_waits_for_usage_above_the_target() {
    let backend = backend().await;
    let slots = unique_key("decrease");
    backend
        .apply_definition(&LimitDefinition::concurrency(slots.clone(), 10, 300).unwrap())
        .await
        .unwrap();
    let holder = LeaseId::generate();
    assert!(backend
        .reserve(&reserve_lease(holder, &[(&slots, 8)]))
        .await
        .unwrap()
        .is_allowed());
    let state = backend
        .apply_definition(&LimitDefinition::concurrency(slots.clone(), 5, 300).unwrap())
        .await
        .unwrap();
    assert_eq!(
        (state.status(), state.pending_decrease_to()),
        (LimitStatus::Decreasing, 5)
    );
    assert!(matches!(
        denial(backend.reserve(&reserve(&[(&slots, 1)])).await.unwrap()),
        Denial::LimitDecreasing {
            retry_after_ms: 10_000,
            ..
        }
    ));
    assert!(backend.apply_pending_decreases().await.unwrap().is_empty());
    backend.complete(&complete(holder, &[])).await.unwrap();
    let applied = backend.apply_pending_decreases().await.unwrap();
    assert_eq!(applied.len(), 1);
    assert_eq!(applied[0].definition().capacity(), 5);
    assert_eq!(applied[0].status(), LimitStatus::Active);
    assert!(matches!(
        denial(backend.reserve(&reserve(&[(&slots, 6)])).await.unwrap()),
        Denial::ExceedsCapacity { .. }
    ));
    assert!(backend.reserve(&reserve(&[(&slots, 5)])).await.unwrap().is_allowed());
    assert!(!backend.reserve(&reserve(&[(&slots, 1)])).await.unwrap().is_allowed());
    // An increase is immediate.
    backend
        .apply_definition(&LimitDefinition::concurrency(slots.clone(), 6, 300).unwrap())
        .await
        .unwrap();
    assert!(backend.reserve(&reserve(&[(&slots, 1)])).await.unwrap().is_allowed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn applying_a_state_again_after_a_restart_changes_nothing() {
    let key = unique_key("restart");
    let state = LimitState::active(LimitDefinition::rolling(key.clone(), 3, 60).unwrap());
    let first = backend().await;
    first.apply_state(&state).await.unwrap();
    first.apply_state(&state).await.unwrap();
    assert!(first.reserve(&reserve(&[(&key, 2)])).await.unwrap().is_allowed());
    drop(first);
    let second = backend().await;
    second.apply_state(&state).await.unwrap();
    let report = second.limit_report(&key).await.unwrap().unwrap();
    assert_eq!((report.state.definition().capacity(), report.in_use), (3, 2));
    assert!(second.reserve(&reserve(&[(&key, 1)])).await.unwrap().is_allowed());
    assert!(!second.reserve(&reserve(&[(&key, 1)])).await.unwrap().is_allowed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decrease_applied_before_a_crash_is_not_applied_twice() {
    let key = unique_key("crash");
    let active = LimitState::active(LimitDefinition::rolling(key.clone(), 3, 60).unwrap());
    let decreasing =
        LimitState::after_definition(Some(&active), LimitDefinition::rolling(key.clone(), 1, 60).unwrap()).unwrap();
    let first = backend().await;
    first.apply_state(&active).await.unwrap();
    first.apply_state(&decreasing).await.unwrap();
    assert_eq!(first.apply_pending_decreases().await.unwrap().len(), 1);
    drop(first);
    // A server started afresh reads the carried-out decrease from the cluster
    // and finds nothing left to carry out.
    let second = backend().await;
    assert!(second.apply_pending_decreases().await.unwrap().is_empty());
    let report = second.limit_report(&key).await.unwrap().unwrap();
    assert_eq!(
        (report.state.status(), report.state.definition().capacity()),
        (LimitStatus::Active, 1)
    );
    assert!(second.reserve(&reserve(&[(&key, 1)])).await.unwrap().is_allowed());
    assert!(!second.reserve(&reserve(&[(&key, 1)])).await.unwrap().is_allowed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_change_nothing() {
    let backend = backend().await;
    let key = unique_key("bad");
    let missing = unique_key("missing");
    backend
        .apply_definition(&LimitDefinition::rolling(key.clone(), 5, 60).unwrap())
        .await
        .unwrap();
    assert_eq!(
        backend.reserve(&reserve(&[(&key, 1), (&missing, 1)])).await,
        Err(LimiterError::UnknownKey(missing.clone()))
    );
    let lease = LeaseId::generate();
    let request = reserve_lease(lease, &[(&key, 6)]);
    assert_eq!(
        denial(backend.reserve(&request).await.unwrap()),
        Denial::ExceedsCapacity { key: key.clone() }
    );
    // Nothing reached TigerBeetle, so the lease id is not burned.
    assert!(backend
        .reserve(&reserve_lease(lease, &[(&key, 1)]))
        .await
        .unwrap()
        .is_allowed());
    assert_eq!(in_use(&backend, &key).await, 1);
    let granted = LeaseId::generate();
    assert!(backend
        .reserve(&reserve_lease(granted, &[(&key, 2)]))
        .await
        .unwrap()
        .is_allowed());
    assert!(matches!(
        backend.complete(&complete(granted, &[(&missing, 1)])).await,
        Err(LimiterError::InvalidRequest(_))
    ));
    assert_eq!(in_use(&backend, &key).await, 3);
    backend
        .complete(&complete(LeaseId::generate(), &[(&key, 1)]))
        .await
        .unwrap();
    let kind_change = LimitDefinition::concurrency(key.clone(), 5, 60).unwrap();
    assert!(matches!(
        backend.apply_definition(&kind_change).await,
        Err(LimiterError::Conflict(_))
    ));
    assert!(backend.limit_report(&missing).await.unwrap().is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_reserves_never_over_admit_in_either_mode() {
    for mode in [SubmitMode::Batching, SubmitMode::Direct] {
        let backend = Arc::new(backend_with(mode, Arc::new(SystemClock::new())).await);
        let key = unique_key("race");
        backend
            .apply_definition(&LimitDefinition::rolling(key.clone(), 37, 60).unwrap())
            .await
            .unwrap();
        let tasks: Vec<_> = (0..200)
            .map(|_| {
                let (backend, key) = (backend.clone(), key.clone());
                tokio::spawn(async move { backend.reserve(&reserve(&[(&key, 1)])).await.unwrap().is_allowed() })
            })
            .collect();
        let mut allowed = 0;
        for task in tasks {
            allowed += u64::from(task.await.unwrap());
        }
        assert_eq!(allowed, 37, "{mode:?}");
        assert_eq!(in_use(backend.as_ref(), &key).await, 37);
    }
}

/// With one session the submitter holds the only slot whenever a batch is out:
/// the lookup of a lease granted elsewhere waits for the slot instead of
/// answering 503 while reservations keep the session busy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_lease_is_looked_up_while_the_only_session_is_busy() {
    let first = backend().await;
    let key = unique_key("one-session");
    first
        .apply_definition(&LimitDefinition::rolling(key.clone(), 1_000_000, 60).unwrap())
        .await
        .unwrap();
    let granted: Vec<LeaseId> = (0..20).map(|_| LeaseId::generate()).collect();
    for lease in &granted {
        assert!(first
            .reserve(&reserve_lease(*lease, &[(&key, 1)]))
            .await
            .unwrap()
            .is_allowed());
    }
    let config = config_with(SubmitMode::Batching, 1);
    let other = Arc::new(backend_on(&config, Arc::new(SystemClock::new())).await);
    let state = first.limit_report(&key).await.unwrap().unwrap().state;
    other.apply_state(&state).await.unwrap();
    let spawn_reserve = |lease: LeaseId| {
        let (other, key) = (other.clone(), key.clone());
        tokio::spawn(async move { other.reserve(&reserve_lease(lease, &[(&key, 1)])).await })
    };
    let fresh: Vec<_> = (0..300).map(|_| spawn_reserve(LeaseId::generate())).collect();
    let retried: Vec<_> = granted.iter().map(|lease| spawn_reserve(*lease)).collect();
    for task in retried.into_iter().chain(fresh) {
        let outcome = task.await.unwrap();
        assert!(matches!(outcome, Ok(ReserveOutcome::Allowed { .. })), "{outcome:?}");
    }
    assert_eq!(in_use(other.as_ref(), &key).await, 320);
}

/// `next_release_ms` of `key` on both backends; they agree within `slack_ms`
/// (TigerBeetle's timeouts are whole seconds from the cluster's timestamp).
async fn next_release_both(
    tb: &impl Backend,
    memory: &impl Backend,
    key: &ratelimiter::LimitKey,
    slack_ms: u64,
) -> Option<u64> {
    let on_tb = tb.next_release_ms(key).await.unwrap();
    let on_memory = memory.next_release_ms(key).await.unwrap();
    match (on_tb, on_memory) {
        (Some(a), Some(b)) => assert!(a.abs_diff(b) <= slack_ms, "TigerBeetle {a} ms, memory {b} ms"),
        (a, b) => assert_eq!(a, b, "both hold something, or neither"),
    }
    on_tb
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_next_release_is_the_first_hold_still_held_as_on_memory() {
    let tb = backend().await;
    let memory = ratelimiter::memory::MemoryBackend::new(Arc::new(SystemClock::new()), Default::default());
    let key = unique_key("next-release-concurrency");
    let definition = LimitDefinition::concurrency(key.clone(), 10, 30).unwrap();
    tb.apply_definition(&definition).await.unwrap();
    memory.apply_definition(&definition).await.unwrap();
    assert_eq!(next_release_both(&tb, &memory, &key, 0).await, None, "nothing held");
    let (first, second) = (LeaseId::generate(), LeaseId::generate());
    for backend in [&tb as &dyn Backend, &memory] {
        assert!(backend
            .reserve(&reserve_lease(first, &[(&key, 1)]))
            .await
            .unwrap()
            .is_allowed());
    }
    tokio::time::sleep(std::time::Duration::from_millis(2_500)).await;
    for backend in [&tb as &dyn Backend, &memory] {
        assert!(backend
            .reserve(&reserve_lease(second, &[(&key, 1)]))
            .await
            .unwrap()
            .is_allowed());
    }
    let first_end = next_release_both(&tb, &memory, &key, 1_500).await.expect("two holds");
    assert!(
        (25_000..=28_000).contains(&first_end),
        "the first hold's end: {first_end} ms"
    );
    // The first hold voided by its Complete: the second's end is next.
    for backend in [&tb as &dyn Backend, &memory] {
        backend.complete(&complete(first, &[])).await.unwrap();
    }
    let second_end = next_release_both(&tb, &memory, &key, 1_500).await.expect("one hold");
    assert!(
        (28_000..=30_000).contains(&second_end),
        "the second hold's end: {second_end} ms"
    );
    for backend in [&tb as &dyn Backend, &memory] {
        backend.complete(&complete(second, &[])).await.unwrap();
    }
    assert_eq!(next_release_both(&tb, &memory, &key, 0).await, None, "all released");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_next_release_of_a_shrunk_rolling_hold_is_its_re_reservation() {
    let tb = backend().await;
    let key = unique_key("next-release-rolling");
    tb.apply_definition(&LimitDefinition::rolling(key.clone(), 100, 60).unwrap())
        .await
        .unwrap();
    let lease = LeaseId::generate();
    assert!(tb
        .reserve(&reserve_lease(lease, &[(&key, 10)]))
        .await
        .unwrap()
        .is_allowed());
    let held = tb.next_release_ms(&key).await.unwrap().expect("held");
    assert!((58_000..=60_000).contains(&held), "the window's end: {held} ms");
    // Complete with less voids the reservation and re-reserves the actual to the window's end.
    tb.complete(&complete(lease, &[(&key, 4)])).await.unwrap();
    assert_eq!(in_use(&tb, &key).await, 4);
    let rereserved = tb
        .next_release_ms(&key)
        .await
        .unwrap()
        .expect("the re-reservation holds");
    assert!(
        (57_000..=61_000).contains(&rereserved),
        "the re-reservation's end: {rereserved} ms"
    );
}

/// `count` holds of one unit on `key`, each reserved and then released: a
/// reservation and its void, two debits of the key's account.
async fn reserve_and_release(tb: &impl Limiter, key: &ratelimiter::LimitKey, count: usize) {
    for _ in 0..count {
        let lease = LeaseId::generate();
        assert!(tb
            .reserve(&reserve_lease(lease, &[(key, 1)]))
            .await
            .unwrap()
            .is_allowed());
        tb.complete(&complete(lease, &[])).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_next_release_is_found_past_a_page_of_released_holds() {
    let tb = backend().await;
    let key = unique_key("next-release-pages");
    tb.apply_definition(&LimitDefinition::concurrency(key.clone(), 10, 60).unwrap())
        .await
        .unwrap();
    // The oldest hold still held, then more reservations and voids than one
    // page of the key's debits holds, then a newer hold.
    assert!(tb.reserve(&reserve(&[(&key, 1)])).await.unwrap().is_allowed());
    tokio::time::sleep(std::time::Duration::from_millis(2_500)).await;
    let released = ratelimiter::tigerbeetle::NEXT_RELEASE_PAGE_TRANSFERS as usize / 2 + 10;
    reserve_and_release(&tb, &key, released).await;
    assert!(tb.reserve(&reserve(&[(&key, 1)])).await.unwrap().is_allowed());
    let end = tb.next_release_ms(&key).await.unwrap().expect("two holds");
    assert!(
        end <= 57_900,
        "the oldest hold's end, a page back, not the newest's: {end} ms"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hold_behind_more_than_the_pages_read_is_answered_with_a_bound() {
    use ratelimiter::tigerbeetle::{NEXT_RELEASE_PAGES_MAX, NEXT_RELEASE_PAGE_TRANSFERS};
    let tb = backend().await;
    let key = unique_key("next-release-bound");
    tb.apply_definition(&LimitDefinition::concurrency(key.clone(), 10, 60).unwrap())
        .await
        .unwrap();
    assert!(tb.reserve(&reserve(&[(&key, 1)])).await.unwrap().is_allowed());
    let first_end = tb.next_release_ms(&key).await.unwrap().expect("held");
    let asked = std::time::Instant::now();
    // Every page the read may take is filled with reservations and their voids.
    let released = NEXT_RELEASE_PAGES_MAX * NEXT_RELEASE_PAGE_TRANSFERS as usize / 2 + 10;
    reserve_and_release(&tb, &key, released).await;
    let bound = tb
        .next_release_ms(&key)
        .await
        .unwrap()
        .expect("something is held: never None");
    assert!(bound <= 60_000, "within the key's timeout: {bound} ms");
    let truth = first_end.saturating_sub(asked.elapsed().as_millis() as u64);
    assert!(
        bound + 1_000 >= truth,
        "late, never early: {bound} ms against {truth} ms"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_next_release_of_a_bucket_is_its_next_refill() {
    let tb = backend().await;
    let key = unique_key("next-release-bucket");
    // 6,000 units over 3 s: 100 units every 50 ms slot.
    tb.apply_definition(&LimitDefinition::bucket(key.clone(), 6_000, 3).unwrap())
        .await
        .unwrap();
    assert_eq!(
        tb.next_release_ms(&key).await.unwrap(),
        None,
        "a full bucket holds nothing"
    );
    assert!(tb.reserve(&reserve(&[(&key, 500)])).await.unwrap().is_allowed());
    let refill = tb.next_release_ms(&key).await.unwrap().expect("units out");
    assert!(
        (1..=200).contains(&refill),
        "within a slot and the clock's lag: {refill} ms"
    );
}
