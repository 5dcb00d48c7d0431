//! How the wire formats write when a limit is whole again: OpenAI's durations
//! (`x-ratelimit-reset-*`) and Anthropic's RFC 3339 times
//! (`anthropic-ratelimit-*-reset`), for the sliding log's headers.

/// A duration as OpenAI writes `x-ratelimit-reset-*` ("1s", "6m0s", "12ms").
pub fn openai_duration(ms: u64) -> String {
    if ms < 1_000 {
        format!("{ms}ms")
    } else if ms < 60_000 {
        let text = format!("{}.{:03}", ms / 1_000, ms % 1_000);
        format!("{}s", text.trim_end_matches('0').trim_end_matches('.'))
    } else {
        let seconds = ms.div_ceil(1_000);
        format!("{}m{}s", seconds / 60, seconds % 60)
    }
}

/// A Unix time in ms as RFC 3339 UTC, as Anthropic writes `anthropic-ratelimit-*-reset`.
pub fn rfc3339(unix_ms: u64) -> String {
    let seconds = unix_ms / 1_000;
    let days = i64::try_from(seconds / 86_400).expect("a date fits i64");
    let (year, month, day) = civil_from_days(days);
    let of_day = seconds % 86_400;
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        of_day / 3_600,
        of_day % 3_600 / 60,
        of_day % 60
    )
}

/// Howard Hinnant's `civil_from_days`: the proleptic Gregorian date of a day count
/// since 1970-01-01.
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = u32::try_from(doy - (153 * mp + 2) / 5 + 1).expect("1..=31");
    let month = u32::try_from(if mp < 10 { mp + 3 } else { mp - 9 }).expect("1..=12");
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reset_formats_follow_the_providers() {
        assert_eq!(openai_duration(12), "12ms");
        assert_eq!(openai_duration(1_000), "1s");
        assert_eq!(openai_duration(17_280), "17.28s");
        assert_eq!(openai_duration(360_000), "6m0s");
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(1_709_251_199_000), "2024-02-29T23:59:59Z");
        assert_eq!(rfc3339(1_764_057_600_500), "2025-11-25T08:00:00Z");
    }
}
