//! `GET /v1/admin/gateway/spend` (docs/http-api.md, "Spend"): the gateway's
//! spend ledger summed over days in UTC and grouped by tenant, key, model,
//! deployment and day, in JSON or CSV. The sums are the ledger's, kept in
//! memory: a report reads no history. Served where the tenants and keys are:
//! with `server.admin_token`, or on a loopback listener.

use std::fmt::Write as _;

use axum::extract::{RawQuery, Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use ratelimiter::spend::{SpendError, SpendField, SpendQuery, SpendRow, UtcDay};
use ratelimiter::Clock;

use crate::console::access::Access;
use crate::error::ApiError;
use crate::state::AppState;

/// The longest query string read: four parameters of a few dozen bytes; a
/// longer one is a mistake, refused before it is parsed.
const QUERY_BYTES_MAX: usize = 1_024;
/// The parameters the endpoint takes.
const PARAMETERS: [&str; 4] = ["from", "to", "group_by", "format"];
/// How long a client waits before asking again while the ledger is away.
const UNAVAILABLE_RETRY_MS: u64 = 1_000;

/// Refuses the route where the console is off (no admin token on a listener
/// beyond loopback), and on a server without a gateway (no ledger).
pub async fn served(State(state): State<AppState>, request: Request, next: Next) -> Response {
    if state.console().access() == Access::Off || state.spend().is_none() {
        let path = request.uri().path().to_owned();
        return ApiError::RouteNotFound(format!(
            "{path} (the spend report is served with a gateway section, and with server.admin_token set or on a loopback listener)"
        ))
        .into_response();
    }
    next.run(request).await
}

/// The report's format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Format {
    Json,
    Csv,
}

/// The parameters of one request, each at most once.
#[derive(Debug, Default)]
struct Parameters {
    from: Option<String>,
    to: Option<String>,
    group_by: Option<String>,
    format: Option<String>,
}

fn invalid(message: String) -> ApiError {
    ApiError::InvalidRequest(message)
}

/// Reads the query string: an unknown or repeated parameter, or one that is
/// not valid percent-encoded UTF-8, is a 400 naming it.
fn parameters(query: Option<&str>) -> Result<Parameters, ApiError> {
    let query = query.unwrap_or("");
    if query.len() > QUERY_BYTES_MAX {
        return Err(invalid(format!(
            "the query string is longer than {QUERY_BYTES_MAX} bytes"
        )));
    }
    let mut out = Parameters::default();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        let name =
            decoded(name).ok_or_else(|| invalid("the query string: a name is not percent-encoded UTF-8".to_owned()))?;
        let value = decoded(value).ok_or_else(|| invalid(format!("{name}: not percent-encoded UTF-8")))?;
        let slot = match name.as_str() {
            "from" => &mut out.from,
            "to" => &mut out.to,
            "group_by" => &mut out.group_by,
            "format" => &mut out.format,
            _ => {
                return Err(invalid(format!(
                    "{name}: unknown parameter; one of {}",
                    PARAMETERS.join(", ")
                )))
            }
        };
        if slot.replace(value).is_some() {
            return Err(invalid(format!("{name}: given twice")));
        }
    }
    Ok(out)
}

/// `text` percent-decoded (`+` is a space, as forms write it); `None` when an
/// escape is cut or the bytes are not UTF-8.
fn decoded(text: &str) -> Option<String> {
    let mut bytes = Vec::with_capacity(text.len());
    let mut rest = text.as_bytes();
    while let Some((&byte, tail)) = rest.split_first() {
        rest = tail;
        match byte {
            b'+' => bytes.push(b' '),
            b'%' => {
                let hex = std::str::from_utf8(rest.get(..2)?).ok()?;
                bytes.push(u8::from_str_radix(hex, 16).ok()?);
                rest = &rest[2..];
            }
            other => bytes.push(other),
        }
    }
    String::from_utf8(bytes).ok()
}

/// `GET /v1/admin/gateway/spend?from=&to=&group_by=&format=`.
pub async fn gateway_spend(State(state): State<AppState>, RawQuery(query): RawQuery) -> Result<Response, ApiError> {
    let p = parameters(query.as_deref())?;
    let format = match p.format.as_deref() {
        None | Some("json") => Format::Json,
        Some("csv") => Format::Csv,
        Some(other) => return Err(invalid(format!("format: {other:?} is not json or csv"))),
    };
    let today = UtcDay::of_unix_ms(ratelimiter::SystemClock::new().now_unix_ms());
    let spend_query =
        SpendQuery::parse(p.from.as_deref(), p.to.as_deref(), p.group_by.as_deref(), today).map_err(|e| match e {
            SpendError::Invalid(message) => invalid(message),
            other => ApiError::Internal(other.to_string()),
        })?;
    let book = state.spend().expect("checked by `served`");
    let rows = book.report(&spend_query).await.map_err(|e| {
        tracing::warn!(error = %e, "the spend report could not be read");
        ApiError::Unavailable {
            retry_after_ms: UNAVAILABLE_RETRY_MS,
        }
    })?;
    let fields: Vec<SpendField> = (SpendField::ALL.into_iter())
        .filter(|&f| spend_query.groups_by(f))
        .collect();
    Ok(match format {
        Format::Json => (
            [(header::CONTENT_TYPE, "application/json")],
            json_report(&spend_query, &fields, &rows),
        )
            .into_response(),
        Format::Csv => (
            [(header::CONTENT_TYPE, "text/csv; charset=utf-8")],
            csv_report(&fields, &rows),
        )
            .into_response(),
    })
}

