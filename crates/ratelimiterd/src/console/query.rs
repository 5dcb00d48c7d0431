//! The console's page of limits (docs/console.md, "Limits"): which column
//! sorts it, which way, which slice of the sorted rows and which keys match
//! the filter, read from the query string of `GET /ui/api/state`. The server
//! sorts and slices, so a page of ten thousand limits sends a browser one
//! screen of rows each second, not every limit.

use std::cmp::Ordering;

use ratelimiter::{LimitReport, LimitStatus};

use crate::console::history::basis_points;

/// Rows on a page when the query names none.
pub const PAGE_ROWS_DEFAULT: usize = 50;
/// The most rows on one page: each carries 15 minutes of history.
pub const PAGE_ROWS_MAX: usize = 500;
/// The longest filter accepted: longer than any key.
pub const FILTER_BYTES_MAX: usize = 256;
/// The longest query string read.
pub const QUERY_BYTES_MAX: usize = 2_048;

/// A column the limits can be sorted by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SortColumn {
    /// The key, alphabetically.
    Key,
    /// Rolling, concurrency, bucket.
    Kind,
    /// The capacity in force.
    Capacity,
    /// Units held now.
    InUse,
    /// In use plus debt over capacity.
    Utilization,
    /// Recorded debt.
    Debt,
    /// The target of a pending decrease (limits without one last).
    Pending,
}

/// What page of limits the console asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LimitsQuery {
    /// The sort column.
    pub sort: SortColumn,
    /// Largest first.
    pub descending: bool,
    /// Rows skipped.
    pub offset: usize,
    /// Rows sent, 1..=[`PAGE_ROWS_MAX`].
    pub count: usize,
    /// Only keys containing this text (case-insensitive); empty: every key.
    pub filter: String,
}

impl Default for LimitsQuery {
    fn default() -> Self {
        Self {
            sort: SortColumn::Utilization,
            descending: true,
            offset: 0,
            count: PAGE_ROWS_DEFAULT,
            filter: String::new(),
        }
    }
}

impl LimitsQuery {
    /// Reads `sort`, `order`, `offset`, `count` and `q`; an unknown parameter
    /// or a bad value is an error naming it.
    pub fn parse(query: Option<&str>) -> Result<Self, String> {
        let mut out = Self::default();
        let Some(query) = query.filter(|q| !q.is_empty()) else {
            return Ok(out);
        };
        if query.len() > QUERY_BYTES_MAX {
            return Err(format!("the query string is longer than {QUERY_BYTES_MAX} bytes"));
        }
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (name, raw) = pair.split_once('=').unwrap_or((pair, ""));
            let value = percent_decode(raw).ok_or_else(|| format!("{name}: not valid percent-encoded UTF-8"))?;
            let number = || {
                value
                    .parse::<usize>()
                    .map_err(|_| format!("{name}: not a number: {value:?}"))
            };
            match name {
                "sort" => out.sort = parse_column(&value)?,
                "order" => {
                    out.descending = match value.as_str() {
                        "asc" => false,
                        "desc" => true,
                        _ => return Err(format!("order: asc or desc, got {value:?}")),
                    }
                }
                "offset" => out.offset = number()?,
                "count" => {
                    out.count = number()?;
                    if !(1..=PAGE_ROWS_MAX).contains(&out.count) {
                        return Err(format!("count: 1..={PAGE_ROWS_MAX}, got {}", out.count));
                    }
                }
                "q" => {
                    if value.len() > FILTER_BYTES_MAX {
                        return Err(format!("q: longer than {FILTER_BYTES_MAX} bytes"));
                    }
                    out.filter = value.to_lowercase();
                }
                other => return Err(format!("unknown parameter {other:?}")),
            }
        }
        Ok(out)
    }

    /// The matching reports, sorted (ties by key), and the page's slice of them.
    pub fn apply<'a>(&self, reports: &'a [LimitReport]) -> (usize, Vec<&'a LimitReport>) {
        let mut matched: Vec<&LimitReport> = (reports.iter())
            .filter(|r| self.filter.is_empty() || key_of(r).to_lowercase().contains(&self.filter))
            .collect();
        matched.sort_by(|a, b| {
            let order = compare(self.sort, a, b);
            let order = if self.descending { order.reverse() } else { order };
            order.then_with(|| key_of(a).cmp(key_of(b)))
        });
        let total = matched.len();
        let page = matched.into_iter().skip(self.offset).take(self.count).collect();
        (total, page)
    }
}

