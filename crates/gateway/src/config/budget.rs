//! Budgets in money in the `gateway:` section (docs/gateway.md, "Budgets and
//! spend"): the types are the library's (`ratelimiter::price::budget`), shared
//! with the directory's tenants and keys that take the same `budgets` field.

pub use ratelimiter::price::budget::{
    validate_budgets, Budget, BudgetConfig, BudgetSpan, Written, ALERT_AT_MAX, BUDGETS_MAX, BUDGET_USD_MAX, CURRENCY,
};

#[cfg(test)]
mod tests {
    use super::*;
    use ratelimiter::Period;

    fn parse(yaml: &str) -> Result<Budget, String> {
        let config: BudgetConfig = serde_yaml::from_str(yaml).map_err(|e| e.to_string())?;
        config
            .validated()
            .map_err(|(field, message)| format!("{field}: {message}"))
    }

    #[test]
    fn budgets_are_whole_micro_dollars_over_a_period_or_a_window() {
        let month = parse("{usd: 500, period: month, alert_at: [1.0, 0.5, 0.8]}").unwrap();
        assert_eq!(month.micro_usd, 500_000_000);
        assert_eq!(month.span, BudgetSpan::Period(Period::Month));
        assert_eq!(month.alert_at, [0.5, 0.8, 1.0]);
        assert_eq!(month.span.key_suffix(), "usd:month");
        let hour = parse("{usd: 0.1, window_seconds: 3600, currency: usd}").unwrap();
        assert_eq!(hour.micro_usd, 100_000, "0.1 is exactly 100,000 micro-dollars");
        assert_eq!(hour.span.key_suffix(), "usd:window3600");
        assert_eq!(
            parse("{usd: 0.0000019, period: day}").unwrap().micro_usd,
            1,
            "rounded down"
        );
        assert_eq!(parse("{usd: 0, period: week}").unwrap().micro_usd, 0);
    }

    #[test]
    fn bad_budgets_are_refused_naming_the_field() {
        for (yaml, field) in [
            ("{usd: -1, period: day}", "usd:"),
            ("{usd: .nan, period: day}", "usd:"),
            ("{usd: .inf, period: day}", "usd:"),
            ("{usd: 1e12, period: day}", "usd:"),
            ("{usd: 5, period: year}", "period:"),
            ("{usd: 5}", "period:"),
            ("{usd: 5, period: day, window_seconds: 60}", "period:"),
            ("{usd: 5, window_seconds: 0}", "window_seconds:"),
            ("{usd: 5, window_seconds: 99999999}", "window_seconds:"),
            ("{usd: 5, period: day, currency: EUR}", "currency:"),
            ("{usd: 5, period: day, alert_at: [0]}", "alert_at:"),
            ("{usd: 5, period: day, alert_at: [1.5]}", "alert_at:"),
            ("{usd: 5, period: day, alert_at: [0.5, 0.5]}", "alert_at:"),
            ("{eur: 5, period: day}", "unknown field `eur`"),
        ] {
            let error = parse(yaml).unwrap_err();
            assert!(error.starts_with(field) || error.contains(field), "{yaml}: {error}");
        }
        let two: Vec<BudgetConfig> = serde_yaml::from_str("[{usd: 5, period: day}, {usd: 9, period: day}]").unwrap();
        let (entry, message) = validate_budgets(&two, &|f| format!("tenants[0].{f}")).unwrap_err();
        assert_eq!(entry, "tenants[0].budgets[1]");
        assert!(message.contains("same period"), "{message}");
    }
}
