use std::sync::Arc;

use ratelimiter::FakeClock;

use super::*;

const DAY_MS: u64 = 86_400_000;
/// 2026-11-28 00:00 UTC.
const DAY_START_MS: u64 = 1_795_824_000_000;
const FRACTIONS: [f64; 3] = [0.5, 0.8, 1.0];

fn tracker() -> (BudgetAlerts, FakeClock) {
    let clock = FakeClock::new(DAY_START_MS + 1_000);
    (BudgetAlerts::new(Arc::new(clock.clone())), clock)
}

fn daily(scope: &AlertScope, period_start_unix_ms: u64, spent_micro_usd: u64) -> BudgetReading<'_> {
    BudgetReading {
        key: "tenant:acme:usd:day",
        scope,
        span: AlertSpan::Period {
            period: "day".to_owned(),
            period_start_unix_ms,
        },
        spent_micro_usd,
        budget_micro_usd: 1_000_000,
        alert_at: &FRACTIONS,
        forgettable_after_unix_ms: period_start_unix_ms + DAY_MS,
    }
}

fn fractions(alerts: &[BudgetAlert]) -> Vec<f64> {
    alerts.iter().map(|a| a.fraction).collect()
}

#[test]
fn each_fraction_is_alerted_once_per_period_and_again_in_the_next() {
    let (alerts, clock) = tracker();
    let scope = AlertScope {
        tenant: Some("acme".to_owned()),
        model: None,
    };
    assert!(alerts.observe(&daily(&scope, DAY_START_MS, 499_999)).is_empty());
    let first = alerts.observe(&daily(&scope, DAY_START_MS, 500_000));
    assert_eq!(fractions(&first), [0.5]);
    assert_eq!(
        first[0].at_unix_ms,
        DAY_START_MS + 1_000,
        "read from the injected clock"
    );
    assert_eq!(first[0].budget, "tenant:acme:usd:day");
    assert_eq!(first[0].scope.tenant.as_deref(), Some("acme"));
    assert!(alerts.observe(&daily(&scope, DAY_START_MS, 700_000)).is_empty());
    // A reconciliation that lowers the spend does not re-arm within the period.
    assert!(alerts.observe(&daily(&scope, DAY_START_MS, 100_000)).is_empty());
    assert!(alerts.observe(&daily(&scope, DAY_START_MS, 600_000)).is_empty());
    // One jump over two fractions raises both, lowest first.
    clock.advance_ms(5_000);
    let both = alerts.observe(&daily(&scope, DAY_START_MS, 1_000_000));
    assert_eq!(fractions(&both), [0.8, 1.0]);
    assert_eq!(both[1].spent_micro_usd, 1_000_000);
    assert_eq!(both[1].at_unix_ms, DAY_START_MS + 6_000);
    assert!(alerts.observe(&daily(&scope, DAY_START_MS, 1_000_000)).is_empty());
    // The next day's period arms every fraction again.
    clock.advance_ms(DAY_MS);
    assert_eq!(
        fractions(&alerts.observe(&daily(&scope, DAY_START_MS + DAY_MS, 850_000))),
        [0.5, 0.8]
    );
}

#[test]
fn a_rolling_window_alerts_again_only_after_falling_below() {
    let (alerts, _clock) = tracker();
    let scope = AlertScope {
        tenant: None,
        model: Some("gpt-4o".to_owned()),
    };
    let reading = |spent_micro_usd| BudgetReading {
        key: "model:gpt-4o:usd:window3600",
        scope: &scope,
        span: AlertSpan::Window { window_seconds: 3_600 },
        spent_micro_usd,
        budget_micro_usd: 10,
        alert_at: &FRACTIONS,
        forgettable_after_unix_ms: DAY_START_MS + 3_601_000,
    };
    assert_eq!(fractions(&alerts.observe(&reading(5))), [0.5]);
    assert!(alerts.observe(&reading(7)).is_empty());
    // 0.8 of 10 is reached at 8.
    assert_eq!(fractions(&alerts.observe(&reading(8))), [0.8]);
    assert!(alerts.observe(&reading(9)).is_empty());
    // Spend leaves the window: 0.8 is armed again, 0.5 is still crossed.
    assert!(alerts.observe(&reading(6)).is_empty());
    assert_eq!(fractions(&alerts.observe(&reading(10))), [0.8, 1.0]);
    assert!(alerts.observe(&reading(0)).is_empty());
    assert_eq!(fractions(&alerts.observe(&reading(5))), [0.5]);
}

