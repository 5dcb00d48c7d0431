//! Calendar periods of a limit (docs/decisions.md, "Model"): a budget of `$20 a day`
//! resets at midnight UTC, not 24 hours after each call. A limit with a period is a
//! rolling limit whose holds end at the next boundary of the period instead of
//! `window_seconds` after their grant, so everything reserved in one period is
//! freed together when it ends, and a reservation made at the boundary belongs to
//! the new period.
//!
//! Periods are in UTC, computed from the injected clock's Unix time (no time zone,
//! no leap seconds, as Unix time has none). A week starts on Monday 00:00 UTC, the
//! ISO 8601 week (a finance team's week, and the one `date +%V` counts); a month
//! on the 1st at 00:00 UTC.

use serde::{Deserialize, Serialize};

/// Milliseconds in a day of Unix time.
const DAY_MS: u64 = 86_400_000;
/// Days in a week.
const WEEK_DAYS: u64 = 7;
/// Days from Monday to the weekday of 1970-01-01, a Thursday: day `d` of Unix time
/// is `(d + EPOCH_WEEKDAY_FROM_MONDAY) % 7` days after a Monday.
const EPOCH_WEEKDAY_FROM_MONDAY: u64 = 3;
/// The longest month, in days: what a month's hold lasts at most.
const MONTH_DAYS_MAX: u64 = 31;

/// A calendar period in UTC.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Period {
    /// From 00:00 UTC to the next 00:00 UTC.
    Day,
    /// From Monday 00:00 UTC to the next Monday 00:00 UTC (ISO 8601 week).
    Week,
    /// From the 1st 00:00 UTC to the 1st of the next month 00:00 UTC.
    Month,
}

impl std::fmt::Display for Period {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Period::Day => "day",
            Period::Week => "week",
            Period::Month => "month",
        })
    }
}

impl Period {
    /// The start of the period that holds `now_unix_ms` (a boundary belongs to the
    /// period it opens).
    pub fn start_unix_ms(self, now_unix_ms: u64) -> u64 {
        let day = now_unix_ms / DAY_MS;
        let start_day = match self {
            Period::Day => day,
            // The first days of 1970 belong to a week that began before Unix time
            // can say: it starts at 0.
            Period::Week => day.saturating_sub((day + EPOCH_WEEKDAY_FROM_MONDAY) % WEEK_DAYS),
            Period::Month => {
                let (year, month, _) = civil_from_days(day);
                days_from_civil(year, month, 1)
            }
        };
        start_day * DAY_MS
    }

    /// The end of the period that holds `now_unix_ms`: the next boundary strictly
    /// after it, when every hold made in the period ends.
    pub fn end_unix_ms(self, now_unix_ms: u64) -> u64 {
        let day = now_unix_ms / DAY_MS;
        let end_day = match self {
            Period::Day => day + 1,
            Period::Week => day + WEEK_DAYS - (day + EPOCH_WEEKDAY_FROM_MONDAY) % WEEK_DAYS,
            Period::Month => {
                let (year, month, _) = civil_from_days(day);
                match month {
                    12 => days_from_civil(year + 1, 1, 1),
                    _ => days_from_civil(year, month + 1, 1),
                }
            }
        };
        end_day * DAY_MS
    }

    /// The longest the period lasts, in ms: what one hold can last at most, for
    /// retention and retry scales that need a bound without a clock.
    pub fn longest_ms(self) -> u64 {
        match self {
            Period::Day => DAY_MS,
            Period::Week => WEEK_DAYS * DAY_MS,
            Period::Month => MONTH_DAYS_MAX * DAY_MS,
        }
    }
}

/// The (year, month 1..=12, day 1..=31) of day `days` of Unix time, in the
/// proleptic Gregorian calendar (H. Hinnant's `civil_from_days`, restricted to
/// days from 1970 on, which is all a `u64` Unix time can name).
pub(crate) fn civil_from_days(days: u64) -> (u64, u64, u64) {
    // Shifted so that eras of 400 years start on 0000-03-01.
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    (year, month, day)
}

