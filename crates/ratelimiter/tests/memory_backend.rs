//! What only the memory backend promises: exact rolling hints, bounded lease
//! memory with counted evictions, overage counters, window changes.

use std::sync::Arc;

use ratelimiter::definition::{LimitState, Overage};
use ratelimiter::memory::{
    MemoryBackend, MemoryConfig, LEASE_MEMORY_MARGIN_MS, SETTLED_LEASES_MAX_DEFAULT, SETTLED_LEASES_MAX_LIMIT,
};
use ratelimiter::retry::{
    BackoffFields, BackoffPolicy, Jitter, RetryPolicy, RollingBackoffFields, RollingBackoffPolicy,
};
use ratelimiter::testkit::{assert_allowed, assert_denied, assert_insufficient, Fixture, Harness, MemoryHarness};
use ratelimiter::{Denial, FakeClock, LeaseId, LimitDefinition, LimitKey, LimiterError};

fn policy(jitter_ms: u64) -> RetryPolicy {
    RetryPolicy {
        concurrency: BackoffPolicy::new(BackoffFields {
            jitter_ms,
            ..Default::default()
        })
        .unwrap(),
        rolling: RollingBackoffPolicy::new(RollingBackoffFields {
            jitter_ms,
            ..Default::default()
        })
        .unwrap(),
    }
}

fn harness(config: MemoryConfig) -> MemoryHarness {
    MemoryHarness::with_config(config)
}

/// No jitter and no window margin: hints and expiries are exact window figures.
fn exact() -> MemoryConfig {
    MemoryConfig {
        retry_policy: policy(0),
        window_margin_ms: 0,
        ..Default::default()
    }
}

#[tokio::test]
async fn rolling_hints_are_the_exact_time_until_enough_units_expire() {
    let h = harness(exact());
    let f = Fixture::new(&h).await;
    let tpm = f.rolling("tpm", 10, 60).await;
    assert_allowed("4", &f.reserve_new(&[(&tpm, 4)]).await.1);
    f.advance(1000).await;
    assert_allowed("3", &f.reserve_new(&[(&tpm, 3)]).await.1);
    f.advance(1000).await;
    assert_allowed("3", &f.reserve_new(&[(&tpm, 3)]).await.1);
    f.advance(500).await;
    let hint = assert_insufficient("1 more", &f.reserve_new(&[(&tpm, 1)]).await.1, &tpm);
    assert_eq!(hint, 60_000 - 2_500, "the first 4 expire 60 s after t0");
    let hint = assert_insufficient("5 more", &f.reserve_new(&[(&tpm, 5)]).await.1, &tpm);
    assert_eq!(hint, 61_000 - 2_500, "4 then 3 must expire");
    f.advance(57_500).await;
    assert_allowed("at the hint", &f.reserve_new(&[(&tpm, 1)]).await.1);
}

/// A grant 0.9 ms into a millisecond holds for its whole window and timeout
/// after the grant, not until the window after the millisecond began (issue
/// 15: truncated, a later grant overlapped the end of the window by a
/// fraction of a millisecond). The hint, waited out from the same instant,
/// lands where the units are free.
#[tokio::test]
async fn holds_last_their_whole_window_after_a_grant_inside_a_millisecond() {
    let h = harness(exact());
    let f = Fixture::new(&h).await;
    let rpm = f.rolling("rpm", 1, 1).await;
    let inflight = f.concurrency("inflight", 1, 1).await;
    h.clock().advance_micros(900);
    assert_allowed(
        "granted at +0.9 ms",
        &f.reserve_new(&[(&rpm, 1), (&inflight, 1)]).await.1,
    );
    // 999.6 ms after the grant: the window and the timeout have not passed.
    h.clock().advance_micros(999_600);
    let outcome = f.reserve_new(&[(&rpm, 1)]).await.1;
    let hint = assert_insufficient("window not over", &outcome, &rpm);
    assert_eq!(hint, 1, "the hold ends at the next whole millisecond");
    let outcome = f.reserve_new(&[(&inflight, 1)]).await.1;
    assert_insufficient("timeout not over", &outcome, &inflight);
    assert_eq!(f.in_use(&rpm).await, 1);
    // 1,000.1 ms after the grant, both have ended.
    h.clock().advance_micros(500);
    assert_allowed("window over", &f.reserve_new(&[(&rpm, 1), (&inflight, 1)]).await.1);
}

