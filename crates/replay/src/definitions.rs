//! The limiter's definitions for a run: one per provider limit (requests,
//! tokens, calls in flight), with the provider's capacities.

use ratelimiter::{LimitDefinition, LimitKey};

use crate::provider::ProviderLimits;
use crate::run::{MODEL, PROVIDER};

/// How long a concurrency hold lives when its client crashed without completing,
/// in seconds: far longer than any simulated call, so it only matters after a crash.
pub const CONCURRENCY_TIMEOUT_SECONDS: u64 = 300;

/// The definitions that follow `limits`: rpm and tpm as rolling limits over the
/// provider's window plus `window_margin_seconds`, and the concurrency limit.
///
/// The margin exists because the provider starts a request's window when the
/// request reaches it, a moment after the limiter reserved it; a reservation that
/// expires before the provider's entry does could admit one request too many.
pub fn limiter_definitions(limits: &ProviderLimits, window_margin_seconds: u64) -> Vec<LimitDefinition> {
    let window_seconds = limits.window_ms.div_ceil(1000) + window_margin_seconds;
    let key = |k: Result<LimitKey, _>| k.expect("the replay's provider and model names are valid key parts");
    vec![
        LimitDefinition::rolling(key(LimitKey::llm_rpm(PROVIDER, MODEL)), limits.rpm, window_seconds)
            .expect("a valid rpm definition"),
        LimitDefinition::rolling(key(LimitKey::llm_tpm(PROVIDER, MODEL)), limits.tpm, window_seconds)
            .expect("a valid tpm definition"),
        LimitDefinition::concurrency(
            key(LimitKey::llm_concurrency(PROVIDER, MODEL)),
            limits.concurrency,
            CONCURRENCY_TIMEOUT_SECONDS,
        )
        .expect("a valid concurrency definition"),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::Accounting;

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
        let defs = limiter_definitions(&limits, 1);
        let got: Vec<(&str, u64, u64, u64)> = defs
            .iter()
            .map(|d| (d.key().as_str(), d.capacity(), d.window_seconds(), d.timeout_seconds()))
            .collect();
        assert_eq!(
            got,
            vec![
                ("global:llm:sim:sim-model:rpm", 100, 61, 0),
                ("global:llm:sim:sim-model:tpm", 5_000, 61, 0),
                ("global:llm:sim:sim-model:concurrency", 8, 0, 300),
            ]
        );
    }
}