#[test]
fn budgets_are_tracked_apart_and_one_without_alerts_or_of_zero_raises_none() {
    let (alerts, _clock) = tracker();
    let scope = AlertScope::default();
    let mut gateway = daily(&scope, DAY_START_MS, 900_000);
    gateway.key = "gateway:usd:day";
    assert_eq!(fractions(&alerts.observe(&gateway)), [0.5, 0.8]);
    assert_eq!(
        fractions(&alerts.observe(&daily(&scope, DAY_START_MS, 900_000))),
        [0.5, 0.8]
    );
    let mut silent = daily(&scope, DAY_START_MS, 900_000);
    silent.key = "tenant:other:usd:day";
    silent.alert_at = &[];
    assert!(alerts.observe(&silent).is_empty());
    silent.alert_at = &FRACTIONS;
    silent.budget_micro_usd = 0;
    assert!(alerts.observe(&silent).is_empty());
    assert_eq!(alerts.untracked(), 0);
}

#[test]
fn an_alert_serializes_with_its_scope_and_period_flat() {
    let (alerts, _clock) = tracker();
    let scope = AlertScope {
        tenant: Some("acme".to_owned()),
        model: None,
    };
    let alert = alerts.observe(&daily(&scope, DAY_START_MS, 800_000)).remove(1);
    let json = serde_json::to_value(&alert).unwrap();
    assert_eq!(
        json,
        serde_json::json!({
            "type": "budget_alert", "budget": "tenant:acme:usd:day", "tenant": "acme", "model": null,
            "fraction": 0.8, "spent_micro_usd": 800_000, "spent_usd": 0.8,
            "budget_micro_usd": 1_000_000, "budget_usd": 1.0,
            "period": "day", "period_start_unix_ms": DAY_START_MS, "at_unix_ms": DAY_START_MS + 1_000,
        })
    );
}

#[test]
fn beyond_the_bound_a_budget_is_counted_until_ended_periods_are_forgotten() {
    let clock = FakeClock::new(DAY_START_MS + 1_000);
    let alerts = BudgetAlerts::with_budgets_max(Arc::new(clock.clone()), 2);
    let scope = AlertScope::default();
    let reading = |key, period_start_unix_ms| BudgetReading {
        key,
        ..daily(&scope, period_start_unix_ms, 600_000)
    };
    assert_eq!(
        fractions(&alerts.observe(&reading("key:a:usd:day", DAY_START_MS))),
        [0.5]
    );
    assert_eq!(
        fractions(&alerts.observe(&reading("key:b:usd:day", DAY_START_MS))),
        [0.5]
    );
    // A third budget finds the bound reached, and the two still in their period.
    assert!(alerts.observe(&reading("key:c:usd:day", DAY_START_MS)).is_empty());
    assert_eq!((alerts.watched(), alerts.untracked()), (2, 1));
    // A budget already watched still is.
    clock.advance_ms(1_000);
    assert!(alerts.observe(&reading("key:a:usd:day", DAY_START_MS)).is_empty());
    // The next day, the first reading sweeps both away: the third is watched.
    clock.advance_ms(DAY_MS);
    let next_day = DAY_START_MS + DAY_MS;
    assert_eq!(fractions(&alerts.observe(&reading("key:c:usd:day", next_day))), [0.5]);
    assert_eq!((alerts.watched(), alerts.untracked()), (1, 1));
    // Within the sweep interval nothing is swept again: a fourth fits, a fifth
    // is counted.
    assert_eq!(fractions(&alerts.observe(&reading("key:d:usd:day", next_day))), [0.5]);
    assert!(alerts.observe(&reading("key:e:usd:day", next_day)).is_empty());
    assert_eq!((alerts.watched(), alerts.untracked()), (2, 2));
}