#[tokio::test]
async fn rolling_hints_add_bounded_jitter() {
    let h = harness(MemoryConfig {
        window_margin_ms: 0,
        ..Default::default()
    });
    let f = Fixture::new(&h).await;
    let rpm = f.rolling("rpm", 1, 10).await;
    assert_allowed("1", &f.reserve_new(&[(&rpm, 1)]).await.1);
    let mut hints = std::collections::HashSet::new();
    for _ in 0..200 {
        let hint = assert_insufficient("full", &f.reserve_new(&[(&rpm, 1)]).await.1, &rpm);
        assert!((10_000..=10_050).contains(&hint), "{hint}");
        hints.insert(hint);
    }
    assert!(hints.len() > 10, "jitter spreads the hints");
}

#[tokio::test]
async fn concurrency_hints_back_off_and_the_largest_failing_hint_wins() {
    let h = harness(exact());
    let f = Fixture::new(&h).await;
    let conc = f.concurrency("conc", 1, 300).await;
    let rpm = f.rolling("rpm", 1, 1).await;
    let (first, _) = f.reserve_new(&[(&conc, 1)]).await;
    let mut hints = Vec::new();
    for _ in 0..4 {
        hints.push(assert_insufficient(
            "busy",
            &f.reserve_new(&[(&conc, 1)]).await.1,
            &conc,
        ));
    }
    assert_eq!(hints, [50, 100, 200, 400]);
    f.complete(first, &[]).await;
    assert_allowed("free", &f.reserve_new(&[(&conc, 1)]).await.1);
    let hint = assert_insufficient("halved streak", &f.reserve_new(&[(&conc, 1)]).await.1, &conc);
    assert_eq!(hint, 200);
    assert_allowed("rpm", &f.reserve_new(&[(&rpm, 1)]).await.1);
    let both = f.reserve_new(&[(&conc, 1), (&rpm, 1)]).await.1;
    assert_eq!(
        assert_insufficient("both full", &both, &conc),
        1000,
        "rpm's exact 1000 ms beats 400"
    );
}

/// Leases settled after the first one, all within its window: far more than
/// the old direct-mapped cache had slots at `leases_max` 16 (it forgot the first
/// lease with odds of 1 - (15/16)^20,000).
const SETTLED_AFTER: u64 = 20_000;

#[tokio::test]
async fn a_completed_lease_is_replayed_exactly_after_many_more_settled_within_its_window() {
    let config = MemoryConfig {
        leases_max: 16,
        ..exact()
    };
    let h = harness(config);
    let backend = memory(&h, config);
    let f = Fixture::with_backend(&h, backend.clone());
    let conc = f.concurrency("conc", 10, 60).await;
    let tpm = f.rolling("tpm", 1 << 40, 60).await;
    let first = LeaseId::generate();
    let at = assert_allowed("first", &f.reserve(first, &[(&conc, 1), (&tpm, 100)]).await);
    f.complete(first, &[(&tpm, 40)]).await;
    for n in 0..SETTLED_AFTER {
        let (lease, outcome) = f.reserve_new(&[(&conc, 1), (&tpm, 100)]).await;
        assert_allowed("later", &outcome);
        f.complete(lease, &[(&tpm, 40)]).await;
        if n % 10 == 0 {
            f.advance(1).await;
        }
    }
    let held = 40 * (SETTLED_AFTER + 1);
    f.assert_in_use("every lease reconciled", &[(&conc, 0), (&tpm, held)])
        .await;
    let again = f.reserve(first, &[(&conc, 1), (&tpm, 100)]).await;
    assert_eq!(assert_allowed("retry of the first lease", &again), at);
    f.assert_in_use("the retry reserved nothing", &[(&conc, 0), (&tpm, held)])
        .await;
    let counters = backend.counters();
    assert_eq!(counters.settled_leases_evicted_total, 0);
    assert_eq!(counters.settled_leases_remembered, SETTLED_AFTER + 1);

    // Forgotten once later leases settled a retention, then another, after it.
    let retention_ms = 60_000 + LEASE_MEMORY_MARGIN_MS;
    for _ in 0..2 {
        f.advance(retention_ms).await;
        let (lease, _) = f.reserve_new(&[(&conc, 1)]).await;
        f.complete(lease, &[]).await;
    }
    let fresh = f.reserve(first, &[(&conc, 1), (&tpm, 100)]).await;
    assert!(assert_allowed("forgotten: granted anew", &fresh) > at);
    f.assert_in_use("reserved again", &[(&conc, 1), (&tpm, 100)]).await;
    assert_eq!(
        backend.counters().settled_leases_evicted_total,
        0,
        "forgotten in time, not early"
    );
}