fn parse_column(value: &str) -> Result<SortColumn, String> {
    Ok(match value {
        "key" => SortColumn::Key,
        "kind" => SortColumn::Kind,
        "capacity" => SortColumn::Capacity,
        "in_use" => SortColumn::InUse,
        "utilization" => SortColumn::Utilization,
        "debt" => SortColumn::Debt,
        "pending" => SortColumn::Pending,
        _ => {
            return Err(format!(
                "sort: key, kind, capacity, in_use, utilization, debt or pending, got {value:?}"
            ))
        }
    })
}

fn key_of(report: &LimitReport) -> &str {
    report.state.definition().key().as_str()
}

fn compare(column: SortColumn, a: &LimitReport, b: &LimitReport) -> Ordering {
    let (da, db) = (a.state.definition(), b.state.definition());
    match column {
        SortColumn::Key => key_of(a).cmp(key_of(b)),
        SortColumn::Kind => da.kind().to_string().cmp(&db.kind().to_string()),
        SortColumn::Capacity => da.capacity().cmp(&db.capacity()),
        SortColumn::InUse => a.in_use.cmp(&b.in_use),
        SortColumn::Utilization => basis_points(a).cmp(&basis_points(b)),
        SortColumn::Debt => a.debt.cmp(&b.debt),
        SortColumn::Pending => pending(a).cmp(&pending(b)),
    }
}

/// A pending decrease's target, limits without one after every target.
fn pending(report: &LimitReport) -> u64 {
    match report.state.status() {
        LimitStatus::Decreasing => report.state.pending_decrease_to(),
        LimitStatus::Active => u64::MAX,
    }
}

/// Decodes `%XX` escapes and `+` (a space in a form-encoded query); `None`
/// for a broken escape or bytes that are not UTF-8.
fn percent_decode(raw: &str) -> Option<String> {
    let bytes = raw.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            other => {
                out.push(other);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use ratelimiter::{LimitDefinition, LimitKey, LimitState};

    fn report(key: &str, capacity: u64, in_use: u64) -> LimitReport {
        let definition = LimitDefinition::rolling(LimitKey::new(key).unwrap(), capacity, 60).unwrap();
        LimitReport {
            state: LimitState::active(definition),
            in_use,
            debt: 0,
            owing: false,
        }
    }

    fn keys(page: &[&LimitReport]) -> Vec<String> {
        page.iter().map(|r| key_of(r).to_owned()).collect()
    }

    #[test]
    fn the_default_is_the_fullest_limits_first() {
        let reports = [report("a", 10, 1), report("b", 10, 9), report("c", 100, 50)];
        let (total, page) = LimitsQuery::parse(None).unwrap().apply(&reports);
        assert_eq!(total, 3);
        assert_eq!(keys(&page), ["b", "c", "a"]);
    }

    #[test]
    fn sorts_filters_and_slices() {
        let reports: Vec<_> = (0..30)
            .map(|i| report(&format!("tenant:t{i:02}:rpm"), 100 - i, i))
            .collect();
        let query = LimitsQuery::parse(Some("sort=capacity&order=asc&offset=2&count=3&q=TENANT%3AT1")).unwrap();
        let (total, page) = query.apply(&reports);
        assert_eq!(total, 10, "t10..t19 match, case-insensitively");
        assert_eq!(keys(&page), ["tenant:t17:rpm", "tenant:t16:rpm", "tenant:t15:rpm"]);
        let (_, page) = LimitsQuery::parse(Some("sort=key&order=desc&count=1"))
            .unwrap()
            .apply(&reports);
        assert_eq!(keys(&page), ["tenant:t29:rpm"]);
    }

    #[test]
    fn bad_queries_are_refused_with_the_parameter_named() {
        for (query, names) in [
            ("sort=colour", "sort"),
            ("order=up", "order"),
            ("count=0", "count"),
            ("count=501", "count"),
            ("offset=-1", "offset"),
            ("q=%ZZ", "q"),
            ("page=2", "page"),
        ] {
            let error = LimitsQuery::parse(Some(query)).unwrap_err();
            assert!(error.contains(names), "{query}: {error}");
        }
        let long = format!("q={}", "a".repeat(FILTER_BYTES_MAX + 1));
        assert!(LimitsQuery::parse(Some(&long)).is_err());
        assert_eq!(LimitsQuery::parse(Some("q=a+b")).unwrap().filter, "a b");
    }
}
