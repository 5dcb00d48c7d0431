//! The scenarios of the behaviour suite, one public function each.

use crate::base::id::LeaseId;
use crate::feedback::pause::Pause;
use crate::model::definition::{LimitDefinition, LimitStatus, Overage};
use crate::model::error::LimiterError;
use crate::model::key::LimitKey;
use crate::model::wire::{Denial, ReserveOutcome};

use super::{Fixture, Harness};

/// Asserts `outcome` is allowed and returns its reservation time.
pub fn assert_allowed(context: &str, outcome: &ReserveOutcome) -> u64 {
    match outcome {
        ReserveOutcome::Allowed { reserved_at_unix_ms } => *reserved_at_unix_ms,
        ReserveOutcome::Denied(denial) => panic!("{context}: expected allowed, got {denial:?}"),
    }
}

/// Asserts `outcome` is denied for lack of capacity on `key`, with a hint > 0;
/// returns the hint.
pub fn assert_insufficient(context: &str, outcome: &ReserveOutcome, key: &LimitKey) -> u64 {
    match outcome {
        ReserveOutcome::Denied(Denial::InsufficientCapacity {
            key: denied,
            retry_after_ms,
        }) => {
            assert_eq!(denied, key, "{context}: the failing key");
            assert!(*retry_after_ms > 0, "{context}: a not-now denial has a hint > 0");
            *retry_after_ms
        }
        other => panic!("{context}: expected insufficient_capacity:{key}, got {other:?}"),
    }
}

/// Asserts `outcome` is exactly `denial`.
pub fn assert_denied(context: &str, outcome: &ReserveOutcome, denial: Denial) {
    assert_eq!(outcome, &ReserveOutcome::Denied(denial), "{context}");
}

/// Prototype 1 (docs/testing.md, "Prototypes"): capacity 2, three leases: two allowed,
/// one denied; the denied lease stays denied, even after the window; a new lease after
/// the window is allowed.
pub async fn prototype_1_lease_ids(h: &dyn Harness) {
    let f = Fixture::new(h).await;
    let rpm = f.rolling("rpm", 2, 1).await;
    assert_allowed("first lease", &f.reserve_new(&[(&rpm, 1)]).await.1);
    assert_allowed("second lease", &f.reserve_new(&[(&rpm, 1)]).await.1);
    let (third, outcome) = f.reserve_new(&[(&rpm, 1)]).await;
    assert_insufficient("third lease", &outcome, &rpm);
    let again = f.reserve(third, &[(&rpm, 1)]).await;
    assert_denied("the denied lease retried", &again, Denial::LeaseAlreadyFailed);
    f.assert_in_use("two leases held", &[(&rpm, 2)]).await;
    f.advance(1000).await;
    f.wait_for_in_use("after the window", &rpm, 0).await;
    assert_allowed("a new lease after the window", &f.reserve_new(&[(&rpm, 1)]).await.1);
    let late = f.reserve(third, &[(&rpm, 1)]).await;
    assert_denied("the denied lease after the window", &late, Denial::LeaseAlreadyFailed);
    f.assert_in_use("one new lease held", &[(&rpm, 1)]).await;
}

/// All or nothing: a denied multi-key request changes no key's usage.
pub async fn denied_request_changes_nothing(h: &dyn Harness) {
    let f = Fixture::new(h).await;
    let tpm = f.rolling("tpm", 100, 3).await;
    let rpm = f.rolling("rpm", 1, 3).await;
    let conc = f.concurrency("conc", 2, 3).await;
    assert_allowed("fill rpm", &f.reserve_new(&[(&rpm, 1)]).await.1);
    let (_, outcome) = f.reserve_new(&[(&tpm, 60), (&conc, 1), (&rpm, 1)]).await;
    assert_insufficient("rpm is full", &outcome, &rpm);
    let (_, outcome) = f.reserve_new(&[(&rpm, 1), (&tpm, 10)]).await;
    assert_insufficient("rpm is full, listed first", &outcome, &rpm);
    f.assert_in_use("after denials", &[(&tpm, 0), (&rpm, 1), (&conc, 0)])
        .await;
    assert_allowed(
        "the rest fits whole",
        &f.reserve_new(&[(&tpm, 100), (&conc, 2)]).await.1,
    );
    f.assert_in_use("after the grant", &[(&tpm, 100), (&rpm, 1), (&conc, 2)])
        .await;
}