#[tokio::test]
async fn the_settled_lease_bound_forgets_the_oldest_first_and_counts_them() {
    let config = MemoryConfig {
        settled_leases_max: 4,
        ..exact()
    };
    let h = harness(config);
    let backend = memory(&h, config);
    let f = Fixture::with_backend(&h, backend.clone());
    let conc = f.concurrency("conc", 10, 60).await;
    let mut leases = Vec::new();
    for _ in 0..5 {
        let (lease, outcome) = f.reserve_new(&[(&conc, 1)]).await;
        leases.push((lease, assert_allowed("fits", &outcome)));
        f.complete(lease, &[]).await;
        f.advance(1).await;
    }
    let counters = backend.counters();
    assert_eq!(
        (
            counters.settled_leases_evicted_total,
            counters.settled_leases_remembered
        ),
        (2, 3),
        "the fifth rotated out the generation of the first two"
    );
    let (kept, at) = leases[2];
    assert_eq!(assert_allowed("kept", &f.reserve(kept, &[(&conc, 1)]).await), at);
    f.assert_in_use("a replay reserves nothing", &[(&conc, 0)]).await;
    let (forgotten, at) = leases[0];
    let again = assert_allowed("forgotten", &f.reserve(forgotten, &[(&conc, 1)]).await);
    assert!(again > at, "granted anew");
    f.assert_in_use("reserved again", &[(&conc, 1)]).await;
}

/// A memory backend on the harness's clock, kept concrete for its counters.
fn memory(h: &MemoryHarness, config: MemoryConfig) -> Arc<MemoryBackend> {
    Arc::new(MemoryBackend::with_jitter(
        Arc::new(h.clock().clone()),
        config,
        Jitter::seeded(1),
    ))
}

#[tokio::test]
async fn denied_lease_ids_are_bounded_and_remembered_past_the_longest_window() {
    let config = MemoryConfig {
        failed_leases_max: 2,
        ..exact()
    };
    let h = harness(config);
    let backend = memory(&h, config);
    let f = Fixture::with_backend(&h, backend.clone());
    let rpm = f.rolling("rpm", 1, 1).await;
    assert_allowed("fill", &f.reserve_new(&[(&rpm, 1)]).await.1);
    let denied: Vec<LeaseId> = (0..3).map(|_| LeaseId::generate()).collect();
    for &lease in &denied {
        assert_insufficient("full", &f.reserve(lease, &[(&rpm, 1)]).await, &rpm);
    }
    let counters = backend.counters();
    assert_eq!(
        (counters.failed_leases_evicted_total, counters.failed_leases_remembered),
        (1, 2)
    );
    let forgotten = f.reserve(denied[0], &[(&rpm, 1)]).await;
    assert_insufficient("the oldest was forgotten, so it is judged again", &forgotten, &rpm);
    f.advance(1000 + LEASE_MEMORY_MARGIN_MS - 1).await;
    let still = f.reserve(denied[2], &[(&rpm, 1)]).await;
    assert_denied("within window and margin", &still, Denial::LeaseAlreadyFailed);
    f.advance(1).await;
    assert_allowed(
        "forgotten after window and margin",
        &f.reserve(denied[2], &[(&rpm, 1)]).await,
    );
}

