//! The definitions' and states' rules, their JSON form and the bucket shape of a definition.

use super::*;
use crate::base::period::Period;
use crate::model::bucket::BucketShape;
use crate::model::key::LimitKey;

fn key(k: &str) -> LimitKey {
    LimitKey::new(k).unwrap()
}

#[test]
fn definitions_serialize_with_the_spec_field_names() {
    let json = r#"{"key":"global:llm:openai:gpt-4o:rpm","kind":"rolling","capacity":3000,"window_seconds":60,"timeout_seconds":0,"unit":"requests","description":"OpenAI gpt-4o requests per minute"}"#;
    let def: LimitDefinition = serde_json::from_str(json).unwrap();
    assert_eq!(def.capacity(), 3000);
    assert_eq!(def.overage(), Overage::None);
    let back: serde_json::Value = serde_json::to_value(&def).unwrap();
    assert_eq!(back["overage"], "none");
    assert_eq!(back["window_seconds"], 60);
    assert_eq!(back["kind"], "rolling");
    let debt: LimitDefinition =
        serde_json::from_str(r#"{"key":"c","kind":"concurrency","capacity":2,"timeout_seconds":300,"overage":"debt"}"#)
            .unwrap();
    assert_eq!(debt.overage(), Overage::Debt);
    assert_eq!(debt.hold_ms(), 300_000);
}

#[test]
fn invalid_definitions_are_rejected() {
    for bad in [
        r#"{"key":"k","kind":"rolling","capacity":0,"window_seconds":60}"#,
        r#"{"key":"k","kind":"rolling","capacity":1,"window_seconds":0}"#,
        r#"{"key":"k","kind":"rolling","capacity":1,"window_seconds":2678401}"#,
        r#"{"key":"k","kind":"rolling","capacity":1,"window_seconds":60,"timeout_seconds":5}"#,
        r#"{"key":"k","kind":"concurrency","capacity":1,"timeout_seconds":0}"#,
        r#"{"key":"k","kind":"concurrency","capacity":1,"timeout_seconds":86401}"#,
        r#"{"key":"k","kind":"concurrency","capacity":1,"timeout_seconds":5,"window_seconds":5}"#,
        r#"{"key":"k","kind":"bucket","capacity":1,"window_seconds":60}"#,
        r#"{"key":"k","kind":"rolling","capacity":-1,"window_seconds":60}"#,
        r#"{"key":"k","kind":"rolling","capacity":1,"window_seconds":60,"capacty":2}"#,
        r#"{"key":"bad key","kind":"rolling","capacity":1,"window_seconds":60}"#,
        r#"{"key":"k","kind":"rolling","capacity":1,"window_seconds":60,"overage":"forgive"}"#,
    ] {
        assert!(serde_json::from_str::<LimitDefinition>(bad).is_err(), "{bad}");
    }
    let long_unit = format!(
        r#"{{"key":"k","kind":"rolling","capacity":1,"window_seconds":60,"unit":"{}"}}"#,
        "u".repeat(UNIT_BYTES_MAX + 1)
    );
    assert!(serde_json::from_str::<LimitDefinition>(&long_unit).is_err());
}

#[test]
fn window_margins_are_optional_bounded_and_kept_as_given() {
    let given = r#"{"key":"k","kind":"rolling","capacity":1,"window_seconds":10,"window_margin_ms":250}"#;
    let def: LimitDefinition = serde_json::from_str(given).unwrap();
    assert_eq!(def.window_margin_ms(), Some(250));
    assert_eq!(def.hold_with_margin_ms(WINDOW_MARGIN_MS_DEFAULT), 10_250);
    let minute = LimitDefinition::rolling(LimitKey::new("k").unwrap(), 1, 60).unwrap();
    assert_eq!(
        minute.hold_with_margin_ms(WINDOW_MARGIN_MS_DEFAULT),
        60_240,
        "0.4 % of a long window"
    );
    let short = LimitDefinition::rolling(LimitKey::new("k").unwrap(), 1, 10).unwrap();
    assert_eq!(
        short.hold_with_margin_ms(WINDOW_MARGIN_MS_DEFAULT),
        10_050,
        "the floor of a short one"
    );
    assert_eq!(serde_json::to_value(&def).unwrap()["window_margin_ms"], 250);

    let absent: LimitDefinition =
        serde_json::from_str(r#"{"key":"k","kind":"rolling","capacity":1,"window_seconds":10}"#).unwrap();
    assert_eq!(absent.window_margin_ms(), None);
    assert_eq!(absent.hold_with_margin_ms(40), 10_040);
    assert!(serde_json::to_value(&absent).unwrap().get("window_margin_ms").is_none());
    let zero = absent.with_window_margin_ms(Some(0)).unwrap();
    assert_eq!(zero.hold_with_margin_ms(40), 10_000);

    let conc = LimitDefinition::concurrency(key("c"), 1, 30).unwrap();
    assert_eq!(conc.hold_with_margin_ms(40), 30_000);
    assert!(conc.with_window_margin_ms(Some(10)).is_err());
    let max = format!(
        r#"{{"key":"k","kind":"rolling","capacity":1,"window_seconds":600,"window_margin_ms":{WINDOW_MARGIN_MS_MAX}}}"#
    );
    assert!(serde_json::from_str::<LimitDefinition>(&max).is_ok());
    for bad in [
        format!(
            r#"{{"key":"k","kind":"rolling","capacity":1,"window_seconds":600,"window_margin_ms":{}}}"#,
            WINDOW_MARGIN_MS_MAX + 1
        ),
        r#"{"key":"k","kind":"rolling","capacity":1,"window_seconds":1,"window_margin_ms":1001}"#.to_owned(),
        r#"{"key":"k","kind":"rolling","capacity":1,"window_seconds":1,"window_margin_ms":-1}"#.to_owned(),
    ] {
        assert!(serde_json::from_str::<LimitDefinition>(&bad).is_err(), "{bad}");
    }
    assert!(check_window_margin_ms(WINDOW_MARGIN_MS_DEFAULT, 0).is_ok());
    assert!(check_window_margin_ms(WINDOW_MARGIN_MS_MAX + 1, 0).is_err());
}

#[test]
fn states_keep_the_window_margin_as_given() {
    let def = LimitDefinition::rolling(key("k"), 100, 60).unwrap();
    for margin in [None, Some(0), Some(75)] {
        let state = LimitState::active(def.with_window_margin_ms(margin).unwrap());
        let json = serde_json::to_string(&state).unwrap();
        assert_eq!(json.contains("window_margin_ms"), margin.is_some(), "{json}");
        assert_eq!(serde_json::from_str::<LimitState>(&json).unwrap(), state);
    }
}

#[test]
fn periods_are_rolling_limits_without_a_window() {
    let json = r#"{"key":"tenant:acme:usd","kind":"rolling","capacity":20000000,"period":"day"}"#;
    let def: LimitDefinition = serde_json::from_str(json).unwrap();
    assert_eq!(def.period(), Some(Period::Day));
    assert_eq!(
        def,
        LimitDefinition::per_period(key("tenant:acme:usd"), 20_000_000, Period::Day).unwrap()
    );
    assert_eq!(def.hold_ms(), 86_400_000);
    assert_eq!(
        def.hold_with_margin_ms(WINDOW_MARGIN_MS_DEFAULT),
        86_400_000,
        "no margin"
    );
    // 2026-11-28T12:00Z: held to midnight, not for 24 hours.
    assert_eq!(def.hold_end_unix_ms(1_795_867_200_000, 50), 1_795_910_400_000);
    let rolling = LimitDefinition::rolling(key("k"), 1, 60).unwrap();
    assert_eq!(rolling.hold_end_unix_ms(1_000, 50), 1_000 + 60_240);
    assert_eq!(serde_json::to_value(&def).unwrap()["period"], "day");
    assert!(serde_json::to_value(&rolling).unwrap().get("period").is_none());
    for period in ["week", "month"] {
        let json = format!(r#"{{"key":"k","kind":"rolling","capacity":1,"period":"{period}"}}"#);
        assert!(serde_json::from_str::<LimitDefinition>(&json).is_ok(), "{period}");
    }
    for bad in [
        r#"{"key":"k","kind":"rolling","capacity":1,"period":"year"}"#,
        r#"{"key":"k","kind":"rolling","capacity":1,"period":"day","window_seconds":86400}"#,
        r#"{"key":"k","kind":"rolling","capacity":1,"period":"day","window_margin_ms":0}"#,
        r#"{"key":"k","kind":"rolling","capacity":0,"period":"day"}"#,
        r#"{"key":"k","kind":"bucket","capacity":100,"period":"day"}"#,
        r#"{"key":"k","kind":"concurrency","capacity":1,"timeout_seconds":5,"period":"day"}"#,
    ] {
        assert!(serde_json::from_str::<LimitDefinition>(bad).is_err(), "{bad}");
    }
    let long_unit = format!(
        r#"{{"key":"k","kind":"rolling","capacity":1,"period":"day","unit":"{}"}}"#,
        "u".repeat(UNIT_BYTES_MAX + 1)
    );
    assert!(
        serde_json::from_str::<LimitDefinition>(&long_unit).is_err(),
        "labels are checked too"
    );
}

#[test]
fn states_carry_the_period_and_old_records_still_decode() {
    let def = LimitDefinition::per_period(key("k"), 500, Period::Month).unwrap();
    let state = LimitState::decreasing(def, 100).unwrap();
    let json = serde_json::to_string(&state).unwrap();
    assert!(json.contains(r#""period":"month""#), "{json}");
    assert_eq!(serde_json::from_str::<LimitState>(&json).unwrap(), state);
    // A record written before periods existed: no field, the rolling window.
    let old = r#"{"key":"k","kind":"rolling","capacity":5,"window_seconds":60,"timeout_seconds":0,"unit":"","description":"","overage":"none","status":"active","pending_decrease_to":0}"#;
    let decoded: LimitState = serde_json::from_str(old).unwrap();
    assert_eq!(decoded.definition().period(), None);
    assert_eq!(serde_json::to_string(&decoded).unwrap(), old, "re-encoded the same");
}

#[test]
fn increases_apply_at_once_and_decreases_wait() {
    let def = LimitDefinition::rolling(key("k"), 100, 60).unwrap();
    let first = LimitState::after_definition(None, def.clone()).unwrap();
    assert_eq!(first.status(), LimitStatus::Active);

    let up = LimitState::after_definition(Some(&first), def.with_capacity(150).unwrap()).unwrap();
    assert_eq!((up.status(), up.definition().capacity()), (LimitStatus::Active, 150));

    let down = LimitState::after_definition(Some(&up), def.with_capacity(40).unwrap()).unwrap();
    assert_eq!(down.status(), LimitStatus::Decreasing);
    assert_eq!(down.definition().capacity(), 150);
    assert_eq!(down.pending_decrease_to(), 40);

    let applied = down.with_decrease_applied();
    assert_eq!(
        (applied.status(), applied.definition().capacity()),
        (LimitStatus::Active, 40)
    );

    let cancelled = LimitState::after_definition(Some(&down), def.with_capacity(150).unwrap()).unwrap();
    assert_eq!(cancelled.status(), LimitStatus::Active);
}

#[test]
fn kind_cannot_change() {
    let rolling = LimitState::active(LimitDefinition::rolling(key("k"), 1, 60).unwrap());
    let conc = LimitDefinition::concurrency(key("k"), 1, 60).unwrap();
    assert!(matches!(
        LimitState::after_definition(Some(&rolling), conc),
        Err(DefinitionError::KindChange { .. })
    ));
}

#[test]
fn states_round_trip_and_validate() {
    let def = LimitDefinition::rolling(key("k"), 100, 60).unwrap();
    let state = LimitState::decreasing(def, 10).unwrap();
    let json = serde_json::to_value(&state).unwrap();
    assert_eq!(json["status"], "decreasing");
    assert_eq!(json["pending_decrease_to"], 10);
    assert_eq!(serde_json::from_value::<LimitState>(json).unwrap(), state);

    let bad = r#"{"key":"k","kind":"rolling","capacity":5,"window_seconds":60,"status":"decreasing","pending_decrease_to":9}"#;
    assert!(serde_json::from_str::<LimitState>(bad).is_err());
    let bad =
        r#"{"key":"k","kind":"rolling","capacity":5,"window_seconds":60,"status":"active","pending_decrease_to":2}"#;
    assert!(serde_json::from_str::<LimitState>(bad).is_err());
}

#[test]
fn reports_are_flat() {
    let state = LimitState::active(LimitDefinition::concurrency(key("c"), 3, 30).unwrap());
    let report = LimitReport {
        state,
        in_use: 2,
        debt: 0,
        owing: false,
    };
    let json = serde_json::to_value(&report).unwrap();
    for field in [
        "key",
        "kind",
        "capacity",
        "status",
        "pending_decrease_to",
        "in_use",
        "debt",
        "overage",
    ] {
        assert!(json.get(field).is_some(), "{field}");
    }
}

#[test]
fn a_definition_without_burst_under_the_margin_is_refused() {
    let key = LimitKey::new("b").unwrap();
    let definition = LimitDefinition::bucket(key, 3, 1).unwrap();
    let refused = BucketShape::new(&definition, 60_000).unwrap_err();
    assert!(refused.to_string().contains("keeps no burst"), "{refused}");
    assert_eq!(BucketShape::new(&definition, 0).unwrap().burst(), 2);
}
