//! The scenarios of budgets that owe (`overage: owe`): usage a limit could not
//! hold makes it refuse every reservation until the window or period that
//! usage belongs to ends, however much its holds free meanwhile.

use crate::base::period::Period;
use crate::model::definition::{LimitDefinition, Overage};
use crate::model::wire::Denial;

use super::scenarios::{assert_allowed, assert_denied, assert_insufficient};
use super::{Fixture, Harness};

/// A rolling budget that owes refuses until the owing window ends, even when
/// a call in flight frees room; `overage: debt` on the same usage keeps
/// admitting (debt is only a report there).
pub async fn owing_refuses_until_its_window_ends(h: &dyn Harness) {
    let f = Fixture::new(h).await;
    let owe = f.rolling_with("owe", 10, 2, Overage::Owe).await;
    let debt = f.rolling_with("debt", 10, 2, Overage::Debt).await;
    let (first, outcome) = f.reserve_new(&[(&owe, 4), (&debt, 4)]).await;
    assert_allowed("first", &outcome);
    let (second, outcome) = f.reserve_new(&[(&owe, 4), (&debt, 4)]).await;
    assert_allowed("second", &outcome);
    assert!(!f.report(&owe).await.owing, "nothing owed yet");
    // Billed 9 where 4 was reserved: 5 more do not fit in the 2 left.
    f.complete(first, &[(&owe, 9), (&debt, 9)]).await;
    let report = f.report(&owe).await;
    assert_eq!((report.in_use, report.debt, report.owing), (8, 5, true), "owing");
    assert_eq!(report.available(), 0, "nothing is left of a budget that owes");
    let (_, outcome) = f.reserve_new(&[(&owe, 1)]).await;
    assert_insufficient("an owing budget refuses what would fit", &outcome, &owe);
    // The call in flight used 1 of its 4: 3 freed, and still nothing admitted.
    f.complete(second, &[(&owe, 1), (&debt, 1)]).await;
    f.assert_in_use("the second call shrank", &[(&owe, 5), (&debt, 5)])
        .await;
    let (_, outcome) = f.reserve_new(&[(&owe, 1)]).await;
    assert_insufficient("room freed while owing is not handed out", &outcome, &owe);
    let (_, outcome) = f.reserve_new(&[(&debt, 1)]).await;
    assert_allowed("overage: debt does not refuse", &outcome);
    // The owed usage's window ends: the budget admits again.
    f.advance(2_000).await;
    wait_until_not_owing(&f, &owe).await;
    let (_, outcome) = f.reserve_new(&[(&owe, 10)]).await;
    assert_allowed("after the window, the whole budget", &outcome);
}

/// A budget with a calendar period that owes refuses as a spent period does:
/// `exceeds_capacity`, final until the period ends, whatever the amount.
pub async fn owing_in_a_period_is_final(h: &dyn Harness) {
    let f = Fixture::new(h).await;
    let key = f.key("owe-day");
    let definition = LimitDefinition::per_period(key.clone(), 100, Period::Day)
        .expect("valid")
        .with_overage(Overage::Owe);
    f.define(definition).await;
    let (first, outcome) = f.reserve_new(&[(&key, 50)]).await;
    assert_allowed("first", &outcome);
    let (second, outcome) = f.reserve_new(&[(&key, 50)]).await;
    assert_allowed("second", &outcome);
    f.complete(first, &[(&key, 80)]).await;
    assert!(f.report(&key).await.owing, "30 more did not fit: owing");
    f.complete(second, &[(&key, 0)]).await;
    let (_, outcome) = f.reserve_new(&[(&key, 1)]).await;
    assert_denied(
        "an owing period is spent until it ends",
        &outcome,
        Denial::ExceedsCapacity { key: key.clone() },
    );
}

/// Polls until `key` no longer owes, for at most the expiry slack.
async fn wait_until_not_owing(f: &Fixture<'_>, key: &crate::model::key::LimitKey) {
    let slack_ms = f.harness().expiry_slack_ms();
    let mut waited_ms = 0;
    while f.report(key).await.owing {
        assert!(waited_ms < slack_ms, "{key} still owes {slack_ms} ms after its window");
        let step_ms = 100.min(slack_ms - waited_ms).max(1);
        f.advance(step_ms).await;
        waited_ms += step_ms;
    }
}
