//! The over-admission soak in CI (issue 7): a short run of the `soak` example's
//! engine against an in-process server on the memory backend, and the checker's
//! own tests, which plant over-admissions it must find and admissible histories
//! it must accept. The long run is `cargo run --release -p ratelimiterd
//! --example soak -- --seconds 60` (RELIABILITY.md).

#[path = "../examples/soak/engine/mod.rs"]
mod engine;
mod soak_support;

use engine::checker::{check, Verdict};
use engine::record::{CapacityChange, Completion, Grant, LimitSpec, Observation, Records};
use engine::server;
use ratelimiter::{LeaseId, LimitKind};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_soak_on_the_memory_backend_never_over_admits() {
    let (seed, prefix) = soak_support::seed_and_prefix("ci");
    let config = server::config(None, &server::temp_dir(&prefix)).expect("config");
    soak_support::soak_never_over_admits(&config, seed, prefix).await;
}

const ROLLING: usize = 0;
const CONCURRENCY: usize = 1;

/// A rolling limit (10 s window) and a concurrency limit (10 s timeout), both
/// of capacity 10 from t = 0.
fn setup() -> (Vec<LimitSpec>, Records) {
    let limits = vec![
        LimitSpec {
            key: "rolling".into(),
            kind: LimitKind::Rolling,
            hold_ms: 10_000,
        },
        LimitSpec {
            key: "concurrency".into(),
            kind: LimitKind::Concurrency,
            hold_ms: 10_000,
        },
    ];
    let mut records = Records::default();
    for limit in [ROLLING, CONCURRENCY] {
        records.changes.push(change(limit, 0, 1, 10, 0));
    }
    (limits, records)
}

fn change(limit: usize, sent_ms: u64, answered_ms: u64, capacity: u64, pending_decrease_to: u64) -> CapacityChange {
    CapacityChange {
        limit,
        sent_ms,
        answered_ms,
        capacity,
        pending_decrease_to,
        unknown: false,
    }
}

/// Records a grant of `amount` on `limit`, reserved and answered at the given times.
fn grant(records: &mut Records, limit: usize, amount: u64, reserved_at_ms: u64, answered_ms: u64) -> LeaseId {
    let lease = LeaseId::generate();
    records.grants.push(Grant {
        lease,
        reserved_at_ms,
        answered_ms,
        requirements: vec![(limit, amount)],
    });
    lease
}

fn complete(records: &mut Records, lease: LeaseId, sent_ms: u64, actuals: Vec<(usize, u64)>) {
    records.completions.push(Completion {
        lease,
        sent_ms,
        actuals,
    });
}

fn verdict(records: &Records) -> Verdict {
    check(&setup().0, records)
}

#[test]
fn concurrent_grants_past_capacity_are_found() {
    for limit in [ROLLING, CONCURRENCY] {
        let (_, mut records) = setup();
        grant(&mut records, limit, 6, 100, 105);
        grant(&mut records, limit, 5, 101, 103);
        let verdict = verdict(&records);
        assert_eq!(verdict.violations_total, 1, "{verdict:?}");
        assert_eq!((verdict.violations[0].held, verdict.violations[0].capacity), (11, 10));
    }
}

#[test]
fn holds_that_ended_or_were_released_free_their_room() {
    let (_, mut records) = setup();
    // Rolling: the first hold ends at 100 + 10,000.
    grant(&mut records, ROLLING, 10, 100, 101);
    grant(&mut records, ROLLING, 10, 10_100, 10_100);
    // Concurrency: released by a complete sent before the next grant's answer.
    let first = grant(&mut records, CONCURRENCY, 10, 100, 101);
    complete(&mut records, first, 500, Vec::new());
    grant(&mut records, CONCURRENCY, 10, 499, 501);
    assert!(verdict(&records).holds(), "{:?}", verdict(&records));
    // Answered while the first rolling hold still ran: an over-admission (11 of
    // 10), and again once the second grant joins it (11 of 10).
    grant(&mut records, ROLLING, 1, 10_099, 10_099);
    assert_eq!(verdict(&records).violations_total, 2);
}

#[test]
fn a_server_clock_read_before_an_expiry_is_not_an_over_admission() {
    // The server read its clock (reserved_at 10,099) before the first hold's end,
    // took the lock after it and answered at 10,101: admissible.
    let (_, mut records) = setup();
    grant(&mut records, ROLLING, 10, 100, 101);
    grant(&mut records, ROLLING, 10, 10_099, 10_101);
    assert!(verdict(&records).holds(), "{:?}", verdict(&records));
}

#[test]
fn shrinks_count_from_the_complete_and_overage_is_not_counted() {
    let (_, mut records) = setup();
    let first = grant(&mut records, ROLLING, 8, 100, 101);
    complete(&mut records, first, 200, vec![(ROLLING, 2)]);
    grant(&mut records, ROLLING, 8, 201, 202);
    assert!(verdict(&records).holds());
    // The same grant answered before the complete was even sent is an over-admission.
    let (_, mut records) = setup();
    let first = grant(&mut records, ROLLING, 8, 100, 101);
    complete(&mut records, first, 200, vec![(ROLLING, 2)]);
    grant(&mut records, ROLLING, 8, 150, 151);
    assert_eq!(verdict(&records).violations_total, 1);
    // An actual above the amount never raises the bound (the overage may have been dropped).
    let (_, mut records) = setup();
    let first = grant(&mut records, ROLLING, 5, 100, 101);
    complete(&mut records, first, 200, vec![(ROLLING, 50)]);
    grant(&mut records, ROLLING, 5, 300, 301);
    assert!(verdict(&records).holds());
}