#[tokio::test]
async fn overage_is_counted_and_a_window_already_over_holds_nothing() {
    let h = harness(exact());
    let backend = memory(&h, exact());
    let f = Fixture::with_backend(&h, backend.clone());
    let none = f.rolling("none", 10, 1).await;
    let debt = f.rolling_with("debt", 10, 1, Overage::Debt).await;
    let (lease, _) = f.reserve_new(&[(&none, 10)]).await;
    f.complete(lease, &[(&none, 15)]).await;
    assert_eq!(backend.counters().overage_dropped_total, 5);
    let (lease, outcome) = f.reserve_new(&[(&debt, 2)]).await;
    assert_allowed("debt", &outcome);
    f.advance(1000).await;
    f.complete(lease, &[(&debt, 7)]).await;
    let report = f.report(&debt).await;
    assert_eq!(
        (report.in_use, report.debt),
        (0, 5),
        "the window is over: the overage is debt"
    );
    let counters = backend.counters();
    assert_eq!((counters.overage_debt_total, counters.overage_dropped_total), (5, 5));
}

#[tokio::test]
async fn a_shorter_window_applies_to_new_holds_and_old_ones_keep_theirs() {
    let h = harness(exact());
    let f = Fixture::new(&h).await;
    let tpm = f.rolling("tpm", 10, 60).await;
    let (old, _) = f.reserve_new(&[(&tpm, 4)]).await;
    f.define(LimitDefinition::rolling(tpm.clone(), 10, 10).unwrap()).await;
    f.advance(1000).await;
    let (new, _) = f.reserve_new(&[(&tpm, 5)]).await;
    f.complete(old, &[(&tpm, 3)]).await;
    f.assert_in_use("both held", &[(&tpm, 8)]).await;
    f.advance(10_000).await;
    f.assert_in_use("the new hold ended first", &[(&tpm, 3)]).await;
    f.complete(new, &[(&tpm, 1)]).await;
    f.assert_in_use("an ended hold gives nothing back", &[(&tpm, 3)]).await;
    f.advance(49_000).await;
    f.assert_in_use("the old hold ended after its own window", &[(&tpm, 0)])
        .await;
}

#[tokio::test]
async fn states_from_the_registry_apply_as_given_and_kinds_never_change() {
    let h = harness(exact());
    let f = Fixture::new(&h).await;
    let key = f.key("budget");
    let decreasing = LimitState::decreasing(LimitDefinition::rolling(key.clone(), 10, 60).unwrap(), 5).unwrap();
    f.backend.apply_state(&decreasing).await.unwrap();
    let outcome = f.reserve_new(&[(&key, 1)]).await.1;
    let retry_after_ms = h.decrease_retry_ms();
    assert_denied(
        "decreasing at start",
        &outcome,
        Denial::LimitDecreasing {
            key: key.clone(),
            retry_after_ms,
        },
    );
    let applied = f.backend.apply_pending_decreases().await.unwrap();
    assert_eq!(applied, vec![decreasing.with_decrease_applied()]);
    let as_concurrency = LimitState::active(LimitDefinition::concurrency(key.clone(), 10, 60).unwrap());
    let result = f.backend.apply_state(&as_concurrency).await;
    assert!(matches!(result, Err(LimiterError::Conflict(_))), "{result:?}");
    assert_eq!(f.report(&key).await.state, decreasing.with_decrease_applied());
}

