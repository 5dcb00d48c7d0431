//! What `GET /ui/api/directory` answers: the tenants and keys panel's
//! document (docs/console.md, "Tenants and keys"). Every tenant with where it
//! comes from, its class and limits; one page of keys, newest first, each with
//! its calls and tokens today. Never a key's text or hash: the page shows a
//! new key's text only from the 201 of the admin API that made it.

use futures_util::future::join_all;
use ratelimiter::directory::{Directory, KeyView, DAY_WINDOW_SECONDS};
use serde_json::{json, Value};

use crate::console::view::{BACKEND_READ_TIMEOUT, NEXT_RELEASE_READS_MAX};
use crate::directory_api::tenant_json;
use crate::state::AppState;

/// The most tenants listed, by name: a screen's worth; the panel says how many there are.
pub const DIRECTORY_TENANTS_SHOWN_MAX: usize = 200;
/// The most keys in one page of the panel.
pub const DIRECTORY_KEYS_PAGE_MAX: usize = 200;
/// The keys in a page unless the page asks for another count.
pub const DIRECTORY_KEYS_PAGE_DEFAULT: usize = 50;
/// The longest `tenant` filter: a tenant's name is at most 64 bytes.
const TENANT_FILTER_BYTES_MAX: usize = 64;

/// The page of keys asked for: `?tenant=&offset=&count=`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeysQuery {
    /// Only this tenant's keys.
    pub tenant: Option<String>,
    /// Keys skipped, newest first.
    pub offset: usize,
    /// Keys in the page, 1..=[`DIRECTORY_KEYS_PAGE_MAX`].
    pub count: usize,
}

impl KeysQuery {
    /// The query of `query` (the URL's query string); an error names the parameter.
    pub fn parse(query: Option<&str>) -> Result<Self, String> {
        let mut out = Self {
            tenant: None,
            offset: 0,
            count: DIRECTORY_KEYS_PAGE_DEFAULT,
        };
        let mut seen = Vec::new();
        for pair in query.unwrap_or_default().split('&').filter(|p| !p.is_empty()) {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            if seen.contains(&name) {
                return Err(format!("{name}: given twice"));
            }
            seen.push(name);
            let number = |max: usize| {
                (value.parse::<usize>().ok())
                    .filter(|n| *n <= max)
                    .ok_or_else(|| format!("{name}: must be a whole number up to {max}"))
            };
            match name {
                "tenant" if value.is_empty() => {}
                "tenant" if value.len() > TENANT_FILTER_BYTES_MAX => {
                    return Err(format!("tenant: at most {TENANT_FILTER_BYTES_MAX} bytes"));
                }
                // Tenant names need no escaping: a value with escapes names no tenant.
                "tenant" => out.tenant = Some(value.to_owned()),
                "offset" => out.offset = number(usize::MAX)?,
                "count" => {
                    out.count = number(DIRECTORY_KEYS_PAGE_MAX)?;
                    if out.count == 0 {
                        return Err(format!("count: must be 1..={DIRECTORY_KEYS_PAGE_MAX}"));
                    }
                }
                _ => return Err(format!("{name}: unknown parameter (tenant, offset, count)")),
            }
        }
        Ok(out)
    }
}

/// The panel's document for `query`.
pub async fn directory_document(state: &AppState, directory: &Directory, query: &KeysQuery) -> Value {
    let tenants = directory.tenants();
    let mut keys = directory.keys(query.tenant.as_deref());
    // Newest first; ids are ULIDs, so they break ties in creation order too.
    keys.sort_by(|a, b| (b.created_at, &b.id).cmp(&(a.created_at, &a.id)));
    let matched = keys.len();
    let page: Vec<KeyView> = keys.into_iter().skip(query.offset).take(query.count).collect();
    let mut rows = Vec::with_capacity(page.len());
    for chunk in page.chunks(NEXT_RELEASE_READS_MAX) {
        let reads: Vec<_> = chunk.iter().map(|key| key_row(state, directory, key)).collect();
        rows.extend(join_all(reads).await);
    }
    let day_started_unix_ms = state.gateway().map(|g| g.key_usage().day_started_unix_ms());
    json!({
        "gateway": state.gateway().is_some(),
        "day_started_unix_ms": day_started_unix_ms,
        "tenants": {
            "total": tenants.len(),
            "rows": tenants.iter().take(DIRECTORY_TENANTS_SHOWN_MAX).map(tenant_json).collect::<Vec<_>>(),
        },
        "keys": {
            "total": directory.sizes().1,
            "matched": matched,
            "offset": query.offset,
            "tenant": query.tenant,
            "rows": rows,
        },
    })
}

/// A key's row: its view, its calls today on this server, and its tokens
/// today: fleet-wide from its own `daily_tokens` limit when it has one (the
/// use over the rolling day, as every server of a fleet reserves it), else as
/// this server counted them since the start of the UTC day.
async fn key_row(state: &AppState, directory: &Directory, key: &KeyView) -> Value {
    let usage = state.gateway().map(|g| g.key_usage().of(&key.id));
    let mut tokens_today = usage.map(|u| u.tokens);
    let mut tokens_from = "server";
    if let Some(record) = directory.key(&key.id).filter(|r| r.limits.daily_tokens.is_some()) {
        let limit = record.limit_key("daily_tokens");
        let report = tokio::time::timeout(BACKEND_READ_TIMEOUT, state.backend().limit_report(&limit)).await;
        if let Ok(Ok(Some(report))) = report {
            if report.state.definition().window_seconds() == DAY_WINDOW_SECONDS {
                tokens_today = Some(report.held_and_owed());
                tokens_from = "fleet_daily_limit";
            }
        }
    }
    let mut row = serde_json::to_value(key).expect("a key view serializes");
    row["calls_today"] = json!(usage.map(|u| u.calls));
    row["tokens_today"] = json!(tokens_today);
    row["tokens_today_from"] = json!(tokens_from);
    row
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_keys_query_names_its_bad_parameters() {
        assert_eq!(
            KeysQuery::parse(None).unwrap(),
            KeysQuery {
                tenant: None,
                offset: 0,
                count: DIRECTORY_KEYS_PAGE_DEFAULT
            }
        );
        let query = KeysQuery::parse(Some("tenant=acme&offset=50&count=25")).unwrap();
        assert_eq!(
            (query.tenant.as_deref(), query.offset, query.count),
            (Some("acme"), 50, 25)
        );
        assert_eq!(KeysQuery::parse(Some("tenant=")).unwrap().tenant, None);
        for (bad, named) in [
            ("count=0", "count"),
            ("count=201", "count"),
            ("offset=-1", "offset"),
            ("colour=red", "colour"),
            ("count=5&count=6", "count"),
        ] {
            let error = KeysQuery::parse(Some(bad)).unwrap_err();
            assert!(error.starts_with(named), "{bad}: {error}");
        }
        assert!(KeysQuery::parse(Some(&format!("tenant={}", "a".repeat(65)))).is_err());
    }
}
