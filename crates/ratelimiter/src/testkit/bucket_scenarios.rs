//! The behaviour suite's token-bucket scenarios (docs/bucket-limits.md), one public
//! function each, run by [`super::run_bucket`].
//!
//! They hold on a real-time backend too: a bucket of 600 per 3 s refills 10 units
//! every 50 ms slot, and every assertion either follows from what was taken
//! (whatever the time) or leaves a generous refill margin for a slow call.

use crate::model::bucket::BucketShape;
use crate::model::definition::{LimitDefinition, LimitStatus, Overage};
use crate::model::key::LimitKey;
use crate::model::wire::Denial;

use super::scenarios::{assert_allowed, assert_denied, assert_insufficient};
use super::{Fixture, Harness};

/// The scenarios' bucket: 600 units per 3 s.
const CAPACITY: u64 = 600;
/// The scenarios' refill time from empty, in seconds.
const WINDOW_SECONDS: u64 = 3;
/// Units a slow backend may refill between two calls that a scenario treats as
/// back to back: 1.5 s of refill. A denial asserted right after a take asks for
/// at least this much more than the take left.
const SLOW_CALL_REFILL: u64 = 300;

/// The margin the scenarios' buckets give themselves, in ms, so that their burst
/// does not depend on the backend's default.
const MARGIN_MS: u64 = 50;

/// A bucket of `capacity` with the scenarios' window and margin.
fn bucket(key: LimitKey, capacity: u64) -> LimitDefinition {
    LimitDefinition::bucket(key, capacity, WINDOW_SECONDS)
        .and_then(|d| d.with_window_margin_ms(Some(MARGIN_MS)))
        .expect("valid test bucket")
}

/// Defines the scenarios' bucket `name`; returns its key and burst.
async fn define_bucket(f: &Fixture<'_>, name: &str, overage: Overage) -> (LimitKey, u64) {
    let definition = bucket(f.key(name), CAPACITY).with_overage(overage);
    f.define(definition.clone()).await;
    let key = f.key(name);
    let report = f.report(&key).await;
    assert_eq!(report.in_use, 0, "a new bucket is full");
    let burst = burst_of(&definition);
    (key, burst)
}

/// The burst of `definition`, whose own margin makes the backend's default moot.
fn burst_of(definition: &LimitDefinition) -> u64 {
    BucketShape::new(definition, 0)
        .expect("the scenarios' buckets keep a burst")
        .burst()
}

/// A bucket grants its burst at once, then only its refill: more than the burst is
/// refused for ever, one unit more is "not now" with a hint of about a slot, and
/// after half the refill time about half the capacity fits again.
pub async fn bucket_burst_then_refill(h: &dyn Harness) {
    let f = Fixture::new(h).await;
    let (otpm, burst) = define_bucket(&f, "otpm", Overage::None).await;
    assert_denied(
        "above the burst",
        &f.reserve_new(&[(&otpm, burst + 1)]).await.1,
        Denial::ExceedsCapacity { key: otpm.clone() },
    );
    assert_allowed("the burst", &f.reserve_new(&[(&otpm, burst)]).await.1);
    // Emptied; a real-time backend may have passed a boundary or two since.
    let in_use = f.in_use(&otpm).await;
    assert!(
        (burst - SLOW_CALL_REFILL..=burst).contains(&in_use),
        "emptied: in_use {in_use} of a burst of {burst}"
    );
    let hint_ms = assert_insufficient("empty", &f.reserve_new(&[(&otpm, SLOW_CALL_REFILL)]).await.1, &otpm);
    // 300 units need 1.5 s of refill from empty, less what refilled meanwhile.
    assert!(hint_ms <= 1_500 + 1_000, "hint {hint_ms} ms for 1.5 s of refill");
    f.advance(1_500).await;
    // 1.5 s refilled at least 290 (a slot may not have passed yet).
    let (_, outcome) = f.reserve_new(&[(&otpm, 250)]).await;
    assert_allowed("half the capacity after half the refill time", &outcome);
    // The bucket now holds at most burst - 250: asking for burst - 100 needs 150
    // more, 750 ms of refill between two calls.
    assert_insufficient(
        "no more than the burst less what was taken",
        &f.reserve_new(&[(&otpm, burst - 100)]).await.1,
        &otpm,
    );
}

