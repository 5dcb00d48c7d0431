//! The memory backend's spend ledger (docs/prices.md, "The spend ledger"): reports
//! group and sum completed calls by tenant, key, model, deployment and day within
//! the days asked; every acknowledged entry is read back after a reopen, a torn
//! last line is cut, and entries acknowledged before a SIGKILL survive it.

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};

use ratelimiter::spend::{SpendEntry, SpendError, SpendField, SpendLedger, SpendQuery, SpendRow, UtcDay};

/// 2026-11-28T00:00:00Z (`date -u -d 2026-11-28 +%s`).
const SAT_MS: u64 = 1_795_824_000_000;
const DAY_MS: u64 = 86_400_000;
/// The environment variable that makes [`child_appends_until_killed`] run: set
/// only by the parent test, which kills it.
const CHILD_PATH_ENV: &str = "RATELIMITER_SPEND_CHILD_LEDGER";
/// The acknowledged entries the parent waits for before it kills the child.
const ACKED_BEFORE_KILL: u64 = 40;

fn temp_file(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ratelimiter-spend-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir.join("gateway-spend.jsonl")
}

fn call(at_unix_ms: u64, tenant: &str, key: &str, model: &str, micro_usd: u64) -> SpendEntry {
    SpendEntry {
        at_unix_ms,
        tenant: tenant.into(),
        key: key.into(),
        model: model.into(),
        deployment: format!("{model}-east").into(),
        input_tokens: 100,
        cached_tokens: 10,
        output_tokens: 20,
        micro_usd,
        unpriced: false,
    }
}

fn day(text: &str) -> UtcDay {
    UtcDay::parse(text).unwrap()
}

fn query(from: &str, to: &str, group_by: &[SpendField]) -> SpendQuery {
    SpendQuery::new(day(from), day(to), group_by.to_vec()).unwrap()
}

/// Friday 27th to Sunday 29th: acme's two keys on two models, and globex.
fn fill(ledger: &SpendLedger) {
    for entry in [
        call(SAT_MS - 1, "acme", "k1", "gpt-4o", 1_000),
        call(SAT_MS, "acme", "k1", "gpt-4o", 2_000),
        call(SAT_MS + 5, "acme", "k2", "gpt-4o", 4_000),
        call(SAT_MS + 6, "acme", "k2", "claude-sonnet-4-5", 8_000),
        call(SAT_MS + DAY_MS - 1, "globex", "", "gpt-4o", 16_000),
        call(SAT_MS + DAY_MS, "acme", "k1", "gpt-4o", 32_000),
    ] {
        ledger.append(&entry).unwrap();
    }
}

fn row(calls: u64, micro_usd: u64) -> SpendRow {
    SpendRow {
        calls,
        input_tokens: 100 * calls,
        cached_tokens: 10 * calls,
        output_tokens: 20 * calls,
        micro_usd,
        ..SpendRow::default()
    }
}

#[test]
fn reports_group_and_sum_by_any_fields_within_the_days() {
    let ledger = SpendLedger::open(temp_file("report")).unwrap();
    fill(&ledger);
    // Saturday alone, ungrouped: the calls from its first to its last millisecond.
    assert_eq!(ledger.query(&query("2026-11-28", "2026-11-28", &[])), [row(4, 30_000)]);
    assert_eq!(ledger.query(&query("2026-11-27", "2026-11-29", &[])), [row(6, 63_000)]);
    assert!(
        ledger.query(&query("2026-11-30", "2026-12-31", &[])).is_empty(),
        "no calls, no rows"
    );
    let by_tenant = ledger.query(&query("2026-11-27", "2026-11-29", &[SpendField::Tenant]));
    assert_eq!(
        by_tenant,
        [
            SpendRow {
                tenant: Some("acme".into()),
                ..row(5, 47_000)
            },
            SpendRow {
                tenant: Some("globex".into()),
                ..row(1, 16_000)
            },
        ]
    );
    let by_day_and_model = ledger.query(&query(
        "2026-11-28",
        "2026-11-29",
        &[SpendField::Day, SpendField::Model],
    ));
    assert_eq!(
        by_day_and_model,
        [
            SpendRow {
                model: Some("claude-sonnet-4-5".into()),
                day: Some(day("2026-11-28")),
                ..row(1, 8_000)
            },
            SpendRow {
                model: Some("gpt-4o".into()),
                day: Some(day("2026-11-28")),
                ..row(3, 22_000)
            },
            SpendRow {
                model: Some("gpt-4o".into()),
                day: Some(day("2026-11-29")),
                ..row(1, 32_000)
            },
        ]
    );
    let every = ledger.query(&query("2026-11-28", "2026-11-28", &SpendField::ALL));
    assert_eq!(every.len(), 4);
    assert_eq!(every[3].key.as_deref(), Some(""), "globex's call had no key");
    assert_eq!(every[3].deployment.as_deref(), Some("gpt-4o-east"));
    let json = serde_json::to_value(&by_tenant[0]).unwrap();
    assert_eq!(json["tenant"], "acme");
    assert!(json.get("day").is_none(), "fields not grouped by are left out");
    assert_eq!(json["micro_usd"], 47_000);
}

