//! The gateway's key lookup (`DirectoryIndex::authenticate`: one SHA-256 of the
//! presented key and one hash-map probe) with 1 key and with 100,000 keys, in
//! the same run, alternating rounds; prints the median ns per lookup of each
//! and their ratio (BENCHMARKS.md, "Gateway keys").
//!
//! cargo run --release -p ratelimiter --example directory_lookup

use std::hint::black_box;
use std::time::Instant;

use ratelimiter::directory::{
    Change, DirectoryIndex, KeyHash, KeyLimits, KeyRecord, Recorded, Source, TenantFields, TenantRecord,
};

/// Lookups per round.
const LOOKUPS: usize = 1_000_000;
/// Rounds of each size, alternating.
const ROUNDS: usize = 7;
/// The large directory.
const KEYS_LARGE: usize = 100_000;

fn key_text(i: usize) -> String {
    format!("rlk-benchmark-key-{i:0>40}")
}

fn index_of(keys: usize) -> DirectoryIndex {
    let mut index = DirectoryIndex::default();
    let tenant = TenantRecord {
        name: "acme".into(),
        id: "T".into(),
        source: Source::Api,
        fields: TenantFields::default(),
        created_at_unix_ms: 1,
        updated_at_unix_ms: 1,
    };
    index.apply(Recorded {
        version: 1,
        change: Change::PutTenant { tenant },
    });
    for i in 0..keys {
        let key = KeyRecord {
            id: format!("K{i}"),
            tenant: "acme".into(),
            tenant_id: "T".into(),
            name: String::new(),
            models: None,
            limits: KeyLimits::default(),
            limits_of: format!("K{i}"),
            hash: KeyHash::of(&key_text(i)),
            hint: "abcd".into(),
            created_at_unix_ms: 1,
            expires_at_unix_ms: None,
            revoked_at_unix_ms: None,
            rotated_to: None,
        };
        index.apply(Recorded {
            version: i as u64 + 2,
            change: Change::CreateKey { key },
        });
    }
    index
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
}