/// A Complete that used less gives the difference back at once; sent again, it
/// gives nothing more.
pub async fn bucket_refund_on_complete(h: &dyn Harness) {
    let f = Fixture::new(h).await;
    let (otpm, burst) = define_bucket(&f, "otpm", Overage::None).await;
    let (call, outcome) = f.reserve_new(&[(&otpm, burst)]).await;
    assert_allowed("max_tokens of a call", &outcome);
    f.complete(call, &[(&otpm, 80)]).await;
    let refunded = burst - 80;
    assert_allowed(
        "what the call did not use",
        &f.reserve_new(&[(&otpm, refunded)]).await.1,
    );
    f.complete(call, &[(&otpm, 80)]).await;
    assert_insufficient(
        "a repeated Complete refunds nothing",
        &f.reserve_new(&[(&otpm, SLOW_CALL_REFILL)]).await.1,
        &otpm,
    );
}

/// An actual above the reservation takes the extra from the bucket when it holds
/// it, else the extra is debt (`overage: debt`).
pub async fn bucket_overage(h: &dyn Harness) {
    let f = Fixture::new(h).await;
    let (otpm, burst) = define_bucket(&f, "otpm", Overage::Debt).await;
    let (small, outcome) = f.reserve_new(&[(&otpm, 100)]).await;
    assert_allowed("small", &outcome);
    f.complete(small, &[(&otpm, 100 + SLOW_CALL_REFILL)]).await;
    assert_eq!(f.report(&otpm).await.debt, 0, "an overage the bucket holds is taken");
    // Taken, the bucket holds burst - 400 plus what refilled since: asking for
    // burst - 100 needs 1.5 s of refill. Not taken, it would fit.
    assert_insufficient(
        "the overage was taken",
        &f.reserve_new(&[(&otpm, burst - 100)]).await.1,
        &otpm,
    );
    let (rest, outcome) = f.reserve_new(&[(&otpm, 100)]).await;
    assert_allowed("another", &outcome);
    f.complete(rest, &[(&otpm, 100 + burst)]).await;
    assert_eq!(f.report(&otpm).await.debt, burst, "an overage it lacks is debt");
}

/// A larger capacity grows the level at once; a smaller one waits until the bucket
/// holds the burst's decrease, denying new reservations meanwhile.
pub async fn bucket_capacity_changes(h: &dyn Harness) {
    let f = Fixture::new(h).await;
    let (otpm, burst) = define_bucket(&f, "otpm", Overage::None).await;
    assert_allowed("the burst", &f.reserve_new(&[(&otpm, burst)]).await.1);
    let larger = bucket(otpm.clone(), 2 * CAPACITY);
    let state = f.define(larger.clone()).await;
    assert_eq!(state.status(), LimitStatus::Active);
    let growth = burst_of(&larger) - burst;
    assert_allowed("the burst's growth", &f.reserve_new(&[(&otpm, growth)]).await.1);
    let smaller = bucket(otpm.clone(), CAPACITY / 2);
    let state = f.define(smaller.clone()).await;
    assert_eq!(
        state.status(),
        LimitStatus::Decreasing,
        "an empty bucket cannot give up its burst"
    );
    let outcome = f.reserve_new(&[(&otpm, 1)]).await.1;
    let denial = Denial::LimitDecreasing {
        key: otpm.clone(),
        retry_after_ms: h.decrease_retry_ms(),
    };
    assert_denied("while decreasing", &outcome, denial);
    f.advance(WINDOW_SECONDS * 1_000).await;
    let applied = f.wait_for_decrease("after a refill time", &otpm).await;
    assert_eq!(applied.definition().capacity(), CAPACITY / 2);
    let small_burst = burst_of(&smaller);
    f.wait_for_in_use("refilled to the smaller burst", &otpm, 0).await;
    assert_allowed("the smaller burst", &f.reserve_new(&[(&otpm, small_burst)]).await.1);
    assert_denied(
        "above the smaller burst",
        &f.reserve_new(&[(&otpm, small_burst + 1)]).await.1,
        Denial::ExceedsCapacity { key: otpm.clone() },
    );
}