/// A concurrency hold ends at Complete, whatever its amount.
pub async fn concurrency_released_on_complete(h: &dyn Harness) {
    let f = Fixture::new(h).await;
    let conc = f.concurrency("conc", 1, 3).await;
    let (first, outcome) = f.reserve_new(&[(&conc, 1)]).await;
    assert_allowed("first call", &outcome);
    assert_insufficient("second call", &f.reserve_new(&[(&conc, 1)]).await.1, &conc);
    f.complete(first, &[]).await;
    f.assert_in_use("after complete", &[(&conc, 0)]).await;
    assert_allowed("after complete", &f.reserve_new(&[(&conc, 1)]).await.1);

    let wide = f.concurrency("wide", 3, 3).await;
    let (two, outcome) = f.reserve_new(&[(&wide, 2)]).await;
    assert_allowed("two units", &outcome);
    assert_insufficient("two more units", &f.reserve_new(&[(&wide, 2)]).await.1, &wide);
    assert_allowed("one more unit", &f.reserve_new(&[(&wide, 1)]).await.1);
    f.assert_in_use("three units held", &[(&wide, 3)]).await;
    f.complete(two, &[]).await;
    f.assert_in_use("two units released", &[(&wide, 1)]).await;
}

/// A concurrency hold whose caller never completes ends at its timeout.
pub async fn concurrency_released_on_timeout(h: &dyn Harness) {
    let f = Fixture::new(h).await;
    let conc = f.concurrency("conc", 1, 1).await;
    assert_allowed("abandoned call", &f.reserve_new(&[(&conc, 1)]).await.1);
    f.advance(500).await;
    assert_insufficient("before the timeout", &f.reserve_new(&[(&conc, 1)]).await.1, &conc);
    f.advance(500).await;
    f.wait_for_in_use("after the timeout", &conc, 0).await;
    assert_allowed("after the timeout", &f.reserve_new(&[(&conc, 1)]).await.1);
}

/// Prototype 3 (docs/testing.md, "Prototypes"): reserve 100, complete with 10, and 90
/// more fit at once.
pub async fn reconcile_frees_capacity(h: &dyn Harness) {
    let f = Fixture::new(h).await;
    let tpm = f.rolling("tpm", 100, 3).await;
    let (upper_bound, outcome) = f.reserve_new(&[(&tpm, 100)]).await;
    assert_allowed("upper bound", &outcome);
    assert_insufficient("full", &f.reserve_new(&[(&tpm, 90)]).await.1, &tpm);
    f.complete(upper_bound, &[(&tpm, 10)]).await;
    f.assert_in_use("reconciled to 10", &[(&tpm, 10)]).await;
    assert_allowed("the freed 90", &f.reserve_new(&[(&tpm, 90)]).await.1);
    f.assert_in_use("full again", &[(&tpm, 100)]).await;
}

/// Usage above the reservation is held when it fits, else becomes debt
/// (`overage: debt`) or is dropped (`overage: none`).
pub async fn overage_and_debt(h: &dyn Harness) {
    let f = Fixture::new(h).await;
    let debt = f.rolling_with("debt", 10, 3, Overage::Debt).await;
    let none = f.rolling("none", 10, 3).await;
    let (small, outcome) = f.reserve_new(&[(&debt, 2)]).await;
    assert_allowed("small", &outcome);
    f.complete(small, &[(&debt, 5)]).await;
    let report = f.report(&debt).await;
    assert_eq!((report.in_use, report.debt), (5, 0), "an overage that fits is held");
    let (rest, outcome) = f.reserve_new(&[(&debt, 5)]).await;
    assert_allowed("the rest", &outcome);
    f.complete(rest, &[(&debt, 8)]).await;
    let report = f.report(&debt).await;
    assert_eq!(
        (report.in_use, report.debt),
        (10, 3),
        "an overage that does not fit is debt"
    );
    let (all, outcome) = f.reserve_new(&[(&none, 10)]).await;
    assert_allowed("all of none", &outcome);
    f.complete(all, &[(&none, 15)]).await;
    let report = f.report(&none).await;
    assert_eq!((report.in_use, report.debt), (10, 0), "overage: none drops it");
}

