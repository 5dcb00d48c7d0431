//! The spend ledger on a real TigerBeetle cluster: entries recorded through one
//! server's book are reported by another's (opened before, or after, the
//! writes: a late server catches up from the cluster), over several pages and
//! batches; a retried write is counted once.

#![cfg(feature = "tigerbeetle")]

mod tigerbeetle_common;

use std::sync::Arc;

use ratelimiter::spend::{SpendBook, SpendEntry, SpendField, SpendQuery, SpendRecord, SpendRow, UtcDay};
use ratelimiter::tigerbeetle::{SubmitMode, TigerBeetleSpendBook};
use ratelimiter::{LeaseId, SystemClock};

/// 2026-11-28T10:00:00Z.
const AT_UNIX_MS: u64 = 1_795_860_000_000;

async fn book() -> TigerBeetleSpendBook {
    let clock = Arc::new(SystemClock::new());
    let backend = Arc::new(tigerbeetle_common::backend_with(SubmitMode::Batching, clock).await);
    let book = TigerBeetleSpendBook::new(backend);
    book.read_history().await.unwrap();
    book
}

/// A tenant no other test uses (tests share the cluster).
fn unique(name: &str) -> String {
    format!("{name}-{}", LeaseId::generate().to_string().to_lowercase())
}

fn entry(tenant: &str, key: &str, model: &str, micro_usd: u64) -> SpendEntry {
    SpendEntry {
        at_unix_ms: AT_UNIX_MS,
        tenant: tenant.into(),
        key: key.into(),
        model: model.into(),
        deployment: "azure-east".into(),
        input_tokens: 100,
        cached_tokens: 20,
        output_tokens: 10,
        micro_usd,
        unpriced: false,
    }
}

/// The rows of `tenant` on the day of [`AT_UNIX_MS`], grouped by tenant and model.
async fn rows_of(book: &TigerBeetleSpendBook, tenant: &str) -> Vec<SpendRow> {
    let day = UtcDay::of_unix_ms(AT_UNIX_MS);
    let query = SpendQuery::new(day, day, vec![SpendField::Tenant, SpendField::Model]).unwrap();
    let rows = book.report(&query).await.unwrap();
    rows.into_iter()
        .filter(|r| r.tenant.as_deref() == Some(tenant))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entries_written_on_one_server_are_reported_by_another() {
    let early = book().await;
    let writer = book().await;
    let tenant = unique("acme");
    // More than one request's batch and many pages of the log.
    let records: Vec<SpendRecord> = (0..250)
        .map(|i| {
            let model = if i % 5 == 0 { "gpt-4o" } else { "claude-sonnet-4-5" };
            SpendRecord::new(entry(&tenant, &format!("K{}", i % 3), model, 1_000 + i))
        })
        .collect();
    writer.record(&records).await.unwrap();
    let late = book().await;
    let expected = |model: &str| {
        let of_model: Vec<&SpendEntry> = (records.iter().map(|r| &r.entry))
            .filter(|e| &*e.model == model)
            .collect();
        (of_model.len() as u64, of_model.iter().map(|e| e.micro_usd).sum::<u64>())
    };
    for reader in [&early, &writer, &late] {
        let rows = rows_of(reader, &tenant).await;
        let got: Vec<(&str, u64, u64, u64)> = (rows.iter())
            .map(|r| (r.model.as_deref().unwrap(), r.calls, r.micro_usd, r.cached_tokens))
            .collect();
        let (sonnet, gpt) = (expected("claude-sonnet-4-5"), expected("gpt-4o"));
        assert_eq!(
            got,
            vec![
                ("claude-sonnet-4-5", sonnet.0, sonnet.1, 20 * sonnet.0),
                ("gpt-4o", gpt.0, gpt.1, 20 * gpt.0)
            ]
        );
    }
    assert_eq!(late.malformed_total(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_write_is_counted_once() {
    let (a, b) = (book().await, book().await);
    let tenant = unique("retry");
    let records = vec![
        SpendRecord::new(entry(&tenant, "", "gpt-4o", 7)),
        SpendRecord::new(entry(&tenant, "K", "gpt-4o", 11)),
    ];
    a.record(&records).await.unwrap();
    // The answer was lost: the same batch again, from another server too.
    a.record(&records).await.unwrap();
    b.record(&records[1..]).await.unwrap();
    // A new entry beside the retries counts.
    b.record(&[SpendRecord::new(entry(&tenant, "K", "gpt-4o", 100))])
        .await
        .unwrap();
    for reader in [&a, &b] {
        let rows = rows_of(reader, &tenant).await;
        assert_eq!(
            rows.iter().map(|r| (r.calls, r.micro_usd)).collect::<Vec<_>>(),
            vec![(3, 118)]
        );
    }
    // A bad entry refuses its batch and writes nothing.
    let bad = SpendRecord::new(SpendEntry {
        model: "".into(),
        ..entry(&tenant, "", "m", 1)
    });
    let good = SpendRecord::new(entry(&tenant, "", "gpt-4o", 1_000));
    let error = a.record(&[good, bad]).await.unwrap_err().to_string();
    assert!(error.contains("model: must not be empty"), "{error}");
    assert_eq!(rows_of(&a, &tenant).await[0].calls, 3);
}
