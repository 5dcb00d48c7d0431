//! A memory-backend directory file of one API tenant and many keys, written
//! straight into the journal the server reads at start: the examples that
//! measure a server with a large directory (its start, its added latency)
//! build it in milliseconds instead of through 100,000 API calls.

use std::io::Write;
use std::path::Path;

use ratelimiter::directory::{
    Change, KeyHash, KeyLimits, KeyRecord, Source, TenantFields, TenantRecord, JOURNAL_FILE_NAME,
};

/// When every record says it was written: a fixed instant, so two runs write
/// the same file.
const WRITTEN_AT_UNIX_MS: u64 = 1_700_000_000_000;

/// Writes into `dir` a directory of the API tenant `tenant` and `keys` keys;
/// key `i` is the text `key_text(i)`, with `limits` of its own.
pub fn write_directory(dir: &Path, tenant: &str, keys: usize, key_text: impl Fn(usize) -> String, limits: KeyLimits) {
    std::fs::create_dir_all(dir).unwrap();
    let file = std::fs::File::create(dir.join(JOURNAL_FILE_NAME)).unwrap();
    let mut out = std::io::BufWriter::new(file);
    let tenant = TenantRecord {
        name: tenant.into(),
        id: "01JTENANT0000000000000000".into(),
        source: Source::Api,
        fields: TenantFields::default(),
        created_at_unix_ms: WRITTEN_AT_UNIX_MS,
        updated_at_unix_ms: WRITTEN_AT_UNIX_MS,
    };
    serde_json::to_writer(&mut out, &Change::PutTenant { tenant: tenant.clone() }).unwrap();
    out.write_all(b"\n").unwrap();
    for i in 0..keys {
        let id = format!("K{i:0>25}");
        let key = KeyRecord {
            id: id.clone(),
            tenant: tenant.name.clone(),
            tenant_id: tenant.id.clone(),
            name: format!("app-{i}"),
            models: None,
            limits: limits.clone(),
            limits_of: id,
            hash: KeyHash::of(&key_text(i)),
            hint: "0000".into(),
            created_at_unix_ms: WRITTEN_AT_UNIX_MS,
            expires_at_unix_ms: None,
            revoked_at_unix_ms: None,
            rotated_to: None,
        };
        serde_json::to_writer(&mut out, &Change::CreateKey { key }).unwrap();
        out.write_all(b"\n").unwrap();
    }
    out.flush().unwrap();
}
