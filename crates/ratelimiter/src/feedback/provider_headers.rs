//! Learning from a provider's answer (docs/provider-profiles.md, "Learning from the
//! headers"): reads the rate-limit headers of a response (`x-ratelimit-*` of OpenAI
//! and Azure, `anthropic-ratelimit-*`, `retry-after`, `retry-after-ms`) into what the
//! provider says its limits are, and compares them with the definitions configured,
//! so that a limit configured above the provider's is reported instead of met as 429s.

use crate::limiting::limiter::Backend;
use crate::model::definition::LimitDefinition;
use crate::model::error::LimiterError;

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
    /// How long until the provider's limit is back, in ms from the response, when
    /// sent: OpenAI's `x-ratelimit-reset-*` (a duration such as `6m0s`) or Anthropic's
    /// `anthropic-ratelimit-*-reset` (an RFC 3339 instant), rounded up.
    pub reset_ms: Option<u64>,
}

/// What a response's headers say.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProviderHeaders {
    /// Each limit the headers named.
    pub limits: Vec<ProviderLimit>,
    /// `retry-after-ms`, else `retry-after` in seconds, in ms.
    pub retry_after_ms: Option<u64>,
}

impl ProviderHeaders {
    /// How long the provider asks to wait after a 429, in ms: its retry hint when it
    /// sent one; else the latest reset of the limits it reports exhausted (none
    /// remaining), since the call waits for all of them; else the earliest reset it
    /// sent, the first moment any of its limits frees. `None` when it named no time.
    pub fn wait_ms(&self) -> Option<u64> {
        if self.retry_after_ms.is_some() {
            return self.retry_after_ms;
        }
        let exhausted = (self.limits.iter())
            .filter(|l| l.remaining == Some(0))
            .filter_map(|l| l.reset_ms)
            .max();
        exhausted.or_else(|| self.limits.iter().filter_map(|l| l.reset_ms).min())
    }
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

/// The header names of each dimension: (dimension, limit, remaining, reset), OpenAI's
/// (<https://platform.openai.com/docs/guides/rate-limits#rate-limits-in-headers>, also
/// sent by Azure OpenAI) and Anthropic's
/// (<https://docs.anthropic.com/en/api/rate-limits#response-headers>).
const NAMES: [(&str, &str, &str, &str); 6] = [
    (
        "rpm",
        "x-ratelimit-limit-requests",
        "x-ratelimit-remaining-requests",
        "x-ratelimit-reset-requests",
    ),
    (
        "tpm",
        "x-ratelimit-limit-tokens",
        "x-ratelimit-remaining-tokens",
        "x-ratelimit-reset-tokens",
    ),
    (
        "rpm",
        "anthropic-ratelimit-requests-limit",
        "anthropic-ratelimit-requests-remaining",
        "anthropic-ratelimit-requests-reset",
    ),
    (
        "itpm",
        "anthropic-ratelimit-input-tokens-limit",
        "anthropic-ratelimit-input-tokens-remaining",
        "anthropic-ratelimit-input-tokens-reset",
    ),
    (
        "otpm",
        "anthropic-ratelimit-output-tokens-limit",
        "anthropic-ratelimit-output-tokens-remaining",
        "anthropic-ratelimit-output-tokens-reset",
    ),
    (
        "tpm",
        "anthropic-ratelimit-tokens-limit",
        "anthropic-ratelimit-tokens-remaining",
        "anthropic-ratelimit-tokens-reset",
    ),
];

/// The longest reset read, in ms: a day, the longest window a provider publishes
/// (Gemini's requests per day). A later instant is a wrong clock, not a limit.
pub const RESET_MS_MAX: u64 = 86_400_000;

/// Reads `headers` (name, value; names in any case) as of now on the system clock,
/// which Anthropic's reset instants are measured from. Values that are not numbers
/// (or durations and instants, for resets) are ignored, as a provider's header is
/// advice, not input to trust.
pub fn read_headers<'a>(headers: impl IntoIterator<Item = (&'a str, &'a str)>) -> ProviderHeaders {
    let now_unix_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    read_headers_at(headers, now_unix_ms)
}