/// A capacity increase is immediate.
pub async fn capacity_increase(h: &dyn Harness) {
    let f = Fixture::new(h).await;
    let rpm = f.rolling("rpm", 1, 3).await;
    assert_allowed("first", &f.reserve_new(&[(&rpm, 1)]).await.1);
    assert_insufficient("full", &f.reserve_new(&[(&rpm, 1)]).await.1, &rpm);
    let state = f.define(LimitDefinition::rolling(rpm.clone(), 3, 3).unwrap()).await;
    assert_eq!(
        (state.status(), state.definition().capacity()),
        (LimitStatus::Active, 3)
    );
    assert_allowed("second", &f.reserve_new(&[(&rpm, 1)]).await.1);
    assert_allowed("third", &f.reserve_new(&[(&rpm, 1)]).await.1);
    assert_insufficient("full again", &f.reserve_new(&[(&rpm, 1)]).await.1, &rpm);
    let report = f.report(&rpm).await;
    assert_eq!((report.in_use, report.state.definition().capacity()), (3, 3));
}

/// A decrease waits, denying new reservations on the key, until usage allows it.
pub async fn capacity_decrease(h: &dyn Harness) {
    let f = Fixture::new(h).await;
    let tpm = f.rolling("tpm", 4, 1).await;
    assert_allowed("three units", &f.reserve_new(&[(&tpm, 3)]).await.1);
    let state = f.define(LimitDefinition::rolling(tpm.clone(), 2, 1).unwrap()).await;
    assert_eq!(state.status(), LimitStatus::Decreasing);
    assert_eq!((state.definition().capacity(), state.pending_decrease_to()), (4, 2));
    let report = f.report(&tpm).await;
    assert_eq!(report.state, state, "the report shows the pending decrease");
    let waiting = LeaseId::generate();
    let outcome = f.reserve(waiting, &[(&tpm, 1)]).await;
    let denial = Denial::LimitDecreasing {
        key: tpm.clone(),
        retry_after_ms: h.decrease_retry_ms(),
    };
    assert_denied("while decreasing", &outcome, denial);
    assert_eq!(f.decrease_applied(&tpm).await, None, "3 in use leave no room for -2");
    f.advance(1000).await;
    let applied = f.wait_for_decrease("after the window", &tpm).await;
    assert_eq!(
        (applied.status(), applied.definition().capacity()),
        (LimitStatus::Active, 2)
    );
    assert_eq!(f.report(&tpm).await.state, applied);
    assert_allowed(
        "the decreasing denial did not burn the lease",
        &f.reserve(waiting, &[(&tpm, 2)]).await,
    );
    assert_insufficient("the new capacity", &f.reserve_new(&[(&tpm, 1)]).await.1, &tpm);

    let conc = f.concurrency("conc", 2, 3).await;
    let (a, _) = f.reserve_new(&[(&conc, 1)]).await;
    assert_allowed("second slot", &f.reserve_new(&[(&conc, 1)]).await.1);
    let state = f
        .define(LimitDefinition::concurrency(conc.clone(), 1, 3).unwrap())
        .await;
    assert_eq!(state.status(), LimitStatus::Decreasing);
    assert_eq!(f.decrease_applied(&conc).await, None, "both slots held");
    f.complete(a, &[]).await;
    let applied = f.decrease_applied(&conc).await;
    assert_eq!(
        applied.map(|s| s.definition().capacity()),
        Some(1),
        "applied once a slot freed"
    );
}

/// The same lease id sent again after it was allowed is allowed again with the
/// original time and reserves nothing more, also after Complete.
pub async fn idempotent_reserve(h: &dyn Harness) {
    let f = Fixture::new(h).await;
    let tpm = f.rolling("tpm", 10, 3).await;
    let conc = f.concurrency("conc", 2, 3).await;
    let lease = LeaseId::generate();
    let first = assert_allowed("first", &f.reserve(lease, &[(&tpm, 4), (&conc, 1)]).await);
    f.advance(100).await;
    let again = assert_allowed("again", &f.reserve(lease, &[(&tpm, 4), (&conc, 1)]).await);
    assert_eq!(again, first, "the original reserved_at_unix_ms");
    let reordered = assert_allowed("reordered", &f.reserve(lease, &[(&conc, 1), (&tpm, 4)]).await);
    assert_eq!(reordered, first);
    f.assert_in_use("reserved once", &[(&tpm, 4), (&conc, 1)]).await;
    f.complete(lease, &[(&tpm, 4)]).await;
    f.assert_in_use("completed", &[(&tpm, 4), (&conc, 0)]).await;
    let after = assert_allowed("after complete", &f.reserve(lease, &[(&tpm, 4), (&conc, 1)]).await);
    assert_eq!(after, first);
    f.assert_in_use("nothing held again", &[(&tpm, 4), (&conc, 0)]).await;
}

