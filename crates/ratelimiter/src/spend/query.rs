//! What a spend report asks for (days and grouping) and what it answers (one row
//! per group with its sums).

use std::fmt;
use std::str::FromStr;

use serde::Serialize;

use super::{SpendError, UtcDay};

/// The most days one report spans: a year and a day, so a leap year's whole
/// calendar year fits; a longer report is a mistake or an export, asked for in
/// pieces.
pub const QUERY_DAYS_MAX: u32 = 367;

/// A field a report groups by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SpendField {
    /// The tenant.
    Tenant,
    /// The key's id.
    Key,
    /// The model.
    Model,
    /// The deployment.
    Deployment,
    /// The day in UTC.
    Day,
}

impl SpendField {
    /// Every field, in the order rows and CSV columns name them.
    pub const ALL: [SpendField; 5] = [
        SpendField::Tenant,
        SpendField::Key,
        SpendField::Model,
        SpendField::Deployment,
        SpendField::Day,
    ];

    /// The field's name in a query and a row.
    pub fn name(self) -> &'static str {
        match self {
            SpendField::Tenant => "tenant",
            SpendField::Key => "key",
            SpendField::Model => "model",
            SpendField::Deployment => "deployment",
            SpendField::Day => "day",
        }
    }
}

impl fmt::Display for SpendField {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for SpendField {
    type Err = SpendError;

    fn from_str(text: &str) -> Result<Self, SpendError> {
        (SpendField::ALL.into_iter()).find(|f| f.name() == text).ok_or_else(|| {
            SpendError::Invalid(format!(
                "group_by: unknown field {text:?}: one of tenant, key, model, deployment, day"
            ))
        })
    }
}

/// A report: the days from `from` to `to`, both included, grouped by some fields.
/// Only valid queries exist ([`SpendQuery::new`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpendQuery {
    from: UtcDay,
    to: UtcDay,
    group_by: Vec<SpendField>,
}

impl SpendQuery {
    /// A report of `from` to `to` grouped by `group_by` (none: one row of totals).
    /// Refused, naming the field, when `to` is before `from`, the span is longer
    /// than [`QUERY_DAYS_MAX`] or a field is named twice.
    pub fn new(from: UtcDay, to: UtcDay, group_by: Vec<SpendField>) -> Result<Self, SpendError> {
        if to < from {
            return Err(SpendError::Invalid(format!("to: {to} is before from {from}")));
        }
        let days = to.days_since_epoch() - from.days_since_epoch() + 1;
        if days > QUERY_DAYS_MAX {
            return Err(SpendError::Invalid(format!(
                "to: {days} days from {from}; a report spans at most {QUERY_DAYS_MAX}"
            )));
        }
        let mut seen = Vec::with_capacity(group_by.len());
        for field in group_by {
            if seen.contains(&field) {
                return Err(SpendError::Invalid(format!("group_by: {field} is named twice")));
            }
            seen.push(field);
        }
        Ok(Self {
            from,
            to,
            group_by: seen,
        })
    }

    /// Parses the query string's values: `from` and `to` as `YYYY-MM-DD` (absent:
    /// `today`, the day in UTC now) and `group_by` as comma-separated fields
    /// (absent or empty: none).
    pub fn parse(
        from: Option<&str>,
        to: Option<&str>,
        group_by: Option<&str>,
        today: UtcDay,
    ) -> Result<Self, SpendError> {
        let day = |field: &str, text: Option<&str>| match text {
            None => Ok(today),
            Some(text) => UtcDay::parse(text).map_err(|e| SpendError::Invalid(format!("{field}: {e}"))),
        };
        let fields = match group_by.map(str::trim).filter(|g| !g.is_empty()) {
            None => Vec::new(),
            Some(list) => list.split(',').map(|f| f.trim().parse()).collect::<Result<_, _>>()?,
        };
        Self::new(day("from", from)?, day("to", to)?, fields)
    }

    /// The first day.
    pub fn from(&self) -> UtcDay {
        self.from
    }
    /// The last day, included.
    pub fn to(&self) -> UtcDay {
        self.to
    }
    /// True when rows are grouped by `field`.
    pub fn groups_by(&self, field: SpendField) -> bool {
        self.group_by.contains(&field)
    }
}

/// One group of a report: the values of the fields it is grouped by (the others
/// are `None` and left out of JSON) and the sums of its calls.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct SpendRow {
    /// The tenant, when grouped by it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    /// The key's id, when grouped by it (empty: calls without a key).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// The model, when grouped by it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// The deployment, when grouped by it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub deployment: Option<String>,
    /// The day, when grouped by it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub day: Option<UtcDay>,
    /// Calls completed.
    pub calls: u64,
    /// Prompt tokens not read from cache.
    pub input_tokens: u64,
    /// Prompt tokens read from cache.
    pub cached_tokens: u64,
    /// Output tokens.
    pub output_tokens: u64,
    /// The billed cost, in micro-dollars.
    pub micro_usd: u64,
    /// Calls of a model without a known price, counted in `calls` at $0.
    pub unpriced_calls: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn day(text: &str) -> UtcDay {
        UtcDay::parse(text).unwrap()
    }

    #[test]
    fn queries_parse_with_today_as_the_default() {
        let today = day("2026-11-28");
        let q = SpendQuery::parse(None, None, None, today).unwrap();
        assert_eq!((q.from(), q.to()), (today, today));
        assert!(SpendField::ALL.iter().all(|&f| !q.groups_by(f)));
        let q = SpendQuery::parse(Some("2026-11-01"), None, Some("tenant, day"), today).unwrap();
        assert_eq!(q.from(), day("2026-11-01"));
        assert!(q.groups_by(SpendField::Tenant) && q.groups_by(SpendField::Day));
        assert!(!q.groups_by(SpendField::Model));
        assert!(
            SpendQuery::parse(Some("2025-11-27"), Some("2026-11-28"), None, today).is_ok(),
            "367 days"
        );
    }

    #[test]
    fn bad_queries_are_refused_naming_the_field() {
        let today = day("2026-11-28");
        for (from, to, group_by, message) in [
            (
                Some("2026-11-29"),
                None,
                None,
                "to: 2026-11-28 is before from 2026-11-29",
            ),
            (Some("2025-11-26"), None, None, "a report spans at most 367"),
            (Some("2026-02-30"), None, None, "from: "),
            (None, Some("yesterday"), None, "to: "),
            (None, None, Some("tenant,region"), "unknown field \"region\""),
            (None, None, Some("day,day"), "day is named twice"),
            (None, None, Some("tenant,"), "unknown field \"\""),
        ] {
            let error = SpendQuery::parse(from, to, group_by, today).unwrap_err().to_string();
            assert!(error.contains(message), "{error}");
        }
    }
}