#[tokio::test]
async fn rolling_holds_last_the_window_plus_the_margin_and_concurrency_holds_their_timeout() {
    let config = MemoryConfig {
        window_margin_ms: 40,
        ..exact()
    };
    let h = harness(config);
    let f = Fixture::new(&h).await;
    let by_default = f.rolling("d", 1, 2).await;
    let given = LimitDefinition::rolling(LimitKey::new("test:given").unwrap(), 1, 2)
        .unwrap()
        .with_window_margin_ms(Some(300))
        .unwrap();
    f.backend.apply_definition(&given).await.unwrap();
    let given = given.key().clone();
    let conc = f.concurrency("c", 1, 1).await;
    assert_allowed(
        "all",
        &f.reserve_new(&[(&by_default, 1), (&given, 1), (&conc, 1)]).await.1,
    );
    f.advance(1000).await;
    assert_eq!(f.report(&conc).await.in_use, 0, "a concurrency timeout takes no margin");
    f.advance(1039).await;
    let hint = assert_insufficient(
        "default margin",
        &f.reserve_new(&[(&by_default, 1)]).await.1,
        &by_default,
    );
    assert_eq!(hint, 1, "the default margin's hold ends 2,040 ms after the grant");
    f.advance(1).await;
    assert_allowed(
        "window + default margin over",
        &f.reserve_new(&[(&by_default, 1)]).await.1,
    );
    f.advance(259).await;
    assert_eq!(f.report(&given).await.in_use, 1, "the definition's own margin wins");
    f.advance(1).await;
    assert_eq!(f.report(&given).await.in_use, 0);
}

#[tokio::test]
async fn reports_are_ordered_by_key_and_count_live_units_only() {
    let h = harness(exact());
    let f = Fixture::new(&h).await;
    let b = f.rolling("b", 10, 1).await;
    let a = f.concurrency("a", 10, 1).await;
    f.reserve_new(&[(&a, 2), (&b, 3)]).await;
    let reports = f.backend.limit_reports().await.unwrap();
    let keys: Vec<&LimitKey> = reports.iter().map(|r| r.state.definition().key()).collect();
    assert_eq!(keys, [&a, &b]);
    assert_eq!(reports.iter().map(|r| r.in_use).collect::<Vec<_>>(), [2, 3]);
    f.advance(1000).await;
    let reports = f.backend.limit_reports().await.unwrap();
    assert!(reports.iter().all(|r| r.in_use == 0));
    assert!(f.backend.health().await.is_ok());
}

#[test]
#[should_panic(expected = "leases_max must be at least 1")]
fn an_invalid_config_is_refused() {
    let config = MemoryConfig {
        leases_max: 0,
        ..Default::default()
    };
    assert!(config.validate().is_err());
    MemoryBackend::new(Arc::new(FakeClock::new(0)), config);
}

#[test]
fn settled_leases_max_is_checked() {
    for (settled_leases_max, valid) in [(1, false), (2, true), (SETTLED_LEASES_MAX_LIMIT, true)] {
        let config = MemoryConfig {
            settled_leases_max,
            ..Default::default()
        };
        assert_eq!(config.validate().is_ok(), valid, "{settled_leases_max}");
    }
    let too_many = MemoryConfig {
        settled_leases_max: SETTLED_LEASES_MAX_LIMIT + 1,
        ..Default::default()
    };
    assert!(too_many.validate().unwrap_err().contains("settled_leases_max"));
}

#[test]
fn the_config_reads_from_yaml_shaped_json_with_defaults() {
    let config: MemoryConfig =
        serde_json::from_str(r#"{"decrease_retry_ms":5000,"retry_policy":{"concurrency":{"base_ms":10}}}"#).unwrap();
    assert_eq!(config.decrease_retry_ms, 5000);
    assert_eq!(config.retry_policy.concurrency.fields().base_ms, 10);
    assert_eq!(config.leases_max, MemoryConfig::default().leases_max);
    assert_eq!(config.settled_leases_max, SETTLED_LEASES_MAX_DEFAULT);
    assert!(serde_json::from_str::<MemoryConfig>(r#"{"lease_max":1}"#).is_err());
}