#[test]
fn capacity_changes_are_bounded_by_when_they_can_have_happened() {
    let (_, mut records) = setup();
    // An increase counts from when it was sent.
    records.changes.push(change(ROLLING, 1_000, 1_010, 20, 0));
    grant(&mut records, ROLLING, 10, 100, 101);
    grant(&mut records, ROLLING, 9, 1_005, 1_006);
    assert!(verdict(&records).holds(), "{:?}", verdict(&records));
    // Before it was sent, the old capacity holds: 11 of 10 (then 20 of 20).
    grant(&mut records, ROLLING, 1, 999, 999);
    assert_eq!(verdict(&records).violations_total, 1);
}

#[test]
fn a_grant_after_a_decrease_proves_it_carried_out_and_is_held_to_the_target() {
    let (_, mut records) = setup();
    let holder = grant(&mut records, CONCURRENCY, 3, 100, 101);
    // 10 -> 4, answered decreasing at 200.
    records.changes.push(change(CONCURRENCY, 190, 200, 10, 4));
    complete(&mut records, holder, 300, Vec::new());
    // Reserved after the answer: the decrease was carried out; 4 fit.
    grant(&mut records, CONCURRENCY, 4, 400, 401);
    let verdict = verdict(&records);
    assert!(verdict.holds(), "{verdict:?}");
    assert_eq!(verdict.limits[CONCURRENCY].decreases_carried_out, 1);
    // Had the holder not been released, 3 + 4 > 4 is an over-admission even
    // though it is below the old capacity.
    let (_, mut records) = setup();
    grant(&mut records, CONCURRENCY, 3, 100, 101);
    records.changes.push(change(CONCURRENCY, 190, 200, 10, 4));
    grant(&mut records, CONCURRENCY, 4, 400, 401);
    assert_eq!(self::verdict(&records).violations_total, 1);
}

#[test]
fn a_sample_showing_a_decrease_carried_out_lowers_the_bound() {
    let (_, mut records) = setup();
    records.changes.push(change(ROLLING, 190, 200, 10, 4));
    records.observations.push(Observation {
        limit: ROLLING,
        sent_ms: 300,
        answered_ms: 301,
        capacity: 4,
        active: true,
        in_use: 0,
    });
    // Reserved before the PUT's answer, so it proves nothing itself, but the
    // sample does: 5 is over the target 4.
    grant(&mut records, ROLLING, 5, 199, 400);
    assert_eq!(verdict(&records).violations_total, 1);
}

#[test]
fn samples_over_capacity_and_leases_granted_twice_are_anomalies() {
    let (_, mut records) = setup();
    records.observations.push(Observation {
        limit: ROLLING,
        sent_ms: 10,
        answered_ms: 11,
        capacity: 10,
        active: true,
        in_use: 11,
    });
    let lease = grant(&mut records, ROLLING, 1, 100, 101);
    records.grants.push(Grant {
        lease,
        reserved_at_ms: 200,
        answered_ms: 201,
        requirements: vec![(ROLLING, 1)],
    });
    assert_eq!(verdict(&records).anomalies.len(), 2, "{:?}", verdict(&records));
}

#[test]
fn a_put_without_an_answer_bounds_by_the_larger_capacity() {
    // An unanswered increase to 20 may have been applied: 20 may be held.
    let (_, mut records) = setup();
    records.changes.push(CapacityChange {
        unknown: true,
        ..change(ROLLING, 1_000, 3_000, 20, 0)
    });
    grant(&mut records, ROLLING, 10, 100, 101);
    grant(&mut records, ROLLING, 10, 3_500, 3_501);
    assert!(verdict(&records).holds(), "{:?}", verdict(&records));
    // An unanswered decrease to 4 may not have been: the bound stays 10, and
    // the next answered change (active at 6) sets it again.
    let (_, mut records) = setup();
    records.changes.push(CapacityChange {
        unknown: true,
        ..change(ROLLING, 1_000, 3_000, 4, 0)
    });
    grant(&mut records, ROLLING, 10, 3_500, 3_501);
    records.changes.push(change(ROLLING, 20_000, 20_001, 6, 0));
    grant(&mut records, ROLLING, 7, 20_100, 20_101);
    let verdict = verdict(&records);
    assert_eq!(verdict.violations_total, 1, "{verdict:?}");
    assert_eq!(verdict.violations[0].capacity, 6);
}

#[test]
fn a_sample_is_held_to_the_largest_capacity_in_force_while_it_was_read() {
    // The state says 10, but an increase to 20 was answered while the sample
    // read its balances: 15 in use is what a correct server may show, 21 is not.
    let (limits, mut records) = setup();
    records.changes.push(change(ROLLING, 50, 52, 20, 0));
    let sample = |in_use| Observation {
        limit: ROLLING,
        sent_ms: 49,
        answered_ms: 53,
        capacity: 10,
        active: true,
        in_use,
    };
    records.observations.push(sample(15));
    assert!(
        check(&limits, &records).anomalies.is_empty(),
        "{:?}",
        check(&limits, &records)
    );
    records.observations.push(sample(21));
    assert_eq!(check(&limits, &records).anomalies.len(), 1);
}