/// A lease id reused with other requirements is a conflict and changes nothing.
pub async fn lease_reuse_conflicts(h: &dyn Harness) {
    let f = Fixture::new(h).await;
    let tpm = f.rolling("tpm", 10, 3).await;
    let lease = LeaseId::generate();
    assert_allowed("first", &f.reserve(lease, &[(&tpm, 4)]).await);
    let reused = f.try_reserve(lease, &[(&tpm, 5)]).await;
    assert!(matches!(reused, Err(LimiterError::Conflict(_))), "got {reused:?}");
    f.assert_in_use("unchanged", &[(&tpm, 4)]).await;
}

/// An amount above the whole capacity is never granted, changes nothing, and
/// does not burn the lease id.
pub async fn exceeds_capacity(h: &dyn Harness) {
    let f = Fixture::new(h).await;
    let tpm = f.rolling("tpm", 5, 3).await;
    let rpm = f.rolling("rpm", 10, 3).await;
    let lease = LeaseId::generate();
    let outcome = f.reserve(lease, &[(&rpm, 1), (&tpm, 6)]).await;
    assert_denied("6 of 5", &outcome, Denial::ExceedsCapacity { key: tpm.clone() });
    f.assert_in_use("unchanged", &[(&rpm, 0), (&tpm, 0)]).await;
    assert_allowed("5 of 5, same lease", &f.reserve(lease, &[(&rpm, 1), (&tpm, 5)]).await);
}

/// A requirement on an undefined key is an error that changes nothing and does
/// not burn the lease id.
pub async fn unknown_key(h: &dyn Harness) {
    let f = Fixture::new(h).await;
    let tpm = f.rolling("tpm", 5, 3).await;
    let ghost = f.key("ghost");
    let lease = LeaseId::generate();
    let result = f.try_reserve(lease, &[(&tpm, 1), (&ghost, 1)]).await;
    assert_eq!(result, Err(LimiterError::UnknownKey(ghost.clone())));
    f.assert_in_use("unchanged", &[(&tpm, 0)]).await;
    assert_eq!(f.backend.limit_report(&ghost).await.unwrap(), None);
    assert_allowed("same lease, known keys", &f.reserve(lease, &[(&tpm, 1)]).await);
}

/// A second Complete, or one for an unknown lease, changes nothing.
pub async fn complete_is_idempotent(h: &dyn Harness) {
    let f = Fixture::new(h).await;
    let tpm = f.rolling("tpm", 10, 3).await;
    let conc = f.concurrency("conc", 1, 3).await;
    let (lease, outcome) = f.reserve_new(&[(&tpm, 8), (&conc, 1)]).await;
    assert_allowed("lease", &outcome);
    f.complete(lease, &[(&tpm, 3)]).await;
    f.assert_in_use("completed", &[(&tpm, 3), (&conc, 0)]).await;
    assert_allowed("next call", &f.reserve_new(&[(&conc, 1)]).await.1);
    f.complete(lease, &[(&tpm, 1)]).await;
    f.complete(lease, &[]).await;
    f.assert_in_use("second completes changed nothing", &[(&tpm, 3), (&conc, 1)])
        .await;
    f.complete(LeaseId::generate(), &[(&tpm, 5)]).await;
    f.assert_in_use("unknown lease changed nothing", &[(&tpm, 3), (&conc, 1)])
        .await;
}

/// The first Complete of a lease decides its reconciliation, even one that
/// changes nothing (no actuals, or actuals equal to the reservation): a later
/// Complete with other actuals is answered ok and changes nothing (issue 21,
/// item 2; on a fleet, whichever server each Complete reaches).
pub async fn first_complete_decides(h: &dyn Harness) {
    let f = Fixture::new(h).await;
    let tpm = f.rolling("tpm", 100, 3).await;
    let (kept, outcome) = f.reserve_new(&[(&tpm, 8)]).await;
    assert_allowed("lease", &outcome);
    f.complete(kept, &[(&tpm, 8)]).await;
    f.assert_in_use("kept as reserved", &[(&tpm, 8)]).await;
    f.complete(kept, &[(&tpm, 2)]).await;
    f.complete(kept, &[(&tpm, 50)]).await;
    f.assert_in_use("later completes changed nothing", &[(&tpm, 8)]).await;
    let (silent, outcome) = f.reserve_new(&[(&tpm, 8)]).await;
    assert_allowed("second lease", &outcome);
    f.complete(silent, &[]).await;
    f.complete(silent, &[(&tpm, 0)]).await;
    f.complete(silent, &[(&tpm, 30)]).await;
    f.assert_in_use("a Complete without actuals decided too", &[(&tpm, 16)])
        .await;
}