/// Day of Unix time of `year`-`month`-`day` (the inverse of [`civil_from_days`];
/// `year` at least 1970).
pub(crate) fn days_from_civil(year: u64, month: u64, day: u64) -> u64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year / 400;
    let yoe = year - era * 400;
    let mp = if month > 2 { month - 3 } else { month + 9 };
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Unix ms of `y-m-d hh:mm:ss.mmm` UTC, from the calendar functions under test
    /// checked against known instants below.
    fn at(y: u64, m: u64, d: u64, hh: u64, mm: u64, ss: u64, ms: u64) -> u64 {
        days_from_civil(y, m, d) * DAY_MS + ((hh * 60 + mm) * 60 + ss) * 1000 + ms
    }

    #[test]
    fn the_calendar_matches_known_instants() {
        assert_eq!(at(1970, 1, 1, 0, 0, 0, 0), 0);
        // `date -u -d 2024-02-29 +%s`
        assert_eq!(at(2024, 2, 29, 0, 0, 0, 0), 1_709_164_800_000);
        // `date -u -d 2026-11-28T06:00:00 +%s`
        assert_eq!(at(2026, 11, 28, 6, 0, 0, 0), 1_795_845_600_000);
        assert_eq!(at(2100, 3, 1, 0, 0, 0, 0), 4_107_542_400_000, "2100 is no leap year");
        for days in (0..200_000).step_by(17) {
            let (y, m, d) = civil_from_days(days);
            assert_eq!(days_from_civil(y, m, d), days, "{y}-{m}-{d}");
        }
    }

    #[test]
    fn a_day_ends_at_the_next_midnight_utc() {
        let noon = at(2026, 11, 28, 12, 0, 0, 0);
        assert_eq!(Period::Day.start_unix_ms(noon), at(2026, 11, 28, 0, 0, 0, 0));
        assert_eq!(Period::Day.end_unix_ms(noon), at(2026, 11, 29, 0, 0, 0, 0));
        let last_ms = at(2026, 11, 28, 23, 59, 59, 999);
        assert_eq!(Period::Day.end_unix_ms(last_ms), at(2026, 11, 29, 0, 0, 0, 0));
        let midnight = at(2026, 11, 29, 0, 0, 0, 0);
        assert_eq!(
            Period::Day.start_unix_ms(midnight),
            midnight,
            "a boundary opens its period"
        );
        assert_eq!(Period::Day.end_unix_ms(midnight), at(2026, 11, 30, 0, 0, 0, 0));
    }

    #[test]
    fn a_week_runs_from_monday_to_monday() {
        // 2026-11-28 is a Saturday; its week began Monday 2026-11-23.
        let saturday = at(2026, 11, 28, 6, 0, 0, 0);
        assert_eq!(Period::Week.start_unix_ms(saturday), at(2026, 11, 23, 0, 0, 0, 0));
        assert_eq!(Period::Week.end_unix_ms(saturday), at(2026, 11, 30, 0, 0, 0, 0));
        let sunday_last_ms = at(2026, 11, 29, 23, 59, 59, 999);
        assert_eq!(Period::Week.end_unix_ms(sunday_last_ms), at(2026, 11, 30, 0, 0, 0, 0));
        let monday = at(2026, 11, 30, 0, 0, 0, 0);
        assert_eq!(Period::Week.start_unix_ms(monday), monday);
        assert_eq!(Period::Week.end_unix_ms(monday), at(2026, 12, 7, 0, 0, 0, 0));
        // 1970-01-01, a Thursday, is in the week of Monday 1969-12-29: it ends on the 5th.
        assert_eq!(Period::Week.end_unix_ms(0), at(1970, 1, 5, 0, 0, 0, 0));
    }

    #[test]
    fn a_month_ends_on_the_first_of_the_next() {
        let cases = [
            ((2026, 11, 28), (2026, 11, 1), (2026, 12, 1)),
            ((2026, 12, 31), (2026, 12, 1), (2027, 1, 1)),
            ((2024, 2, 29), (2024, 2, 1), (2024, 3, 1)),
            ((2023, 2, 28), (2023, 2, 1), (2023, 3, 1)),
            ((2026, 1, 1), (2026, 1, 1), (2026, 2, 1)),
        ];
        for ((y, m, d), (sy, sm, sd), (ey, em, ed)) in cases {
            let now = at(y, m, d, 23, 59, 59, 999);
            assert_eq!(
                Period::Month.start_unix_ms(now),
                at(sy, sm, sd, 0, 0, 0, 0),
                "{y}-{m}-{d}"
            );
            assert_eq!(
                Period::Month.end_unix_ms(now),
                at(ey, em, ed, 0, 0, 0, 0),
                "{y}-{m}-{d}"
            );
        }
        let first = at(2026, 12, 1, 0, 0, 0, 0);
        assert_eq!(Period::Month.end_unix_ms(first), at(2027, 1, 1, 0, 0, 0, 0));
    }

    #[test]
    fn no_period_outlasts_its_longest() {
        for period in [Period::Day, Period::Week, Period::Month] {
            for now in (0..4_000_000_000_000u64).step_by(7_777_777_777) {
                let (start, end) = (period.start_unix_ms(now), period.end_unix_ms(now));
                assert!(start <= now && now < end, "{period} {now}");
                assert!(end - start <= period.longest_ms(), "{period} {now}");
                assert_eq!(period.start_unix_ms(end), end, "{period}: the end opens the next");
            }
        }
    }
}