/// Micro-dollars as exact dollars with six decimals (`1.250000`): a float
/// would round a finance report's cents.
pub(crate) fn usd(micro_usd: u64) -> String {
    format!("{}.{:06}", micro_usd / 1_000_000, micro_usd % 1_000_000)
}

/// The value of `field` in `row` (grouped by it).
fn group_value(row: &SpendRow, field: SpendField) -> String {
    let text = match field {
        SpendField::Tenant => row.tenant.clone(),
        SpendField::Key => row.key.clone(),
        SpendField::Model => row.model.clone(),
        SpendField::Deployment => row.deployment.clone(),
        SpendField::Day => row.day.map(|d| d.to_string()),
    };
    text.unwrap_or_default()
}

/// The sums of a row after its group's fields: (name, value as written).
fn sums(row: &SpendRow) -> [(&'static str, String); 7] {
    [
        ("calls", row.calls.to_string()),
        ("input_tokens", row.input_tokens.to_string()),
        ("cached_tokens", row.cached_tokens.to_string()),
        ("output_tokens", row.output_tokens.to_string()),
        ("usd", usd(row.micro_usd)),
        ("micro_usd", row.micro_usd.to_string()),
        ("unpriced_calls", row.unpriced_calls.to_string()),
    ]
}

/// `{"from", "to", "group_by", "rows": [{group fields..., sums...}]}`, the
/// dollars written as an exact decimal number.
fn json_report(query: &SpendQuery, fields: &[SpendField], rows: &[SpendRow]) -> String {
    let quoted = |text: &str| serde_json::to_string(text).expect("a string serializes");
    let names: Vec<String> = fields.iter().map(|f| quoted(f.name())).collect();
    let mut out = format!(
        "{{\"from\":\"{}\",\"to\":\"{}\",\"group_by\":[{}],\"rows\":[",
        query.from(),
        query.to(),
        names.join(",")
    );
    for (i, row) in rows.iter().enumerate() {
        out.push_str(if i == 0 { "{" } else { ",{" });
        for field in fields {
            let _ = write!(out, "{}:{},", quoted(field.name()), quoted(&group_value(row, *field)));
        }
        let values: Vec<String> = sums(row)
            .iter()
            .map(|(name, value)| format!("\"{name}\":{value}"))
            .collect();
        out.push_str(&values.join(","));
        out.push('}');
    }
    out.push_str("]}");
    out
}

/// A header row of the group's fields and the sums' names, then one line per row.
fn csv_report(fields: &[SpendField], rows: &[SpendRow]) -> String {
    let mut header: Vec<&str> = fields.iter().map(|f| f.name()).collect();
    header.extend(sums(&SpendRow::default()).iter().map(|(name, _)| *name));
    let mut out = header.join(",");
    out.push('\n');
    for row in rows {
        let mut cells: Vec<String> = fields.iter().map(|&f| csv_cell(&group_value(row, f))).collect();
        cells.extend(sums(row).into_iter().map(|(_, value)| value));
        out.push_str(&cells.join(","));
        out.push('\n');
    }
    out
}

/// A CSV cell (RFC 4180): quoted when it holds a comma, quote or line break;
/// a name a spreadsheet would run as a formula (`=`, `+`, `-`, `@` first) is
/// prefixed with `'`.
fn csv_cell(text: &str) -> String {
    let text = if text.starts_with(['=', '+', '-', '@']) {
        format!("'{text}")
    } else {
        text.to_owned()
    };
    if text.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", text.replace('"', "\"\""))
    } else {
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameters_are_known_and_given_once() {
        let p = parameters(Some("from=2026-11-01&group_by=tenant%2Cday")).unwrap();
        assert_eq!(
            (p.from.as_deref(), p.group_by.as_deref()),
            (Some("2026-11-01"), Some("tenant,day"))
        );
        for (query, message) in [
            ("since=2026-11-01", "since: unknown parameter"),
            ("to=2026-11-01&to=2026-11-02", "to: given twice"),
            ("from=%ff", "from: not percent-encoded"),
            ("from=%2", "from: not percent-encoded"),
        ] {
            let error = parameters(Some(query)).unwrap_err().to_string();
            assert!(error.contains(message), "{error}");
        }
    }

    #[test]
    fn dollars_are_exact_and_cells_are_quoted() {
        assert_eq!(usd(0), "0.000000");
        assert_eq!(usd(12_345_678), "12.345678");
        assert_eq!(csv_cell("a,b\"c"), "\"a,b\"\"c\"");
        assert_eq!(csv_cell("=1+2"), "'=1+2");
        assert_eq!(csv_cell("acme"), "acme");
    }
}