/// An actual for a key the lease did not reserve, for a concurrency key, or of
/// more than `ACTUAL_CAPACITY_MULTIPLE_MAX` times its key's capacity, is an
/// invalid request that changes nothing.
pub async fn complete_rejects_bad_actuals(h: &dyn Harness) {
    let f = Fixture::new(h).await;
    let tpm = f.rolling("tpm", 10, 3).await;
    let other = f.rolling("other", 10, 3).await;
    let conc = f.concurrency("conc", 1, 3).await;
    let (lease, outcome) = f.reserve_new(&[(&tpm, 5), (&conc, 1)]).await;
    assert_allowed("lease", &outcome);
    let bad = [
        ("a key not reserved", vec![(&tpm, 2), (&other, 1)]),
        ("a concurrency key", vec![(&conc, 1)]),
        (
            "more than 100 times the capacity",
            vec![(&tpm, 10 * crate::model::decision::ACTUAL_CAPACITY_MULTIPLE_MAX + 1)],
        ),
    ];
    for (what, actuals) in bad {
        let result = f.try_complete(lease, &actuals).await;
        assert!(
            matches!(result, Err(LimiterError::InvalidRequest(_))),
            "{what}: got {result:?}"
        );
        f.assert_in_use(what, &[(&tpm, 5), (&conc, 1), (&other, 0)]).await;
    }
    f.complete(lease, &[(&tpm, 2)]).await;
    f.assert_in_use("a valid complete", &[(&tpm, 2), (&conc, 0)]).await;
}

/// The reserve precedence of docs/decisions.md, row by row: an unknown key
/// first; a granted lease replayed before any denial; a burnt lease id; then
/// a final denial (`exceeds_capacity`, no hint) before a transient one
/// (`limit_decreasing`, then `insufficient_capacity`), whatever the order of
/// the requirements.
pub async fn reserve_precedence(h: &dyn Harness) {
    let f = Fixture::new(h).await;
    let granted = LeaseId::generate();
    let open = f.rolling("open", 10, 3).await;
    let small = f.rolling("small", 5, 3).await;
    let full = f.rolling("full", 1, 3).await;
    assert_allowed("fill full", &f.reserve_new(&[(&full, 1)]).await.1);
    let decreasing = {
        let key = f.key("decreasing");
        f.define(LimitDefinition::rolling(key.clone(), 10, 3).unwrap()).await;
        let at = assert_allowed("a grant before the decrease", &f.reserve(granted, &[(&key, 1)]).await);
        assert_allowed("hold it", &f.reserve_new(&[(&key, 8)]).await.1);
        let state = f.define(LimitDefinition::rolling(key.clone(), 5, 3).unwrap()).await;
        assert_eq!(state.status(), LimitStatus::Decreasing);
        let replay = f.reserve(granted, &[(&key, 1)]).await;
        assert_eq!(assert_allowed("row 3: a replay before limit_decreasing", &replay), at);
        key
    };
    let ghost = f.key("ghost");
    for needs in [
        vec![(&ghost, 1), (&small, 6)],
        vec![(&decreasing, 1), (&small, 6), (&ghost, 1)],
    ] {
        let result = f.try_reserve(LeaseId::generate(), &needs).await;
        assert_eq!(
            result,
            Err(LimiterError::UnknownKey(ghost.clone())),
            "row 2: unknown first"
        );
    }
    let burnt = LeaseId::generate();
    assert_insufficient("burn a lease id", &f.reserve(burnt, &[(&full, 1)]).await, &full);
    let again = f.reserve(burnt, &[(&small, 6), (&decreasing, 1)]).await;
    assert_denied(
        "row 4: a burnt id before any other denial",
        &again,
        Denial::LeaseAlreadyFailed,
    );
    let exceeds = Denial::ExceedsCapacity { key: small.clone() };
    for needs in [
        vec![(&decreasing, 1), (&small, 6)],
        vec![(&small, 6), (&decreasing, 1)],
        vec![(&full, 1), (&small, 6)],
    ] {
        assert_denied(
            "row 5: exceeds_capacity first",
            &f.reserve_new(&needs).await.1,
            exceeds.clone(),
        );
    }
    let waiting = LeaseId::generate();
    let decreasing_denial = Denial::LimitDecreasing {
        key: decreasing.clone(),
        retry_after_ms: h.decrease_retry_ms(),
    };
    let outcome = f.reserve(waiting, &[(&full, 1), (&open, 1), (&decreasing, 1)]).await;
    assert_denied(
        "row 6: limit_decreasing before insufficient",
        &outcome,
        decreasing_denial,
    );
    let outcome = f.reserve(waiting, &[(&open, 1), (&full, 1)]).await;
    assert_insufficient("row 7: limit_decreasing burnt nothing", &outcome, &full);
    f.assert_in_use("denials reserved nothing", &[(&open, 0), (&small, 0), (&full, 1)])
        .await;
}