#[test]
fn every_acknowledged_entry_is_read_back_after_a_reopen_and_a_torn_line_is_cut() {
    let path = temp_file("reopen");
    let first = SpendLedger::open(&path).unwrap();
    fill(&first);
    let all = query("2026-11-27", "2026-11-29", &[SpendField::Tenant, SpendField::Day]);
    let before = first.query(&all);
    drop(first);
    // A crash mid-write: half a line, never acknowledged.
    let whole = std::fs::metadata(&path).unwrap().len();
    let mut file = std::fs::OpenOptions::new().append(true).open(&path).unwrap();
    file.write_all(br#"{"at_unix_ms":1795824000000,"tenant":"ac"#).unwrap();
    drop(file);
    let reopened = SpendLedger::open(&path).unwrap();
    assert_eq!(reopened.query(&all), before);
    assert_eq!(std::fs::metadata(&path).unwrap().len(), whole, "the torn line is cut");
    reopened.append(&call(SAT_MS, "acme", "k1", "gpt-4o", 64_000)).unwrap();
    drop(reopened);
    let again = SpendLedger::open(&path).unwrap();
    assert_eq!(again.query(&query("2026-11-28", "2026-11-28", &[])), [row(5, 94_000)]);
}

/// The ledger says who spent what: created 0600, and an older file readable
/// by others is narrowed when opened.
#[cfg(unix)]
#[test]
fn the_ledger_file_is_its_owners_only() {
    use std::os::unix::fs::PermissionsExt;
    let mode = |path: &PathBuf| std::fs::metadata(path).unwrap().permissions().mode() & 0o777;
    let path = temp_file("mode");
    let ledger = SpendLedger::open(&path).unwrap();
    ledger.append(&call(SAT_MS, "acme", "k1", "gpt-4o-mini", 10)).unwrap();
    assert_eq!(mode(&path), 0o600);
    drop(ledger);
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    SpendLedger::open(&path).unwrap();
    assert_eq!(mode(&path), 0o600);
}

#[test]
fn bad_entries_change_nothing_and_a_bad_line_stops_the_open() {
    let path = temp_file("bad");
    let ledger = SpendLedger::open(&path).unwrap();
    let error = ledger.append(&call(SAT_MS, "", "k", "m", 1)).unwrap_err();
    assert!(
        matches!(&error, SpendError::Invalid(m) if m.contains("tenant")),
        "{error}"
    );
    assert!(!path.exists(), "nothing was written");
    ledger.append(&call(SAT_MS, "acme", "k", "m", 1)).unwrap();
    drop(ledger);
    let mut file = std::fs::OpenOptions::new().append(true).open(&path).unwrap();
    file.write_all(b"{\"at_unix_ms\":1}\n").unwrap();
    drop(file);
    let error = SpendLedger::open(&path).unwrap_err();
    assert!(error.contains("line 2"), "{error}");
}

#[test]
fn entries_acknowledged_before_a_sigkill_survive_it() {
    let path = temp_file("sigkill");
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_appends_until_killed",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_PATH_ENV, &path)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = BufReader::new(child.stdout.take().unwrap());
    let mut acked = 0;
    for line in stdout.lines() {
        if line.unwrap().starts_with("acked ") {
            acked += 1;
            if acked == ACKED_BEFORE_KILL {
                break;
            }
        }
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    assert_eq!(acked, ACKED_BEFORE_KILL, "the child acknowledged entries");
    let ledger = SpendLedger::open(&path).unwrap();
    let rows = ledger.query(&query("2026-11-28", "2026-11-28", &[]));
    assert!(
        rows[0].calls >= ACKED_BEFORE_KILL,
        "{} of {ACKED_BEFORE_KILL}",
        rows[0].calls
    );
    assert_eq!(rows[0].micro_usd, rows[0].calls, "whole entries only");
}

/// Not a test of its own: the process [`entries_acknowledged_before_a_sigkill_survive_it`]
/// starts and kills. It appends entries for ever, printing each acknowledgement;
/// without the parent's environment variable it does nothing.
#[test]
fn child_appends_until_killed() {
    let Some(path) = std::env::var_os(CHILD_PATH_ENV) else {
        return;
    };
    let ledger = SpendLedger::open(PathBuf::from(path)).unwrap();
    let mut out = std::io::stdout();
    for i in 0.. {
        ledger.append(&call(SAT_MS + i, "acme", "k", "gpt-4o", 1)).unwrap();
        writeln!(out, "acked {i}").unwrap();
        out.flush().unwrap();
    }
}

#[tokio::test]
async fn the_book_records_batches_and_counts_unpriced_calls_apart() {
    use ratelimiter::spend::{SpendBook, SpendRecord};
    let path = temp_file("book");
    let ledger = SpendLedger::open(&path).unwrap();
    let free = SpendEntry {
        micro_usd: 0,
        unpriced: true,
        ..call(SAT_MS, "acme", "", "llama-local", 0)
    };
    let batch = [call(SAT_MS, "acme", "", "llama-local", 5), free];
    let records: Vec<SpendRecord> = batch.iter().cloned().map(SpendRecord::new).collect();
    ledger.record(&records).await.unwrap();
    // A bad entry refuses its whole batch: nothing of it is written.
    let bad = SpendRecord::new(SpendEntry {
        tenant: "".into(),
        ..batch[0].clone()
    });
    let error = ledger.record(&[records[0].clone(), bad]).await.unwrap_err();
    assert!(error.to_string().contains("tenant: must not be empty"), "{error}");
    let expected = vec![SpendRow {
        unpriced_calls: 1,
        ..row(2, 5)
    }];
    let whole = query("2026-11-28", "2026-11-28", &[]);
    assert_eq!(ledger.report(&whole).await.unwrap(), expected);
    let reopened = SpendLedger::open(&path).unwrap();
    assert_eq!(reopened.query(&whole), expected, "the flag survives a reopen");
}
