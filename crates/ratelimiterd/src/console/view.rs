//! What `GET /ui/api/state` answers: one JSON document with everything the
//! console shows, built from the backend, the history rings and the gateway
//! (docs/console.md, "The state endpoint"). Names and numbers only: no token,
//! upstream key or tenant key is ever part of it.

use std::collections::BTreeMap;
use std::time::Duration;

use futures_util::future::join_all;
use gateway::class_metrics::ClassTotals;
use gateway::metrics::{CallTotals, NO_TENANT};
use ratelimiter::metrics::{HistogramSnapshot, MetricValue, BUCKET_BOUNDS_MICROS};
use ratelimiter::{LimitReport, LimitStatus, Period};
use serde::Serialize;
use serde_json::{json, Value};

use gateway::limits::budgets::is_budget_key;

use crate::console::history::{basis_points, GatewaySample, History, SAMPLE_INTERVAL_MS};
use crate::console::owners::{Owners, Retired};
use crate::console::query::LimitsQuery;
use crate::state::AppState;

/// How long the page's read waits for the backend's health and each next-release
/// answer: a console that hangs on a dead cluster tells the operator nothing.
pub const BACKEND_READ_TIMEOUT: Duration = Duration::from_millis(1_000);
/// The next-release reads of a page in flight at once: a page of 50 held rows
/// costs a few round trips instead of 50, while the console takes no more than
/// this many of the backend's sessions from the calls it serves.
pub const NEXT_RELEASE_READS_MAX: usize = 8;
/// The window of the per-second rates: short enough to follow a burst, long
/// enough not to flicker.
pub const RATE_WINDOW_SECONDS: usize = 5;
/// The window of the per-minute figures.
pub const MINUTE_SECONDS: usize = 60;
/// The most tenants listed, fullest budget first: a screen's worth, refreshed each second.
pub const TENANTS_SHOWN_MAX: usize = 100;
/// The most ceiling keys listed per class, fullest first: a class over many
/// models has one per model limit, and the fullest are the ones that bind.
pub const CEILINGS_SHOWN_MAX: usize = 20;
/// The window of a tenant's daily tokens: a rolling day.
const DAY_SECONDS: u64 = 86_400;

/// One row of the limits table.
#[derive(Debug, Serialize)]
struct LimitRow<'a> {
    key: &'a str,
    kind: String,
    unit: &'a str,
    capacity: u64,
    in_use: u64,
    debt: u64,
    utilization_bp: u16,
    status: LimitStatus,
    pending_decrease_to: u64,
    window_seconds: u64,
    /// The calendar period in UTC of a period limit (a budget's `day`).
    period: Option<Period>,
    timeout_seconds: u64,
    next_release_ms: Option<u64>,
    /// A key's own limit that no working key charges: shown, counted in no card.
    retired: Option<Retired>,
    /// A budget in money (`...:usd:<span>`, capacity in micro-dollars): its
    /// owner and where it is changed ([`Owners::budget`]).
    budget: Option<Value>,
    /// Utilization samples, oldest first, every `sample_interval_ms`.
    history: Vec<Option<u16>>,
}

/// The whole document for `query`.
pub async fn state_document(state: &AppState, history: &History, query: &LimitsQuery, now_unix_ms: u64) -> Value {
    let backend = state.backend();
    let health = match tokio::time::timeout(BACKEND_READ_TIMEOUT, backend.health()).await {
        Ok(Ok(())) => None,
        Ok(Err(e)) => Some(e.to_string()),
        Err(_) => Some(format!("no answer within {} ms", BACKEND_READ_TIMEOUT.as_millis())),
    };
    let (reports, limits_error) = match backend.limit_reports().await {
        Ok(reports) => (reports, None),
        Err(e) => (Vec::new(), Some(e.to_string())),
    };
    let servers = match tokio::time::timeout(BACKEND_READ_TIMEOUT, backend.fleet_servers()).await {
        Ok(Ok(servers)) => json!(servers),
        Ok(Err(e)) => json!({ "error": e.to_string() }),
        Err(_) => json!({ "error": format!("no answer within {} ms", BACKEND_READ_TIMEOUT.as_millis()) }),
    };
    let (matched, page) = query.apply(&reports);
    let owners = Owners::new(state.directory().map(|d| &**d));
    // A row's next release is a backend read (pages of a key's transfers on
    // TigerBeetle): a page of held rows is read a few at a time, not one by one.
    let mut rows = Vec::with_capacity(page.len());
    for chunk in page.chunks(NEXT_RELEASE_READS_MAX) {
        let reads: Vec<_> = (chunk.iter())
            .map(|report| limit_row(state, history, &owners, report))
            .collect();
        rows.extend(join_all(reads).await);
    }
    json!({
        "now_unix_ms": now_unix_ms,
        "sample_interval_ms": SAMPLE_INTERVAL_MS,
        "backend": backend_section(state, health, reports.len(), servers),
        "limits": {
            "total": reports.len(),
            "matched": matched,
            "offset": query.offset,
            "error": limits_error,
            "summary": summary(&reports, &owners),
            "rows": rows,
        },
        "gateway": gateway_section(state, history),
        "tenants": tenants_section(state, &reports, history),
        "classes": classes_section(state, &reports, history),
    })
}