/// Like [`read_headers`], with resets given as instants measured from `now_unix_ms`.
pub fn read_headers_at<'a>(headers: impl IntoIterator<Item = (&'a str, &'a str)>, now_unix_ms: u64) -> ProviderHeaders {
    let values = header_values(headers);
    let number = |slot: usize| values[slot].and_then(|v| v.parse::<u64>().ok());
    // Retry hints may be fractional ("retry-after-ms: 150.5"); rounded up, never shorter.
    let hint = |slot: usize, scale: f64| {
        let value = values[slot]?.parse::<f64>().ok()? * scale;
        (value.is_finite() && value >= 0.0).then(|| value.ceil() as u64)
    };
    let mut read = ProviderHeaders {
        retry_after_ms: hint(RETRY_AFTER_MS_SLOT, 1.0).or_else(|| hint(RETRY_AFTER_SLOT, 1_000.0)),
        ..ProviderHeaders::default()
    };
    for (n, (dimension, ..)) in NAMES.iter().enumerate() {
        let slot = HINT_NAMES.len() + 3 * n;
        let (limit, remaining) = (number(slot), number(slot + 1));
        let reset_ms = values[slot + 2].and_then(|v| reset_ms(v, now_unix_ms));
        let seen = read.limits.iter().any(|l| l.dimension == *dimension);
        if (limit.is_some() || remaining.is_some() || reset_ms.is_some()) && !seen {
            read.limits.push(ProviderLimit {
                dimension,
                limit,
                remaining,
                reset_ms,
            });
        }
    }
    read
}

/// The retry hints' header names, before [`NAMES`]' in a response's slots.
const HINT_NAMES: [&str; 2] = ["retry-after-ms", "retry-after"];
/// The slot of `retry-after-ms`.
const RETRY_AFTER_MS_SLOT: usize = 0;
/// The slot of `retry-after`.
const RETRY_AFTER_SLOT: usize = 1;
/// Every header name read: the hints, then each dimension's limit, remaining and reset.
const SLOTS: usize = HINT_NAMES.len() + 3 * NAMES.len();
/// The names of the slots, in order, flat: searched for every header an answer has.
const SLOT_NAMES: [&str; SLOTS] = {
    let mut names = [""; SLOTS];
    let mut at = 0;
    while at < HINT_NAMES.len() {
        names[at] = HINT_NAMES[at];
        at += 1;
    }
    let mut n = 0;
    while n < NAMES.len() {
        let (_, limit, remaining, reset) = NAMES[n];
        names[at] = limit;
        names[at + 1] = remaining;
        names[at + 2] = reset;
        at += 3;
        n += 1;
    }
    names
};

/// The value (trimmed) of the first header of each name read, by slot, among
/// the first [`HEADERS_MAX`]; names in any case. One pass, no allocation: every
/// answer's headers pass here, and most of them are not a limit's.
fn header_values<'a>(headers: impl IntoIterator<Item = (&'a str, &'a str)>) -> [Option<&'a str>; SLOTS] {
    let mut values = [None; SLOTS];
    for (name, value) in headers.into_iter().take(HEADERS_MAX) {
        // Every name read starts with `x-`, `anthropic-` or `retry-`.
        if !matches!(name.as_bytes().first(), Some(b'x' | b'X' | b'a' | b'A' | b'r' | b'R')) {
            continue;
        }
        if let Some(slot) = SLOT_NAMES.iter().position(|known| known.eq_ignore_ascii_case(name)) {
            values[slot].get_or_insert(value.trim());
        }
    }
    values
}

/// A reset header's time from `now_unix_ms`, in ms rounded up: an RFC 3339 instant
/// (Anthropic), else a duration of hours, minutes, seconds and milliseconds such as
/// `1m30.5s` or `20ms` (OpenAI), else a number of seconds. At most [`RESET_MS_MAX`].
fn reset_ms(value: &str, now_unix_ms: u64) -> Option<u64> {
    let ms = if value.contains('T') {
        rfc3339_unix_ms(value)?.saturating_sub(now_unix_ms)
    } else {
        duration_ms(value)?
    };
    (ms <= RESET_MS_MAX).then_some(ms)
}

