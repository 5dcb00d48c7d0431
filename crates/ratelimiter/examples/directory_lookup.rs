//! The gateway's key lookup (`DirectoryIndex::authenticate`: one SHA-256 of the
//! presented key and one hash-map probe) with 1 key and with 100,000 keys, in
//! the same run, alternating rounds; prints the median ns per lookup of each
//! and their ratio. Then what 100,000 keys add to a memory-backend server's
//! start: opening the directory's file (read, parse, index) against an empty
//! one, and the resident memory it adds (BENCHMARKS.md, "Gateway keys").
//!
//! cargo run --release -p ratelimiter --example directory_lookup

use std::hint::black_box;
use std::time::Instant;

use std::sync::Arc;

use ratelimiter::directory::{
    Change, Directory, DirectoryIndex, FileStore, KeyHash, KeyLimits, KeyRecord, Recorded, Source, TenantFields,
    TenantRecord,
};
use ratelimiter::SystemClock;

/// Lookups per round.
const LOOKUPS: usize = 1_000_000;
/// Rounds of each size, alternating.
const ROUNDS: usize = 7;
/// The large directory.
const KEYS_LARGE: usize = 100_000;

fn key_text(i: usize) -> String {
    format!("rlk-benchmark-key-{i:0>40}")
}

fn changes(keys: usize) -> Vec<Change> {
    let tenant = TenantRecord {
        name: "acme".into(),
        id: "T".into(),
        source: Source::Api,
        fields: TenantFields::default(),
        created_at_unix_ms: 1,
        updated_at_unix_ms: 1,
    };
    let mut out = vec![Change::PutTenant { tenant }];
    for i in 0..keys {
        let key = KeyRecord {
            id: format!("K{i}"),
            tenant: "acme".into(),
            tenant_id: "T".into(),
            name: String::new(),
            models: None,
            limits: KeyLimits {
                rpm: Some(600),
                ..Default::default()
            },
            limits_of: format!("K{i}"),
            hash: KeyHash::of(&key_text(i)),
            hint: "abcd".into(),
            created_at_unix_ms: 1,
            expires_at_unix_ms: None,
            revoked_at_unix_ms: None,
            rotated_to: None,
        };
        out.push(Change::CreateKey { key });
    }
    out
}

fn index_of(keys: usize) -> DirectoryIndex {
    let mut index = DirectoryIndex::default();
    for (i, change) in changes(keys).into_iter().enumerate() {
        index.apply(Recorded {
            version: i as u64 + 1,
            change,
        });
    }
    index
}

/// This process's resident memory, KiB.
fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    (status.lines())
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// Opens a directory file of `keys` keys as a start does: the ms it takes and
/// the KiB of resident memory it adds while open.
fn open_file(path: &std::path::Path, keys: usize) -> (f64, u64) {
    let mut text = Vec::new();
    for change in changes(keys) {
        serde_json::to_writer(&mut text, &change).unwrap();
        text.push(b'\n');
    }
    std::fs::write(path, text).unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
    let before = rss_kib();
    let started = Instant::now();
    let directory = runtime.block_on(async {
        let store = Arc::new(FileStore::open(path).unwrap());
        Directory::open(store, Arc::new(SystemClock::new()), Vec::new())
            .await
            .unwrap()
    });
    let elapsed_ms = started.elapsed().as_secs_f64() * 1_000.0;
    let added = rss_kib().saturating_sub(before);
    assert_eq!(directory.sizes().1, keys);
    drop(directory);
    (elapsed_ms, added)
}

/// ns per lookup, the presented keys cycling over `presented`.
fn round(index: &DirectoryIndex, presented: &[String]) -> f64 {
    let started = Instant::now();
    for i in 0..LOOKUPS {
        let found = index.authenticate(&presented[i % presented.len()], 2);
        assert!(black_box(found).is_ok());
    }
    started.elapsed().as_nanos() as f64 / LOOKUPS as f64
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn main() {
    let small = index_of(1);
    let large = index_of(KEYS_LARGE);
    // The large directory's lookups spread over all its keys (cache misses
    // included); the small one's hit its one key.
    let presented_small = vec![key_text(0)];
    let step = 7_919; // a prime: consecutive lookups land far apart
    let presented_large: Vec<String> = (0..KEYS_LARGE).map(|i| key_text(i * step % KEYS_LARGE)).collect();
    let (mut one, mut many) = (Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        one.push(round(&small, &presented_small));
        many.push(round(&large, &presented_large));
    }
    let (one, many) = (median(one), median(many));
    println!(
        "lookup with 1 key: {one:.0} ns; with {KEYS_LARGE} keys: {many:.0} ns; ratio {:.2}",
        many / one
    );
    drop((small, large, presented_large));
    let path = std::env::temp_dir().join(format!("directory-lookup-{}.jsonl", std::process::id()));
    let (mut empty, mut full) = (Vec::new(), Vec::new());
    for _ in 0..3 {
        empty.push(open_file(&path, 0));
        full.push(open_file(&path, KEYS_LARGE));
    }
    let size = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
    let _ = std::fs::remove_file(&path);
    let ms = |v: &[(f64, u64)]| median(v.iter().map(|x| x.0).collect());
    let kib = |v: &[(f64, u64)]| v.iter().map(|x| x.1).max().unwrap_or(0);
    println!(
        "opening the directory at start: 0 keys {:.1} ms; {KEYS_LARGE} keys ({} MB file) {:.0} ms, +{} MiB resident ({} bytes a key)",
        ms(&empty),
        size / 1_000_000,
        ms(&full),
        kib(&full) / 1024,
        kib(&full) * 1024 / KEYS_LARGE as u64
    );
}