async fn limit_row<'a>(
    state: &AppState,
    history: &History,
    owners: &Owners<'_>,
    report: &'a LimitReport,
) -> LimitRow<'a> {
    let definition = report.state.definition();
    let key = definition.key().as_str();
    let (retired, budget) = (owners.retired(key), owners.budget(key));
    let next_release_ms = tokio::time::timeout(BACKEND_READ_TIMEOUT, state.backend().next_release_ms(definition.key()))
        .await
        .ok()
        .and_then(Result::ok)
        .flatten();
    LimitRow {
        key: definition.key().as_str(),
        kind: definition.kind().to_string(),
        unit: definition.unit(),
        capacity: definition.capacity(),
        in_use: report.in_use,
        debt: report.debt,
        utilization_bp: basis_points(report),
        status: report.state.status(),
        pending_decrease_to: report.state.pending_decrease_to(),
        window_seconds: definition.window_seconds(),
        period: definition.period(),
        timeout_seconds: definition.timeout_seconds(),
        next_release_ms,
        retired,
        budget,
        history: history.limit(definition.key()),
    }
}

/// Counts over every limit, not just the page: what the header cards show.
/// A retired limit (a revoked or expired key's own) refuses no call: it is
/// counted apart, in none of the others.
fn summary(reports: &[LimitReport], owners: &Owners<'_>) -> Value {
    let (live, retired): (Vec<&LimitReport>, Vec<&LimitReport>) =
        (reports.iter()).partition(|r| owners.retired(r.state.definition().key().as_str()).is_none());
    let full = live.iter().filter(|r| basis_points(r) >= 10_000).count();
    let hot = live.iter().filter(|r| basis_points(r) >= 8_000).count();
    let decreasing = (live.iter())
        .filter(|r| r.state.status() == LimitStatus::Decreasing)
        .count();
    let in_debt = live.iter().filter(|r| r.debt > 0).count();
    json!({ "full": full, "above_80_percent": hot, "decreasing": decreasing, "in_debt": in_debt,
            "retired": retired.len() })
}

fn backend_section(state: &AppState, health: Option<String>, limits: usize, servers: Value) -> Value {
    let backend = state.backend();
    let kind = if backend.keeps_definitions() {
        "tigerbeetle"
    } else {
        "memory"
    };
    let mut metrics = state.backend_metrics().metrics();
    metrics.extend(state.admin().metrics());
    let metrics: Vec<Value> = (metrics.iter())
        .map(|m| {
            let value = match m.value {
                MetricValue::Counter(v) => json!(v),
                MetricValue::Gauge(v) => json!(v),
                MetricValue::Histogram(h) => json!({ "count": h.count, "p99_ms": p99_ms(&h) }),
            };
            json!({ "name": m.name, "help": m.help, "value": value })
        })
        .collect();
    json!({
        "kind": kind,
        "healthy": health.is_none(),
        "error": health,
        "limits": limits,
        "definitions_kept_by": if backend.keeps_definitions() { "cluster" } else { "registry file" },
        "servers": servers,
        "metrics": metrics,
    })
}

/// The 99th percentile of a histogram, as the upper bound of its bucket, in ms;
/// `None` without observations, `f64::INFINITY` rendered as `null` past the last bound.
fn p99_ms(h: &HistogramSnapshot) -> Option<f64> {
    if h.count == 0 {
        return None;
    }
    let rank = (h.count * 99).div_ceil(100);
    (BUCKET_BOUNDS_MICROS.iter().zip(&h.cumulative))
        .find(|(_, cumulative)| **cumulative >= rank)
        .map(|(bound, _)| *bound as f64 / 1_000.0)
}