/// `6m0s`, `1h2m3.5s`, `20ms`, `1.5` (seconds) in ms, rounded up.
fn duration_ms(value: &str) -> Option<u64> {
    if value.is_empty() {
        return None;
    }
    if let Ok(seconds) = value.parse::<f64>() {
        return (seconds.is_finite() && seconds >= 0.0).then(|| (seconds * 1_000.0).ceil() as u64);
    }
    let mut total_ms = 0.0;
    let mut rest = value;
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !(c.is_ascii_digit() || c == '.'))?;
        let number: f64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let unit_len = rest.find(|c: char| c.is_ascii_digit()).unwrap_or(rest.len());
        let scale_ms = match &rest[..unit_len] {
            "h" => 3_600_000.0,
            "m" => 60_000.0,
            "s" => 1_000.0,
            "ms" => 1.0,
            "us" | "µs" => 0.001,
            "ns" => 0.000_001,
            _ => return None,
        };
        total_ms += number * scale_ms;
        rest = &rest[unit_len..];
    }
    (total_ms.is_finite() && total_ms <= RESET_MS_MAX as f64).then(|| total_ms.ceil() as u64)
}

/// `2026-11-26T14:32:00Z` or `…T14:32:00.5+01:00` in ms since the epoch, rounded up.
fn rfc3339_unix_ms(value: &str) -> Option<u64> {
    let field = |range: std::ops::Range<usize>| value.get(range)?.parse::<i64>().ok();
    let bytes = value.as_bytes();
    let shape = [(4, b'-'), (7, b'-'), (13, b':'), (16, b':')];
    if !shape.iter().all(|&(i, c)| bytes.get(i) == Some(&c)) || !matches!(bytes.get(10), Some(b'T' | b't')) {
        return None;
    }
    let (year, month, day) = (field(0..4)?, field(5..7)?, field(8..10)?);
    let (hour, minute, second) = (field(11..13)?, field(14..16)?, field(17..19)?);
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) || hour > 23 || minute > 59 || second > 60 {
        return None;
    }
    let mut rest = value.get(19..)?;
    let mut fraction_ms = 0.0;
    if let Some(digits) = rest.strip_prefix('.') {
        let end = digits.find(|c: char| !c.is_ascii_digit()).unwrap_or(digits.len());
        fraction_ms = format!("0.{}", &digits[..end]).parse::<f64>().ok()? * 1_000.0;
        rest = &digits[end..];
    }
    let offset_minutes = match rest {
        "Z" | "z" => 0,
        _ => {
            let sign = match rest.as_bytes().first()? {
                b'+' => 1,
                b'-' => -1,
                _ => return None,
            };
            let (hours, minutes) = (
                rest.get(1..3)?.parse::<i64>().ok()?,
                rest.get(4..6)?.parse::<i64>().ok()?,
            );
            (rest.len() == 6 && rest.as_bytes()[3] == b':').then_some(sign * (hours * 60 + minutes))?
        }
    };
    let days = days_from_civil(year, month, day);
    let seconds = days * 86_400 + hour * 3_600 + minute * 60 + second - offset_minutes * 60;
    let ms = u64::try_from(seconds).ok()?.checked_mul(1_000)?;
    Some(ms + fraction_ms.ceil() as u64)
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let year_of_era = year - era * 400;
    let day_of_year = (153 * (month + if month > 2 { -3 } else { 9 }) + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
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

/// The limits of `provider`'s `model` defined on `backend` above what a response's
/// `headers` report: [`below_configured`] over the backend's own definitions, so
/// a caller holding only the limiter learns which limits the provider refuses first.
pub async fn limits_above_provider<'a>(
    backend: &dyn Backend,
    provider: &str,
    model: &str,
    headers: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> Result<Vec<LimitMismatch>, LimiterError> {
    let read = read_headers(headers);
    let definitions: Vec<LimitDefinition> = (backend.limit_reports().await?.into_iter())
        .map(|report| report.state.definition().clone())
        .collect();
    Ok(below_configured(&read, provider, model, &definitions))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::key::LimitKey;

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
                    remaining: Some(499),
                    reset_ms: None
                },
                ProviderLimit {
                    dimension: "tpm",
                    limit: Some(30_000),
                    remaining: None,
                    reset_ms: None
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

    #[test]
    fn the_first_header_of_a_name_counts_and_only_the_first_headers_are_read() {
        let read = read_headers([
            ("x-request-id", "abc"),
            ("X-RATELIMIT-REMAINING-REQUESTS", " 7 "),
            ("x-ratelimit-remaining-requests", "9"),
            ("Retry-After", "3"),
        ]);
        assert_eq!(read.limits[0].remaining, Some(7), "the first, trimmed");
        assert_eq!(read.retry_after_ms, Some(3_000));
        let filler = std::iter::repeat_n(("x-filler", "1"), HEADERS_MAX - 1);
        let at_the_bound = read_headers(filler.clone().chain([("retry-after", "1")]));
        assert_eq!(at_the_bound.retry_after_ms, Some(1_000));
        let past = read_headers(filler.chain([("x-filler", "1"), ("retry-after", "1")]));
        assert_eq!(past.retry_after_ms, None, "past the bound: not read");
    }

    #[test]
    fn resets_are_read_as_durations_and_instants() {
        assert_eq!(duration_ms("6m0s"), Some(360_000));
        assert_eq!(duration_ms("1h2m3.5s"), Some(3_723_500));
        assert_eq!(duration_ms("20ms"), Some(20));
        assert_eq!(duration_ms("1.5"), Some(1_500));
        assert_eq!(duration_ms("1.0001s"), Some(1_001), "rounded up");
        for bad in ["", "s", "5x", "-1s", "1s5", "25h"] {
            assert_eq!(duration_ms(bad), None, "{bad:?}");
        }
        // 2026-11-26T14:32:00Z, checked with `date -u -d 2026-11-26T14:32:00Z +%s`.
        let instant_ms = 1_795_703_520_000;
        assert_eq!(rfc3339_unix_ms("2026-11-26T14:32:00Z"), Some(instant_ms));
        assert_eq!(rfc3339_unix_ms("2026-11-26T15:32:00.250+01:00"), Some(instant_ms + 250));
        assert_eq!(rfc3339_unix_ms("1970-01-01T00:00:00Z"), Some(0));
        for bad in [
            "2026-11-26 14:32:00Z",
            "2026-13-26T14:32:00Z",
            "2026-11-26T14:32:00",
            "2026-11-26T14:32:00+0100",
        ] {
            assert_eq!(rfc3339_unix_ms(bad), None, "{bad:?}");
        }
        let now_ms = instant_ms - 1_500;
        let read = read_headers_at(
            [
                ("anthropic-ratelimit-requests-remaining", "0"),
                ("anthropic-ratelimit-requests-reset", "2026-11-26T14:32:00Z"),
                ("anthropic-ratelimit-input-tokens-reset", "2026-11-26T14:31:59Z"),
                ("anthropic-ratelimit-output-tokens-reset", "2026-11-28T14:31:59Z"),
            ],
            now_ms,
        );
        assert_eq!(read.limits[0].reset_ms, Some(1_500));
        assert_eq!(read.limits[1].reset_ms, Some(500));
        assert_eq!(
            read.limits.len(),
            2,
            "a reset two days away is past RESET_MS_MAX: ignored"
        );
        assert_eq!(read.wait_ms(), Some(1_500), "the exhausted limit's reset");
        let openai = read_headers_at(
            [
                ("x-ratelimit-reset-requests", "2s"),
                ("x-ratelimit-reset-tokens", "750ms"),
            ],
            0,
        );
        assert_eq!(openai.wait_ms(), Some(750), "nothing exhausted: the earliest reset");
        let hinted = read_headers_at([("x-ratelimit-reset-requests", "2s"), ("retry-after", "3")], 0);
        assert_eq!(hinted.wait_ms(), Some(3_000), "the retry hint wins");
        assert_eq!(read_headers_at([], 0).wait_ms(), None);
    }

    #[tokio::test]
    async fn a_backend_reports_its_limits_above_the_providers() {
        use crate::base::clock::SystemClock;
        use crate::memory::{MemoryBackend, MemoryConfig};
        let backend = MemoryBackend::new(std::sync::Arc::new(SystemClock::new()), MemoryConfig::default());
        for (dimension, capacity) in [("rpm", 600), ("tpm", 30_000)] {
            let key = LimitKey::llm_dimension("openai", "gpt-4o", dimension).unwrap();
            let definition = LimitDefinition::rolling(key, capacity, 60).unwrap();
            backend.apply_definition(&definition).await.unwrap();
        }
        let headers = [
            ("x-ratelimit-limit-requests", "500"),
            ("x-ratelimit-limit-tokens", "30000"),
        ];
        let above = limits_above_provider(&backend, "openai", "gpt-4o", headers)
            .await
            .unwrap();
        assert_eq!(
            above,
            [LimitMismatch {
                key: "global:llm:openai:gpt-4o:rpm".to_owned(),
                configured_per_minute: 600,
                provider_limit: 500
            }]
        );
        assert!(limits_above_provider(&backend, "openai", "gpt-4o-mini", headers)
            .await
            .unwrap()
            .is_empty());
    }
}
