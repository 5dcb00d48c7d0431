//! Learning from a provider's answer (docs/provider-profiles.md, "Learning from the
//! headers"): reads the rate-limit headers of a response (`x-ratelimit-*` of OpenAI
//! and Azure, `anthropic-ratelimit-*`, `retry-after`, `retry-after-ms`) into what the
//! provider says its limits are, and compares them with the definitions configured,
//! so that a limit configured above the provider's is reported instead of met as 429s.

use crate::definition::LimitDefinition;

/// The most headers read from one response: a provider sends a dozen.
pub const HEADERS_MAX: usize = 256;

/// What a provider's headers say about one of its limits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProviderLimit {
    /// The dimension as in our keys: `rpm`, `tpm`, `itpm`, `otpm`.
    pub dimension: &'static str,
    /// The provider's limit, when sent.
    pub limit: Option<u64>,
    /// What it has left, when sent.
    pub remaining: Option<u64>,
}

/// What a response's headers say.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProviderHeaders {
    /// Each limit the headers named.
    pub limits: Vec<ProviderLimit>,
    /// `retry-after-ms`, else `retry-after` in seconds, in ms.
    pub retry_after_ms: Option<u64>,
}

/// A limit configured above the provider's own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LimitMismatch {
    /// The definition's key.
    pub key: String,
    /// Its capacity per minute as configured.
    pub configured_per_minute: u64,
    /// The provider's limit.
    pub provider_limit: u64,
}

/// The header names of each dimension: (dimension, limit header, remaining header).
const NAMES: [(&str, &str, &str); 6] = [
    ("rpm", "x-ratelimit-limit-requests", "x-ratelimit-remaining-requests"),
    ("tpm", "x-ratelimit-limit-tokens", "x-ratelimit-remaining-tokens"),
    (
        "rpm",
        "anthropic-ratelimit-requests-limit",
        "anthropic-ratelimit-requests-remaining",
    ),
    (
        "itpm",
        "anthropic-ratelimit-input-tokens-limit",
        "anthropic-ratelimit-input-tokens-remaining",
    ),
    (
        "otpm",
        "anthropic-ratelimit-output-tokens-limit",
        "anthropic-ratelimit-output-tokens-remaining",
    ),
    (
        "tpm",
        "anthropic-ratelimit-tokens-limit",
        "anthropic-ratelimit-tokens-remaining",
    ),
];

/// Reads `headers` (name, value; names in any case). Values that are not whole
/// numbers are ignored, as a provider's header is advice, not input to trust.
pub fn read_headers<'a>(headers: impl IntoIterator<Item = (&'a str, &'a str)>) -> ProviderHeaders {
    let headers: Vec<(String, &str)> = (headers.into_iter().take(HEADERS_MAX))
        .map(|(name, value)| (name.to_ascii_lowercase(), value.trim()))
        .collect();
    let number = |name: &str| {
        (headers.iter())
            .find(|(n, _)| n == name)
            .and_then(|(_, v)| v.parse::<u64>().ok())
    };
    // Retry hints may be fractional ("retry-after-ms: 150.5"); rounded up, never shorter.
    let hint = |name: &str, scale: f64| {
        let value = headers.iter().find(|(n, _)| n == name)?.1.parse::<f64>().ok()? * scale;
        (value.is_finite() && value >= 0.0).then(|| value.ceil() as u64)
    };
    let mut read = ProviderHeaders {
        retry_after_ms: hint("retry-after-ms", 1.0).or_else(|| hint("retry-after", 1_000.0)),
        ..ProviderHeaders::default()
    };
    for (dimension, limit, remaining) in NAMES {
        let (limit, remaining) = (number(limit), number(remaining));
        let seen = read.limits.iter().any(|l| l.dimension == dimension);
        if (limit.is_some() || remaining.is_some()) && !seen {
            read.limits.push(ProviderLimit {
                dimension,
                limit,
                remaining,
            });
        }
    }
    read
}

/// The definitions among `definitions` of `provider`'s `model` configured above the
/// limit the provider's headers report (compared per minute: a sub-window's share
/// is scaled to the minute).
pub fn below_configured(
    read: &ProviderHeaders,
    provider: &str,
    model: &str,
    definitions: &[LimitDefinition],
) -> Vec<LimitMismatch> {
    let prefix = format!("global:llm:{provider}:{model}:");
    let mut mismatches = Vec::new();
    for definition in definitions {
        let Some(dimension) = definition.key().as_str().strip_prefix(&prefix) else {
            continue;
        };
        let window_seconds = definition.window_seconds();
        if window_seconds == 0 || window_seconds > 60 {
            continue;
        }
        let per_minute = definition.capacity().saturating_mul(60 / window_seconds);
        let provider_limit = (read.limits.iter())
            .find(|l| l.dimension == dimension)
            .and_then(|l| l.limit);
        if let Some(provider_limit) = provider_limit.filter(|&limit| per_minute > limit) {
            mismatches.push(LimitMismatch {
                key: definition.key().as_str().to_owned(),
                configured_per_minute: per_minute,
                provider_limit,
            });
        }
    }
    mismatches
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::LimitKey;

    #[test]
    fn openai_and_anthropic_headers_are_read_and_a_higher_configuration_reported() {
        let read = read_headers([
            ("X-RateLimit-Limit-Requests", "500"),
            ("x-ratelimit-remaining-requests", "499"),
            ("x-ratelimit-limit-tokens", "30000"),
            ("x-ratelimit-remaining-tokens", "not a number"),
            ("retry-after", "2"),
        ]);
        assert_eq!(read.retry_after_ms, Some(2_000));
        assert_eq!(
            read.limits,
            [
                ProviderLimit {
                    dimension: "rpm",
                    limit: Some(500),
                    remaining: Some(499)
                },
                ProviderLimit {
                    dimension: "tpm",
                    limit: Some(30_000),
                    remaining: None
                },
            ]
        );
        let definitions = [
            LimitDefinition::rolling(LimitKey::new("global:llm:openai:gpt-4o:rpm").unwrap(), 9, 1).unwrap(),
            LimitDefinition::rolling(LimitKey::new("global:llm:openai:gpt-4o:tpm").unwrap(), 30_000, 60).unwrap(),
        ];
        let mismatches = below_configured(&read, "openai", "gpt-4o", &definitions);
        assert_eq!(
            mismatches,
            [LimitMismatch {
                key: "global:llm:openai:gpt-4o:rpm".to_owned(),
                configured_per_minute: 540,
                provider_limit: 500
            }],
            "9 a second is 540 a minute, above the provider's 500"
        );
        let anthropic = read_headers([
            ("anthropic-ratelimit-output-tokens-limit", "8000"),
            ("retry-after-ms", "1500"),
            ("retry-after", "2"),
        ]);
        assert_eq!(anthropic.retry_after_ms, Some(1_500));
        assert_eq!(read_headers([("retry-after-ms", "150.5")]).retry_after_ms, Some(151));
        assert_eq!(anthropic.limits[0].dimension, "otpm");
    }
}