/// The difference of two histograms: the observations between them.
fn histogram_delta(older: &HistogramSnapshot, newer: &HistogramSnapshot) -> HistogramSnapshot {
    let mut out = *newer;
    for (slot, old) in out.cumulative.iter_mut().zip(&older.cumulative) {
        *slot = slot.saturating_sub(*old);
    }
    out.count = newer.count.saturating_sub(older.count);
    out.sum_micros = newer.sum_micros.saturating_sub(older.sum_micros);
    out
}

/// The per-(model, tenant) totals' growth between two samples, summed by `group`.
fn growth_by(
    older: &GatewaySample,
    newer: &GatewaySample,
    group: impl Fn(&str, &str) -> String,
) -> BTreeMap<String, CallTotals> {
    let before: BTreeMap<(&str, &str), &CallTotals> = (older.calls.iter())
        .map(|(m, t, c)| ((m.as_str(), t.as_str()), c))
        .collect();
    let mut out: BTreeMap<String, CallTotals> = BTreeMap::new();
    for (model, tenant, now) in &newer.calls {
        let zero = CallTotals::default();
        let was = before.get(&(model.as_str(), tenant.as_str())).copied().unwrap_or(&zero);
        let sum = out.entry(group(model, tenant)).or_default();
        sum.admitted += now.admitted.saturating_sub(was.admitted);
        sum.queued += now.queued.saturating_sub(was.queued);
        sum.denied += now.denied.saturating_sub(was.denied);
        sum.provider_429 += now.provider_429.saturating_sub(was.provider_429);
        sum.tokens_reserved += now.tokens_reserved.saturating_sub(was.tokens_reserved);
        sum.tokens_used += now.tokens_used.saturating_sub(was.tokens_used);
    }
    out
}

/// `count` events over the span between two samples, per `per_ms`.
fn rate(count: u64, older: &GatewaySample, newer: &GatewaySample, per_ms: f64) -> f64 {
    let span_ms = newer.at_unix_ms.saturating_sub(older.at_unix_ms);
    if span_ms == 0 {
        return 0.0;
    }
    count as f64 * per_ms / span_ms as f64
}

fn gateway_section(state: &AppState, history: &History) -> Value {
    let Some(gateway) = state.gateway() else {
        return Value::Null;
    };
    let spans = (
        history.gateway_span(RATE_WINDOW_SECONDS),
        history.gateway_span(MINUTE_SECONDS),
    );
    let models: Vec<Value> = (gateway.status().into_iter())
        .map(|model| {
            let paused = model.is_paused();
            let mut row = json!({
                "name": model.name.clone(),
                "upstream": model.upstream,
                "paused": paused,
                "paused_ms_left": model.paused_ms_left,
                "queue_len": model.queue_len,
                "deployments": model.deployments,
            });
            if let (Some((old5, new5)), Some((old60, new60))) = &spans {
                let short = growth_by(old5, new5, |m, _| m.to_owned())
                    .remove(&model.name)
                    .unwrap_or_default();
                let minute = growth_by(old60, new60, |m, _| m.to_owned())
                    .remove(&model.name)
                    .unwrap_or_default();
                let wait = |s: &GatewaySample| s.queue_waits.iter().find(|(m, _)| *m == model.name).map(|(_, h)| *h);
                let wait_p99_ms = match (wait(old60), wait(new60)) {
                    (Some(old), Some(new)) => p99_ms(&histogram_delta(&old, &new)),
                    (None, Some(new)) => p99_ms(&new),
                    _ => None,
                };
                let total_429: u64 = (new60.calls.iter())
                    .filter(|(m, _, _)| *m == model.name)
                    .map(|(_, _, c)| c.provider_429)
                    .sum();
                let extra = json!({
                    "admitted_per_s": rate(short.admitted, old5, new5, 1_000.0),
                    "denied_per_s": rate(short.denied, old5, new5, 1_000.0),
                    "queued_per_s": rate(short.queued, old5, new5, 1_000.0),
                    "tokens_per_min": rate(minute.tokens_used, old60, new60, 60_000.0),
                    "provider_429_last_min": minute.provider_429,
                    "provider_429_total": total_429,
                    "wait_p99_ms": wait_p99_ms,
                });
                if let (Value::Object(row), Value::Object(extra)) = (&mut row, extra) {
                    row.extend(extra);
                }
            }
            row
        })
        .collect();
    json!({ "models": models })
}