/// Usage above a reservation reported after its window ended cannot be held
/// in a window that is over: it is debt (`overage: debt`) at once.
pub async fn overage_after_the_window(h: &dyn Harness) {
    let f = Fixture::new(h).await;
    let debt = f.rolling_with("debt", 10, 1, Overage::Debt).await;
    let (lease, outcome) = f.reserve_new(&[(&debt, 4)]).await;
    assert_allowed("lease", &outcome);
    f.advance(1000).await;
    f.wait_for_in_use("the window passed", &debt, 0).await;
    f.complete(lease, &[(&debt, 7)]).await;
    let report = f.report(&debt).await;
    assert_eq!((report.in_use, report.debt), (0, 3), "late overage is debt");
}

/// How long [`pause_holds_for_its_own_time`] pauses: far shorter than its keys'
/// 10 s window and timeout, so a hold that lasted those would fail it.
const PAUSE_MS: u64 = 1_500;
/// How far above the pause's time a denial's hint may be: the backoff cap of
/// hints that are not exact (TigerBeetle's rolling hints, 1 s) plus jitter.
const PAUSE_HINT_SLACK_MS: u64 = 1_100;

/// A pause after a provider's 429 (`crate::pause`) holds all the free capacity
/// of its keys for its own time (`hold_ms`), not the keys' windows or timeouts:
/// a caller is denied with a hint no later than about its end, capacity freed
/// meanwhile is held again, and its holds end by themselves when it does.
pub async fn pause_holds_for_its_own_time(h: &dyn Harness) {
    let f = Fixture::new(h).await;
    let rpm = f.rolling("rpm", 5, 10).await;
    let conc = f.concurrency("conc", 3, 10).await;
    let (caller, outcome) = f.reserve_new(&[(&rpm, 2), (&conc, 1)]).await;
    assert_allowed("a call before the pause", &outcome);
    let pause = Pause::new(PAUSE_MS).expect("a valid pause");
    let keys = [rpm.clone(), conc.clone()];
    let mut paused = (pause.hold(f.backend.clone(), &keys).await).unwrap_or_else(|e| panic!("pause: {e}"));
    f.assert_in_use("the pause holds the rest", &[(&rpm, 5), (&conc, 3)])
        .await;
    let (_, outcome) = f.reserve_new(&[(&rpm, 1)]).await;
    let hint_ms = assert_insufficient("a call during the pause", &outcome, &rpm);
    assert!(
        hint_ms <= PAUSE_MS + PAUSE_HINT_SLACK_MS,
        "the hint {hint_ms} ms is about the pause's {PAUSE_MS} ms, not the 10 s window"
    );
    f.complete(caller, &[(&rpm, 0)]).await;
    f.assert_in_use("the caller's capacity is back", &[(&rpm, 3), (&conc, 2)])
        .await;
    let held = paused.rehold().await.unwrap_or_else(|e| panic!("rehold: {e}"));
    assert_eq!(held, 3, "the freed capacity of both keys is held again");
    f.assert_in_use("and held", &[(&rpm, 5), (&conc, 3)]).await;
    f.advance(PAUSE_MS).await;
    f.wait_for_in_use("the pause is over", &rpm, 0).await;
    f.wait_for_in_use("the pause is over", &conc, 0).await;
    paused.release().await;
    let (_, outcome) = f.reserve_new(&[(&rpm, 5), (&conc, 3)]).await;
    assert_allowed("a call after the pause", &outcome);
}
