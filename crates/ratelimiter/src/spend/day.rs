//! A calendar day in UTC, as the spend ledger groups and queries it.

use std::fmt;

use serde::{Deserialize, Serialize};

use super::SpendError;
use crate::base::period::{civil_from_days, days_from_civil};

/// Milliseconds in a day of Unix time.
const DAY_MS: u64 = 86_400_000;
/// The first year a day may name: Unix time starts in 1970.
const YEAR_MIN: u64 = 1970;
/// The last year a day may name: far beyond any ledger, and small enough that
/// every day's number fits a `u32`.
const YEAR_MAX: u64 = 9999;

/// A day in UTC, from 00:00 to the next 00:00, kept as its number of days since
/// 1970-01-01; written `YYYY-MM-DD`. Only real dates exist: the 30th of February
/// is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct UtcDay(u32);

impl UtcDay {
    /// The day that holds `unix_ms`.
    pub fn of_unix_ms(unix_ms: u64) -> Self {
        Self(u32::try_from(unix_ms / DAY_MS).expect("a u64 of ms is at most 2^32 days"))
    }

    /// Days since 1970-01-01.
    pub fn days_since_epoch(self) -> u32 {
        self.0
    }

    /// The day `days` later, `None` past year 9999.
    pub fn plus_days(self, days: u32) -> Option<Self> {
        let day = Self(self.0.checked_add(days)?);
        (civil_from_days(u64::from(day.0)).0 <= YEAR_MAX).then_some(day)
    }

    /// Parses `YYYY-MM-DD`; the error names the text and says what is expected.
    pub fn parse(text: &str) -> Result<Self, SpendError> {
        let invalid = || {
            SpendError::Invalid(format!(
                "{text:?} is not a day: expected YYYY-MM-DD, a real date in UTC"
            ))
        };
        let bytes = text.as_bytes();
        if bytes.len() != 10 || bytes[4] != b'-' || bytes[7] != b'-' {
            return Err(invalid());
        }
        let number = |range: std::ops::Range<usize>| -> Result<u64, SpendError> {
            let part = &text[range];
            if !part.bytes().all(|b| b.is_ascii_digit()) {
                return Err(invalid());
            }
            part.parse().map_err(|_| invalid())
        };
        let (year, month, day) = (number(0..4)?, number(5..7)?, number(8..10)?);
        if !(YEAR_MIN..=YEAR_MAX).contains(&year) || !(1..=12).contains(&month) || day == 0 {
            return Err(invalid());
        }
        let days = days_from_civil(year, month, day);
        // A day past the month's end lands in the next month: not the date written.
        if civil_from_days(days) != (year, month, day) {
            return Err(invalid());
        }
        Ok(Self(u32::try_from(days).expect("year 9999 is within u32 days")))
    }
}

impl fmt::Display for UtcDay {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (year, month, day) = civil_from_days(u64::from(self.0));
        write!(f, "{year:04}-{month:02}-{day:02}")
    }
}

impl TryFrom<String> for UtcDay {
    type Error = SpendError;

    fn try_from(text: String) -> Result<Self, SpendError> {
        Self::parse(&text)
    }
}

impl From<UtcDay> for String {
    fn from(day: UtcDay) -> Self {
        day.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn days_parse_format_and_hold_their_instants() {
        let day = UtcDay::parse("2026-11-28").unwrap();
        assert_eq!(day.to_string(), "2026-11-28");
        // `date -u -d 2026-11-28 +%s`
        assert_eq!(UtcDay::of_unix_ms(1_795_824_000_000), day);
        assert_eq!(UtcDay::of_unix_ms(1_795_824_000_000 - 1).to_string(), "2026-11-27");
        assert_eq!(
            UtcDay::parse("2024-02-29").unwrap().plus_days(1).unwrap().to_string(),
            "2024-03-01"
        );
        assert_eq!(UtcDay::parse("1970-01-01").unwrap().days_since_epoch(), 0);
        assert!(UtcDay::parse("9999-12-31").unwrap().plus_days(1).is_none());
    }

    #[test]
    fn anything_but_a_real_date_is_refused() {
        for bad in [
            "2026-02-29",
            "2026-13-01",
            "2026-00-10",
            "2026-04-31",
            "2026-11-00",
            "1969-12-31",
            "26-11-28",
            "2026/11/28",
            "2026-11-28T00",
            "+026-11-28",
            "2026-1-028",
            "",
            "today",
        ] {
            let error = UtcDay::parse(bad).unwrap_err().to_string();
            assert!(error.contains("YYYY-MM-DD"), "{bad}: {error}");
        }
        assert!(serde_json::from_str::<UtcDay>("\"2026-02-30\"").is_err());
        assert_eq!(
            serde_json::to_string(&UtcDay::parse("2026-01-05").unwrap()).unwrap(),
            "\"2026-01-05\""
        );
    }
}