/// The tenant a key belongs to: `tenant:<name>:...`.
fn tenant_of(key: &str) -> Option<&str> {
    let rest = key.strip_prefix("tenant:")?;
    rest.split(':').next().filter(|name| !name.is_empty())
}

fn tenants_section(state: &AppState, reports: &[LimitReport], history: &History) -> Value {
    let class_of: BTreeMap<String, String> = (state
        .gateway()
        .map(|g| g.class_status())
        .unwrap_or_default()
        .into_iter())
    .flat_map(|c| c.tenants.into_iter().map(move |t| (t, c.name.clone())))
    .collect();
    let minute = history.gateway_span(MINUTE_SECONDS).map(|(old, new)| {
        let growth = growth_by(&old, &new, |_, t| t.to_owned());
        (growth, old, new)
    });
    let mut tenants = tenant_limits(reports);
    if let Some((growth, _, _)) = &minute {
        for name in growth.keys().filter(|t| t.as_str() != NO_TENANT) {
            tenants.entry(name.as_str()).or_default();
        }
    }
    let total = tenants.len();
    let mut shown: Vec<(&str, TenantLimits)> = tenants.into_iter().collect();
    // The fullest first (a stable sort keeps names in order among equals).
    shown.sort_by_key(|(_, limits)| std::cmp::Reverse(limits.fullness()));
    shown.truncate(TENANTS_SHOWN_MAX);
    let rows: Vec<Value> = (shown.into_iter())
        .map(|(name, limits)| {
            let (calls, tokens) = match &minute {
                Some((growth, old, new)) => {
                    let g = growth.get(name).copied().unwrap_or_default();
                    (
                        Some(rate(g.admitted, old, new, 60_000.0)),
                        Some(rate(g.tokens_used, old, new, 60_000.0)),
                    )
                }
                None => (None, None),
            };
            json!({
                "name": name,
                "class": class_of.get(name),
                "daily_tokens": limits.daily_tokens.map(tokens_json),
                "budgets": limits.budgets.into_iter().map(money_json).collect::<Vec<_>>(),
                "calls_per_min": calls,
                "tokens_per_min": tokens,
            })
        })
        .collect();
    json!({ "total": total, "rows": rows })
}

/// The growth of the (model, class) totals between two samples.
fn class_growth(older: &GatewaySample, newer: &GatewaySample) -> BTreeMap<(String, String), ClassTotals> {
    let mut out = BTreeMap::new();
    for (model, class, now) in &newer.classes {
        let was = (older.classes.iter())
            .find(|(m, c, _)| m == model && c == class)
            .map(|(_, _, t)| t);
        let grown = match was {
            Some(was) => ClassTotals {
                admitted: now.admitted.saturating_sub(was.admitted),
                denied: now.denied.saturating_sub(was.denied),
                queued: now.queued.saturating_sub(was.queued),
                queue_wait: histogram_delta(&was.queue_wait, &now.queue_wait),
            },
            None => *now,
        };
        out.insert((model.clone(), class.clone()), grown);
    }
    out
}

/// The rates of one (model, class) pair or of a class's sum over models.
fn class_rates(
    short: Option<&ClassTotals>,
    minute: Option<&ClassTotals>,
    spans: &(GatewaySample, GatewaySample, GatewaySample, GatewaySample),
) -> Value {
    let (old5, new5, _, _) = spans;
    let zero = |t: Option<&ClassTotals>, f: fn(&ClassTotals) -> u64| t.map_or(0, f);
    json!({
        "admitted_per_s": rate(zero(short, |t| t.admitted), old5, new5, 1_000.0),
        "denied_per_s": rate(zero(short, |t| t.denied), old5, new5, 1_000.0),
        "queued_per_s": rate(zero(short, |t| t.queued), old5, new5, 1_000.0),
        "admitted_last_min": zero(minute, |t| t.admitted),
        "wait_p99_ms": minute.and_then(|t| p99_ms(&t.queue_wait)),
    })
}

/// Adds `b` into `a`: a class's sum over its models.
fn add_totals(a: &mut ClassTotals, b: &ClassTotals) {
    a.admitted += b.admitted;
    a.denied += b.denied;
    a.queued += b.queued;
    for (x, y) in a.queue_wait.cumulative.iter_mut().zip(&b.queue_wait.cumulative) {
        *x += y;
    }
    a.queue_wait.count += b.queue_wait.count;
    a.queue_wait.sum_micros += b.queue_wait.sum_micros;
}

