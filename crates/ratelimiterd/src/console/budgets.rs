//! What `GET /ui/api/budgets` and `GET /ui/api/spend` answer: the budgets
//! panel's document and the spend chart's (docs/console.md, "Budgets and
//! spend").
//!
//! The budgets are the limits in money the backend holds (`...:usd:<span>`:
//! the gateway's, each model's and each tenant's of the configuration, and the
//! directory's tenants' and keys'). Each one's limit says what it holds and
//! owes in its period; the spend ledger says how much of that is the billed
//! cost of calls completed in the period, so the rest is what calls in flight
//! hold. The chart's days are the ledger's report (`SpendBook::report`), the
//! same sums `GET /v1/admin/gateway/spend` answers.

use std::collections::BTreeMap;

use ratelimiter::spend::{SpendBook, SpendField, SpendQuery, SpendRow, UtcDay};
use ratelimiter::{LimitReport, Period};
use serde_json::{json, Value};

use crate::console::owners::{budget_owner, Owners};
use crate::spend_api::usd;
use crate::state::AppState;

/// The days the spend chart shows, today included: two weeks, enough to see a
/// weekly pattern twice, short enough for a bar per day to stay readable.
pub const CHART_DAYS: u32 = 14;
/// The most budgets listed, fullest first: a screen's worth; the panel says how many there are.
pub const BUDGETS_SHOWN_MAX: usize = 200;
/// The most series (tenants, models) the chart draws per grouping, largest
/// spend first; the rest are summed into one series, `other`.
pub const CHART_SERIES_MAX: usize = 8;
/// The name of the series that sums the smaller ones.
const OTHER_SERIES: &str = "(other)";
/// Milliseconds in a day.
const DAY_MS: u64 = 86_400_000;

/// The ledger's billed cost of an owner's calls by day, for the days from the
/// longest period's start to today: `(field, name, day) -> micro-dollars`.
type SpentByDay = BTreeMap<(SpendField, String, UtcDay), u64>;

/// The ledger's sums from `from` to `today` by tenant, key and model and day;
/// `None` without a ledger or when it could not be read (the panel then shows
/// what the limits hold, unsplit).
async fn spent_by_day(book: Option<&dyn SpendBook>, from: UtcDay, today: UtcDay) -> Option<SpentByDay> {
    let book = book?;
    let mut out = SpentByDay::new();
    for field in [SpendField::Tenant, SpendField::Key, SpendField::Model] {
        let query = SpendQuery::new(from, today, vec![field, SpendField::Day]).ok()?;
        for row in book.report(&query).await.ok()? {
            let name = match field {
                SpendField::Tenant => row.tenant,
                SpendField::Key => row.key,
                _ => row.model,
            };
            if let (Some(name), Some(day)) = (name, row.day) {
                out.insert((field, name, day), row.micro_usd);
            }
        }
    }
    Some(out)
}

/// The billed cost the ledger has for a budget's owner from `start` to today
/// (the gateway's: every tenant's).
fn ledger_spent(spent: &SpentByDay, owner: (&str, Option<&str>), start: UtcDay) -> u64 {
    let field = match owner.0 {
        "tenant" | "gateway" => SpendField::Tenant,
        "key" => SpendField::Key,
        _ => SpendField::Model,
    };
    (spent.iter())
        .filter(|((f, name, day), _)| *f == field && *day >= start && owner.1.is_none_or(|n| n == name))
        .map(|(_, micro_usd)| *micro_usd)
        .sum()
}

/// A budget's row. `held` is what its limit holds and owes now
/// ([`LimitReport::held_and_owed`]): the billed cost of the calls its period
/// counts plus the worst cases of calls in flight. `spent` is the ledger's part
/// of it (capped at `held`); `reserved` the rest; `left` what admission would
/// grant now ([`LimitReport::available`]: nothing while the budget owes).
fn budget_row(
    report: &LimitReport,
    spent: Option<&SpentByDay>,
    owners: &Owners<'_>,
    now_unix_ms: u64,
) -> Option<Value> {
    let definition = report.state.definition();
    let owner = budget_owner(definition.key().as_str())?;
    let budget = definition.capacity();
    let held = report.held_and_owed();
    let period = definition.period();
    let (span, ends_unix_ms) = match period {
        Some(p) => (p.to_string(), Some(p.end_unix_ms(now_unix_ms))),
        None => (format!("{} s window", definition.window_seconds()), None),
    };
    // The ledger is by day: a calendar period's spend is its days'; a rolling
    // window's cannot be told from it.
    let spent_micro_usd = match (period, spent) {
        (Some(p), Some(spent)) => {
            let start = UtcDay::of_unix_ms(p.start_unix_ms(now_unix_ms));
            Some(ledger_spent(spent, owner, start).min(held))
        }
        _ => None,
    };
    let reserved = spent_micro_usd.map(|s| held - s);
    let left = report.available();
    Some(json!({
        "key": definition.key().as_str(),
        "owner": owner.0,
        "owner_name": owner.1,
        "span": span,
        "period": period,
        "window_seconds": period.is_none().then(|| definition.window_seconds()),
        "budget_micro_usd": budget,
        "budget_usd": usd(budget),
        "held_micro_usd": held,
        "debt_micro_usd": report.debt,
        "owing": report.owing,
        "spent_micro_usd": spent_micro_usd,
        "spent_usd": spent_micro_usd.map(usd),
        "reserved_micro_usd": reserved,
        "reserved_usd": reserved.map(usd),
        "left_micro_usd": left,
        "left_usd": usd(left),
        "period_ends_unix_ms": ends_unix_ms,
        "status": report.state.status(),
        "retired": owners.retired(definition.key().as_str()),
    }))
}

