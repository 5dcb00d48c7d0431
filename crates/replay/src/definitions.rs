//! The limiter's definitions for a run: one per provider limit (requests,
//! tokens, calls in flight), with the provider's capacities.

use ratelimiter::{LimitDefinition, LimitKey};

use crate::names::{MODEL, PROVIDER};
use crate::sim::limits::ProviderLimits;

/// How long a concurrency hold lives when its client crashed without completing,
/// in seconds: far longer than any simulated call, so it only matters after a crash.
pub const CONCURRENCY_TIMEOUT_SECONDS: u64 = 300;

/// The definitions that follow `limits` exactly as the provider documents them:
/// rpm and tpm as rolling limits over the provider's window, and the concurrency
/// limit. `window_margin_ms`, when given, is each rolling limit's margin; `None`
/// leaves it to the backend's default, as a user who tunes nothing would.
///
/// The margin exists because the provider starts a request's window when the
/// call reaches it, a moment after the grant; a reservation that expires before
/// the provider's entry does could admit one request too many. An invalid
/// margin (above 60,000 ms or the window) is an error naming it.
pub fn limiter_definitions(
    limits: &ProviderLimits,
    window_margin_ms: Option<u64>,
) -> Result<Vec<LimitDefinition>, String> {
    let window_seconds = limits.window_ms.div_ceil(1000);
    let key = |k: Result<LimitKey, _>| k.expect("the replay's provider and model names are valid key parts");
    let rolling = |k: LimitKey, capacity: u64| {
        LimitDefinition::rolling(k, capacity, window_seconds)
            .and_then(|d| d.with_window_margin_ms(window_margin_ms))
            .map_err(|e| format!("--limiter-window-margin-ms: {e}"))
    };
    Ok(vec![
        rolling(key(LimitKey::llm_rpm(PROVIDER, MODEL)), limits.rpm)?,
        rolling(key(LimitKey::llm_tpm(PROVIDER, MODEL)), limits.tpm)?,
        LimitDefinition::concurrency(
            key(LimitKey::llm_concurrency(PROVIDER, MODEL)),
            limits.concurrency,
            CONCURRENCY_TIMEOUT_SECONDS,
        )
        .expect("a valid concurrency definition"),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::limits::Accounting;

    #[test]
    fn definitions_follow_the_provider() {
        let limits = ProviderLimits {
            rpm: 100,
            tpm: 5_000,
            window_ms: 60_000,
            concurrency: 8,
            ms_per_output_token: 1,
            accounting: Accounting::Actual,
        };
        let shape = |margin: Option<u64>| -> Vec<(String, u64, u64, Option<u64>, u64)> {
            (limiter_definitions(&limits, margin).unwrap().iter())
                .map(|d| {
                    let key = d.key().as_str().to_owned();
                    (
                        key,
                        d.capacity(),
                        d.window_seconds(),
                        d.window_margin_ms(),
                        d.timeout_seconds(),
                    )
                })
                .collect()
        };
        let expected = |margin: Option<u64>| {
            vec![
                ("global:llm:sim:sim-model:rpm".to_owned(), 100, 60, margin, 0),
                ("global:llm:sim:sim-model:tpm".to_owned(), 5_000, 60, margin, 0),
                ("global:llm:sim:sim-model:concurrency".to_owned(), 8, 0, None, 300),
            ]
        };
        for margin in [None, Some(0), Some(250)] {
            assert_eq!(shape(margin), expected(margin));
        }
        let held: Vec<u64> = (limiter_definitions(&limits, Some(250)).unwrap().iter())
            .map(|d| d.hold_with_margin_ms(ratelimiter::WINDOW_MARGIN_MS_DEFAULT))
            .collect();
        assert_eq!(
            held,
            [60_250, 60_250, 300_000],
            "window + margin; the timeout takes none"
        );
        let message = limiter_definitions(&limits, Some(60_001)).unwrap_err();
        assert!(message.contains("--limiter-window-margin-ms"), "{message}");
    }
}