fn merge(row: &mut Value, extra: Value) {
    if let (Value::Object(row), Value::Object(extra)) = (row, extra) {
        row.extend(extra);
    }
}

/// The classes panel: each class as configured, its tenants, its rates per
/// model and in all, what waits in it, and the use of its ceiling keys.
fn classes_section(state: &AppState, reports: &[LimitReport], history: &History) -> Value {
    let Some(gateway) = state.gateway() else {
        return Value::Null;
    };
    let spans = match (
        history.gateway_span(RATE_WINDOW_SECONDS),
        history.gateway_span(MINUTE_SECONDS),
    ) {
        (Some((a, b)), Some((c, d))) => Some((a, b, c, d)),
        _ => None,
    };
    let growth = spans
        .as_ref()
        .map(|(a, b, c, d)| (class_growth(a, b), class_growth(c, d)));
    let admissions = history.class_admissions();
    let classes: Vec<Value> = (gateway.class_status().into_iter())
        .map(|class| {
            let (mut sum_short, mut sum_minute) = (ClassTotals::default(), ClassTotals::default());
            let models: Vec<Value> = (class.queue_len.iter())
                .map(|(model, queue_len)| {
                    let pair = (model.clone(), class.name.clone());
                    let mut row = json!({ "model": model, "queue_len": queue_len });
                    if let (Some(spans), Some((short, minute))) = (&spans, &growth) {
                        let (s, m) = (short.get(&pair), minute.get(&pair));
                        s.inspect(|s| add_totals(&mut sum_short, s));
                        m.inspect(|m| add_totals(&mut sum_minute, m));
                        merge(&mut row, class_rates(s, m, spans));
                    }
                    row
                })
                .collect();
            let (ceilings, ceilings_total) = ceilings_json(&class.name, reports, history);
            let mut row = json!({
                "name": class.name,
                "share": class.share,
                "headroom_ppm": class.headroom_ppm,
                "ceiling_ppm": class.ceiling_ppm,
                "tenants": class.tenants,
                "queue_len": class.queue_len.iter().map(|(_, n)| n).sum::<usize>(),
                "models": models,
                "ceilings": ceilings,
                "ceilings_total": ceilings_total,
                "admitted_history": admissions.get(&class.name).cloned().unwrap_or_default(),
            });
            if let Some(spans) = &spans {
                merge(&mut row, class_rates(Some(&sum_short), Some(&sum_minute), spans));
            }
            row
        })
        .collect();
    json!({ "classes": classes })
}

/// The ceiling keys of class `name` (`class:<name>:<model key>`), fullest first,
/// at most [`CEILINGS_SHOWN_MAX`], with their use and history; and how many it has.
fn ceilings_json(name: &str, reports: &[LimitReport], history: &History) -> (Vec<Value>, usize) {
    let prefix = format!("class:{name}:");
    let mut ceilings: Vec<&LimitReport> = (reports.iter())
        .filter(|r| r.state.definition().key().as_str().starts_with(&prefix))
        .collect();
    let total = ceilings.len();
    ceilings.sort_by_key(|r| std::cmp::Reverse(basis_points(r)));
    ceilings.truncate(CEILINGS_SHOWN_MAX);
    let rows = (ceilings.into_iter())
        .map(|r| {
            let definition = r.state.definition();
            json!({
                "key": definition.key().as_str(),
                "unit": definition.unit(),
                "capacity": definition.capacity(),
                "in_use": r.in_use,
                "utilization_bp": basis_points(r),
                "history": history.limit(definition.key()),
            })
        })
        .collect();
    (rows, total)
}

/// One tenant's limits as the tenants table shows them, never one for the
/// other: its daily tokens and its budgets in money.
#[derive(Default)]
struct TenantLimits<'a> {
    /// The first of its limits (in key order) over a rolling day that is not
    /// money: the gateway's `tenant:<name>:llm:daily_tokens`.
    daily_tokens: Option<&'a LimitReport>,
    /// Its budgets in money (`tenant:<name>:usd:<span>`), in key order.
    budgets: Vec<&'a LimitReport>,
}

impl TenantLimits<'_> {
    /// The fullest of its limits, in basis points: the table's order.
    fn fullness(&self) -> u16 {
        (self.daily_tokens.iter().chain(&self.budgets))
            .map(|r| basis_points(r))
            .max()
            .unwrap_or(0)
    }
}