/// The budgets panel's document: every budget the backend holds, fullest first.
pub async fn budgets_document(state: &AppState, now_unix_ms: u64) -> Value {
    let (reports, error) = match state.backend().limit_reports().await {
        Ok(reports) => (reports, None),
        Err(e) => (Vec::new(), Some(e.to_string())),
    };
    let today = UtcDay::of_unix_ms(now_unix_ms);
    // The longest period reaches back to the month's or the week's start, whichever is earlier.
    let first_unix_ms = Period::Month
        .start_unix_ms(now_unix_ms)
        .min(Period::Week.start_unix_ms(now_unix_ms));
    let spent = spent_by_day(state.spend().map(|b| &**b), UtcDay::of_unix_ms(first_unix_ms), today).await;
    let owners = Owners::new(state.directory().map(|d| &**d));
    let mut rows: Vec<(u64, Value)> = (reports.iter())
        .filter_map(|r| {
            let row = budget_row(r, spent.as_ref(), &owners, now_unix_ms)?;
            let fullness =
                (r.held_and_owed() as u128 * 1_000_000 / r.state.definition().capacity().max(1) as u128) as u64;
            Some((fullness, row))
        })
        .collect();
    let total = rows.len();
    rows.sort_by(|a, b| {
        b.0.cmp(&a.0)
            .then_with(|| a.1["key"].as_str().cmp(&b.1["key"].as_str()))
    });
    json!({
        "now_unix_ms": now_unix_ms,
        "error": error,
        "ledger": spent.is_some(),
        "total": total,
        "rows": rows.into_iter().take(BUDGETS_SHOWN_MAX).map(|(_, row)| row).collect::<Vec<_>>(),
    })
}

/// One grouping's series for the chart: the largest [`CHART_SERIES_MAX`] by
/// total, then `(other)` for the rest, each with one value per day.
fn series(rows: &[SpendRow], name: impl Fn(&SpendRow) -> Option<&String>, days: &[UtcDay]) -> Vec<Value> {
    let mut by_name: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for row in rows {
        let (Some(name), Some(day)) = (name(row), row.day) else {
            continue;
        };
        let Some(slot) = days.iter().position(|d| *d == day) else {
            continue;
        };
        by_name.entry(name.clone()).or_insert_with(|| vec![0; days.len()])[slot] += row.micro_usd;
    }
    let mut named: Vec<(String, Vec<u64>)> = by_name.into_iter().collect();
    named.sort_by(|a, b| {
        b.1.iter()
            .sum::<u64>()
            .cmp(&a.1.iter().sum::<u64>())
            .then_with(|| a.0.cmp(&b.0))
    });
    if named.len() > CHART_SERIES_MAX {
        let rest = named.split_off(CHART_SERIES_MAX - 1);
        let mut other = vec![0; days.len()];
        for (_, values) in rest {
            other.iter_mut().zip(values).for_each(|(o, v)| *o += v);
        }
        named.push((OTHER_SERIES.to_owned(), other));
    }
    (named.into_iter())
        .map(|(name, micro_usd)| json!({ "name": name, "micro_usd": micro_usd }))
        .collect()
}

/// The spend chart's document: the last [`CHART_DAYS`] days in UTC, by tenant
/// and by model; the error says why the ledger could not be read.
pub async fn spend_document(book: &dyn SpendBook, now_unix_ms: u64) -> Result<Value, String> {
    let today = UtcDay::of_unix_ms(now_unix_ms);
    let from = UtcDay::of_unix_ms(now_unix_ms.saturating_sub(u64::from(CHART_DAYS - 1) * DAY_MS));
    let days: Vec<UtcDay> = (0..=today.days_since_epoch() - from.days_since_epoch())
        .filter_map(|d| from.plus_days(d))
        .collect();
    let query = |field| SpendQuery::new(from, today, vec![field, SpendField::Day]).map_err(|e| e.to_string());
    let by_tenant = book
        .report(&query(SpendField::Tenant)?)
        .await
        .map_err(|e| e.to_string())?;
    let by_model = book
        .report(&query(SpendField::Model)?)
        .await
        .map_err(|e| e.to_string())?;
    Ok(json!({
        "from": from,
        "to": today,
        "days": days,
        "by_tenant": series(&by_tenant, |r| r.tenant.as_ref(), &days),
        "by_model": series(&by_model, |r| r.model.as_ref(), &days),
    }))
}