/// One pass over the limits: each tenant named by a `tenant:<name>:...` key
/// with its daily tokens and its budgets.
fn tenant_limits(reports: &[LimitReport]) -> BTreeMap<&str, TenantLimits<'_>> {
    let mut tenants: BTreeMap<&str, TenantLimits> = BTreeMap::new();
    for report in reports {
        let definition = report.state.definition();
        let key = definition.key().as_str();
        let Some(name) = tenant_of(key) else {
            continue;
        };
        let limits = tenants.entry(name).or_default();
        if is_budget_key(key) {
            limits.budgets.push(report);
        } else if limits.daily_tokens.is_none()
            && definition.period().is_none()
            && definition.window_seconds() == DAY_SECONDS
        {
            limits.daily_tokens = Some(report);
        }
    }
    tenants
}

/// A tenant's daily tokens: used = in use, with the debt while it owes, over
/// the rolling day; remaining what admission would grant (0 while it owes).
fn tokens_json(report: &LimitReport) -> Value {
    let definition = report.state.definition();
    let used = report.held_and_owed();
    json!({
        "key": definition.key().as_str(),
        "unit": definition.unit(),
        "capacity": definition.capacity(),
        "used": used,
        "remaining": report.available(),
        "owing": report.owing,
        "utilization_bp": basis_points(report),
    })
}

/// A tenant's budget in money, in micro-dollars, with its period (or window):
/// used = what it holds and owes, as admission counts it.
fn money_json(report: &LimitReport) -> Value {
    let definition = report.state.definition();
    let used = report.held_and_owed();
    json!({
        "key": definition.key().as_str(),
        "period": definition.period(),
        "window_seconds": definition.period().is_none().then(|| definition.window_seconds()),
        "budget_micro_usd": definition.capacity(),
        "used_micro_usd": used,
        "left_micro_usd": report.available(),
        "owing": report.owing,
        "utilization_bp": basis_points(report),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn p99_is_the_bucket_bound_of_the_99th_percentile() {
        let mut h = HistogramSnapshot {
            cumulative: [0; BUCKET_BOUNDS_MICROS.len()],
            count: 0,
            sum_micros: 0,
        };
        assert_eq!(p99_ms(&h), None);
        // 100 observations: 98 at or below 1 ms, the other two at or below 5 ms.
        for (i, bound) in BUCKET_BOUNDS_MICROS.iter().enumerate() {
            h.cumulative[i] = if *bound < 1_000 {
                0
            } else if *bound < 5_000 {
                98
            } else {
                100
            };
        }
        h.count = 100;
        assert_eq!(p99_ms(&h), Some(5.0));
        let older = HistogramSnapshot { count: 98, ..h };
        let mut older = older;
        for (i, bound) in BUCKET_BOUNDS_MICROS.iter().enumerate() {
            older.cumulative[i] = if *bound < 1_000 { 0 } else { 98 };
        }
        let delta = histogram_delta(&older, &h);
        assert_eq!(
            (delta.count, p99_ms(&delta)),
            (2, Some(5.0)),
            "only the last two calls count"
        );
    }

    #[test]
    fn tenants_are_read_from_their_keys() {
        assert_eq!(tenant_of("tenant:acme:llm:daily_tokens"), Some("acme"));
        assert_eq!(tenant_of("tenant::x"), None);
        assert_eq!(tenant_of("global:llm:openai:gpt:rpm"), None);
    }

    #[test]
    fn growth_is_summed_per_group_over_the_span() {
        let pair = |m: &str, t: &str, admitted: u64| {
            (
                m.to_owned(),
                t.to_owned(),
                CallTotals {
                    admitted,
                    ..CallTotals::default()
                },
            )
        };
        let older = GatewaySample {
            at_unix_ms: 0,
            calls: vec![pair("gpt", "a", 10)],
            queue_waits: Vec::new(),
            classes: Vec::new(),
        };
        let newer = GatewaySample {
            at_unix_ms: 2_000,
            calls: vec![pair("gpt", "a", 14), pair("gpt", "b", 2)],
            queue_waits: Vec::new(),
            classes: Vec::new(),
        };
        let by_model = growth_by(&older, &newer, |m, _| m.to_owned());
        assert_eq!(by_model["gpt"].admitted, 6);
        assert_eq!(rate(by_model["gpt"].admitted, &older, &newer, 1_000.0), 3.0);
        let by_tenant = growth_by(&older, &newer, |_, t| t.to_owned());
        assert_eq!((by_tenant["a"].admitted, by_tenant["b"].admitted), (4, 2));
    }
}
