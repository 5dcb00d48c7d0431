//! The gateway's tenants and keys (`ratelimiter::directory`) on the memory
//! backend's file store: the life of a key (scope, expiry, rotation with its
//! grace, revocation, a tenant's deletion), durability across a reopen, a
//! torn last line, the YAML's tenants, a key ordered after its tenant's
//! deletion, and the bound on reads a flood of unknown keys causes.

use std::future::Future;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Instant;

use async_trait::async_trait;
use ratelimiter::directory::{
    Appended, Change, Directory, DirectoryError, DirectoryIndex, DirectoryOptions, DirectoryStore, FileStore,
    KeyLimits, KeySpec, Recorded, Refusal, Source, TenantFields, TenantPatch, TenantRecord,
    UNKNOWN_KEY_READ_INTERVAL_MS,
};
use ratelimiter::FakeClock;

fn temp_file(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ratelimiter-directory-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir.join("gateway-directory.jsonl")
}

async fn open(path: &PathBuf, clock: &FakeClock, config: Vec<TenantRecord>) -> Directory {
    let store = Arc::new(FileStore::open(path).unwrap());
    Directory::open(store, Arc::new(clock.clone()), config).await.unwrap()
}

fn spec(tenant: &str) -> KeySpec {
    KeySpec {
        tenant: tenant.to_owned(),
        ..Default::default()
    }
}

#[tokio::test]
async fn keys_live_expire_rotate_with_grace_and_die_with_their_tenant() {
    let path = temp_file("life");
    let clock = FakeClock::new(1_700_000_000_000);
    let directory = open(&path, &clock, Vec::new()).await;
    let fields = TenantFields {
        models: Some(vec!["gpt-4o-mini".into(), "claude".into()]),
        ..Default::default()
    };
    directory.create_tenant("acme", fields.clone()).await.unwrap();
    let exists = directory.create_tenant("acme", fields).await.unwrap_err();
    assert_eq!(exists, DirectoryError::Exists("acme".into()));

    let scoped = KeySpec {
        models: Some(vec!["claude".into()]),
        expires_in_seconds: Some(60),
        limits: KeyLimits {
            rpm: Some(3),
            ..Default::default()
        },
        ..spec("acme")
    };
    let key = directory.create_key(&scoped).await.unwrap();
    let found = directory.authenticate(&key.key.text).await.unwrap();
    assert_eq!(
        (found.tenant.name.as_str(), found.key.id.as_str()),
        ("acme", key.record.id.as_str())
    );
    assert!(found.allows_model("claude") && !found.allows_model("gpt-4o-mini"));
    assert_eq!(
        found.key.limit_key("rpm").as_str(),
        format!("key:{}:llm:rpm", key.record.id)
    );
    assert_eq!(directory.authenticate("rlk-wrong").await.unwrap_err(), Refusal::Unknown);
    clock.advance_ms(60_000);
    assert_eq!(
        directory.authenticate(&key.key.text).await.unwrap_err(),
        Refusal::Expired
    );

    let plain = directory.create_key(&spec("acme")).await.unwrap();
    let rotated = directory.rotate_key(&plain.record.id, 30).await.unwrap();
    assert_eq!(
        rotated.record.limits_of, plain.record.id,
        "one budget across a rotation"
    );
    clock.advance_ms(29_999);
    assert!(
        directory.authenticate(&plain.key.text).await.is_ok(),
        "within the grace"
    );
    assert!(directory.authenticate(&rotated.key.text).await.is_ok());
    clock.advance_ms(1);
    assert_eq!(
        directory.authenticate(&plain.key.text).await.unwrap_err(),
        Refusal::Expired
    );
    let again = directory.rotate_key(&plain.record.id, 0).await.unwrap_err();
    assert!(matches!(again, DirectoryError::Conflict(_)), "{again:?}");

    let other = directory.create_key(&spec("acme")).await.unwrap();
    directory.revoke_key(&other.record.id).await.unwrap();
    assert_eq!(
        directory.authenticate(&other.key.text).await.unwrap_err(),
        Refusal::Revoked
    );

    let (_, working) = directory.delete_tenant("acme").await.unwrap();
    assert_eq!(working, 1, "the rotated key was the one working");
    assert_eq!(
        directory.authenticate(&rotated.key.text).await.unwrap_err(),
        Refusal::Revoked
    );
    assert!(
        directory.key(&rotated.record.id).unwrap().revoked_at_unix_ms.is_some(),
        "revoked with its tenant"
    );
    // A new tenant of the same name does not bring the old keys back.
    directory.create_tenant("acme", TenantFields::default()).await.unwrap();
    assert_eq!(
        directory.authenticate(&rotated.key.text).await.unwrap_err(),
        Refusal::Revoked
    );
    assert_eq!(
        directory.create_key(&spec("nobody")).await.unwrap_err(),
        DirectoryError::UnknownTenant("nobody".into())
    );
}

#[tokio::test]
async fn every_acknowledged_change_is_read_back_after_a_reopen_and_a_torn_line_is_cut() {
    let path = temp_file("reopen");
    let clock = FakeClock::new(1_700_000_000_000);
    let (kept, revoked) = {
        let directory = open(&path, &clock, Vec::new()).await;
        directory.create_tenant("acme", TenantFields::default()).await.unwrap();
        let patch = TenantPatch {
            rpm: Some(Some(7)),
            ..Default::default()
        };
        directory.update_tenant("acme", &patch).await.unwrap();
        let kept = directory.create_key(&spec("acme")).await.unwrap();
        let revoked = directory.create_key(&spec("acme")).await.unwrap();
        directory.revoke_key(&revoked.record.id).await.unwrap();
        (kept, revoked)
    };
    // A crash in the middle of a write leaves part of a line: never acknowledged.
    let mut file = std::fs::OpenOptions::new().append(true).open(&path).unwrap();
    std::io::Write::write_all(&mut file, b"{\"change\":\"create_key\",\"key\":{").unwrap();
    drop(file);
    let directory = open(&path, &clock, Vec::new()).await;
    assert_eq!(directory.tenant("acme").unwrap().fields.rpm, Some(7));
    assert!(directory.authenticate(&kept.key.text).await.is_ok());
    assert_eq!(
        directory.authenticate(&revoked.key.text).await.unwrap_err(),
        Refusal::Revoked
    );
    assert!(std::fs::read(&path).unwrap().ends_with(b"\n"), "the torn line was cut");
    directory.create_key(&spec("acme")).await.unwrap();
    // A damaged line in the middle is an error naming it, not an empty directory.
    std::fs::write(&path, "not json\n").unwrap();
    let error = FileStore::open(&path).unwrap_err();
    assert!(error.contains("line 1"), "{error}");
}

#[tokio::test]
async fn tenants_of_the_configuration_take_keys_but_change_with_the_file_only() {
    let path = temp_file("config");
    let clock = FakeClock::new(1_700_000_000_000);
    let yaml = || {
        vec![TenantRecord::from_config(
            "team",
            TenantFields {
                rpm: Some(5),
                ..Default::default()
            },
        )]
    };
    let key = {
        let directory = open(&path, &clock, yaml()).await;
        assert_eq!(directory.tenants()[0].source, Source::Config);
        let refused = directory
            .update_tenant("team", &TenantPatch::default())
            .await
            .unwrap_err();
        assert!(matches!(refused, DirectoryError::Conflict(_)), "{refused:?}");
        assert!(matches!(
            directory.delete_tenant("team").await.unwrap_err(),
            DirectoryError::Conflict(_)
        ));
        let refused = (directory.create_tenant("team", TenantFields::default()).await).unwrap_err();
        assert!(
            matches!(&refused, DirectoryError::Conflict(m) if m.contains("team") && m.contains("configuration file")),
            "{refused:?}"
        );
        directory.create_key(&spec("team")).await.unwrap()
    };
    let directory = open(&path, &clock, yaml()).await;
    assert!(
        directory.authenticate(&key.key.text).await.is_ok(),
        "the key outlives a restart"
    );
    let without = open(&path, &clock, Vec::new()).await;
    assert_eq!(
        without.authenticate(&key.key.text).await.unwrap_err(),
        Refusal::Revoked,
        "its tenant left the file"
    );
    drop(without);
    let back = open(&path, &clock, yaml()).await;
    assert!(back.authenticate(&key.key.text).await.is_ok(), "and came back");
}

/// A YAML tenant named like a stored (API) one stops the open, naming it and
/// the way out, and changes nothing stored: without the entry, the stored
/// tenant's key works and was never revoked; once the API tenant is deleted,
/// the entry opens.
#[tokio::test]
async fn a_yaml_tenant_named_like_a_stored_one_stops_the_open_and_revokes_nothing() {
    let path = temp_file("clash");
    let clock = FakeClock::new(1_700_000_000_000);
    let yaml = || vec![TenantRecord::from_config("team", TenantFields::default())];
    let key = {
        let directory = open(&path, &clock, Vec::new()).await;
        directory.create_tenant("team", TenantFields::default()).await.unwrap();
        directory.create_key(&spec("team")).await.unwrap()
    };
    let store = Arc::new(FileStore::open(&path).unwrap());
    let refused = Directory::open(store, Arc::new(clock.clone()), yaml())
        .await
        .unwrap_err();
    let message = refused.to_string();
    assert!(
        message.contains("tenant team is defined both") && message.contains("ratelimiterd tenants delete team"),
        "{message}"
    );
    let directory = open(&path, &clock, Vec::new()).await;
    assert!(
        directory.authenticate(&key.key.text).await.is_ok(),
        "the key still works"
    );
    assert_eq!(directory.key(&key.record.id).unwrap().revoked_at_unix_ms, None);
    directory.delete_tenant("team").await.unwrap();
    drop(directory);
    let with_entry = open(&path, &clock, yaml()).await;
    assert_eq!(with_entry.tenant("team").unwrap().source, Source::Config);
    assert_eq!(
        with_entry.authenticate(&key.key.text).await.unwrap_err(),
        Refusal::Revoked,
        "the deleted API tenant's key stays revoked"
    );
}

/// The file holds every key's hash: created 0600, and an older file readable
/// by others is narrowed when opened.
#[cfg(unix)]
#[tokio::test]
async fn the_directory_file_is_its_owners_only() {
    use std::os::unix::fs::PermissionsExt;
    let mode = |path: &PathBuf| std::fs::metadata(path).unwrap().permissions().mode() & 0o777;
    let path = temp_file("mode");
    let clock = FakeClock::new(1_700_000_000_000);
    let directory = open(&path, &clock, Vec::new()).await;
    directory.create_tenant("acme", TenantFields::default()).await.unwrap();
    assert_eq!(mode(&path), 0o600);
    drop(directory);
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    FileStore::open(&path).unwrap();
    assert_eq!(mode(&path), 0o600);
}

#[test]
fn a_key_ordered_after_its_tenants_deletion_never_works() {
    let tenant = TenantRecord {
        name: "acme".into(),
        id: "T1".into(),
        source: Source::Api,
        fields: TenantFields::default(),
        created_at_unix_ms: 1,
        updated_at_unix_ms: 1,
    };
    let key = ratelimiter::directory::NewKey::generate();
    let record = ratelimiter::directory::KeyRecord {
        id: "K1".into(),
        tenant: "acme".into(),
        tenant_id: "T1".into(),
        name: String::new(),
        models: None,
        limits: KeyLimits::default(),
        limits_of: "K1".into(),
        hash: key.hash,
        hint: key.hint.clone(),
        created_at_unix_ms: 3,
        expires_at_unix_ms: None,
        revoked_at_unix_ms: None,
        rotated_to: None,
    };
    let mut index = DirectoryIndex::default();
    let changes = [
        Change::PutTenant { tenant: tenant.clone() },
        Change::DeleteTenant {
            name: "acme".into(),
            id: "T1".into(),
            at_unix_ms: 2,
        },
        // Validated by a server that had not seen the deletion yet.
        Change::CreateKey { key: record },
        // The name taken again: another tenant.
        Change::PutTenant {
            tenant: TenantRecord {
                id: "T2".into(),
                ..tenant
            },
        },
    ];
    for (i, change) in changes.into_iter().enumerate() {
        index.apply(Recorded {
            version: i as u64 + 1,
            change,
        });
    }
    assert_eq!(index.authenticate(&key.text, 10).unwrap_err(), Refusal::Revoked);
    assert!(index.key("K1").unwrap().revoked_at_unix_ms.is_some());
}

/// A store shared with other servers (as the cluster is), counting its reads.
#[derive(Debug)]
struct SharedStore {
    inner: FileStore,
    reads: AtomicU64,
    /// True while the store does not answer, as a cluster that is down.
    down: AtomicBool,
}

#[async_trait]
impl DirectoryStore for SharedStore {
    async fn read_new(&self) -> Result<Vec<Recorded>, DirectoryError> {
        self.reads.fetch_add(1, Ordering::Relaxed);
        if self.down.load(Ordering::Relaxed) {
            return Err(DirectoryError::Unavailable { retry_after_ms: 100 });
        }
        self.inner.read_new().await
    }
    async fn append(&self, change: &Change, previous_version: u64) -> Result<Appended, DirectoryError> {
        self.inner.append(change, previous_version).await
    }
    fn shared(&self) -> bool {
        true
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_unknown_keys_reads_the_store_at_most_once_per_interval() {
    let store = Arc::new(SharedStore {
        inner: FileStore::open(temp_file("flood")).unwrap(),
        reads: AtomicU64::new(0),
        down: AtomicBool::new(false),
    });
    let clock = FakeClock::new(1_700_000_000_000);
    let directory = Arc::new(
        Directory::open(store.clone(), Arc::new(clock), Vec::new())
            .await
            .unwrap(),
    );
    directory.create_tenant("acme", TenantFields::default()).await.unwrap();
    let good = directory.create_key(&spec("acme")).await.unwrap();
    let before = store.reads.load(Ordering::Relaxed);
    let started = Instant::now();
    let tasks: Vec<_> = (0..50)
        .map(|t| {
            let directory = directory.clone();
            tokio::spawn(async move {
                for i in 0..20 {
                    let wrong = format!("rlk-wrong-{t}-{i}");
                    assert_eq!(directory.authenticate(&wrong).await.unwrap_err(), Refusal::Unknown);
                }
            })
        })
        .collect();
    // A known key answers at once all along: the flood stalls nobody else. At
    // once is its lookup's first poll, so a loaded machine cannot make it late:
    // a lookup that waited for the flood's reads (their lock, their spacing,
    // the store) would be pending there.
    for _ in 0..20 {
        let mut lookup = std::pin::pin!(directory.authenticate(&good.key.text));
        let answered = lookup.as_mut().poll(&mut Context::from_waker(Waker::noop()));
        assert!(
            matches!(answered, Poll::Ready(Ok(_))),
            "a known key waited on the flood"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    for task in tasks {
        task.await.unwrap();
    }
    let reads = store.reads.load(Ordering::Relaxed) - before;
    let allowed = started.elapsed().as_millis() as u64 / UNKNOWN_KEY_READ_INTERVAL_MS + 2;
    assert!(
        reads <= allowed,
        "1,000 unknown keys made {reads} reads in {:?}",
        started.elapsed()
    );
    assert_eq!(directory.unknown_key_reads(), reads);
}

#[tokio::test]
async fn a_shared_store_down_at_start_opens_and_is_read_once_it_answers() {
    let path = temp_file("down-at-start");
    let clock = FakeClock::new(1_700_000_000_000);
    // Another server of the fleet made a key while this one was away.
    let other = open(&path, &clock, Vec::new()).await;
    other.create_tenant("acme", TenantFields::default()).await.unwrap();
    let made = other.create_key(&spec("acme")).await.unwrap();
    let store = Arc::new(SharedStore {
        inner: FileStore::open(&path).unwrap(),
        reads: AtomicU64::new(0),
        down: AtomicBool::new(true),
    });
    let directory = Directory::open(store.clone(), Arc::new(clock), Vec::new())
        .await
        .expect("a fleet's server starts while its cluster is down");
    assert_eq!(
        directory.authenticate(&made.key.text).await.unwrap_err(),
        Refusal::Unknown
    );
    store.down.store(false, Ordering::Relaxed);
    tokio::time::sleep(std::time::Duration::from_millis(UNKNOWN_KEY_READ_INTERVAL_MS)).await;
    let found = directory.authenticate(&made.key.text).await.unwrap();
    assert_eq!(found.tenant.name, "acme");
}

/// A day, in ms: the retention of the forgetting test.
const DAY_MS: u64 = 86_400_000;

async fn open_with(path: &PathBuf, clock: &FakeClock, options: DirectoryOptions) -> Directory {
    let store = Arc::new(FileStore::open(path).unwrap());
    Directory::open_with(store, Arc::new(clock.clone()), Vec::new(), options)
        .await
        .unwrap()
}

#[tokio::test]
async fn ended_keys_are_listed_until_their_retention_ends_then_forgotten_for_good_and_no_longer_counted() {
    let path = temp_file("forget");
    let clock = FakeClock::new(1_700_000_000_000);
    let options = DirectoryOptions {
        key_retention_ms: DAY_MS,
        keys_max: 4,
    };
    let directory = open_with(&path, &clock, options).await;
    directory.create_tenant("acme", TenantFields::default()).await.unwrap();
    let revoked = directory.create_key(&spec("acme")).await.unwrap();
    let expiring = KeySpec {
        expires_in_seconds: Some(60),
        ..spec("acme")
    };
    let expired = directory.create_key(&expiring).await.unwrap();
    let kept = directory.create_key(&spec("acme")).await.unwrap();
    let rotated = directory.rotate_key(&kept.record.id, 0).await.unwrap();
    let full = directory.create_key(&spec("acme")).await.unwrap_err();
    assert!(
        matches!(&full, DirectoryError::Full(m) if m.contains("forgotten")),
        "{full:?}"
    );
    directory.revoke_key(&revoked.record.id).await.unwrap();
    // A day after the revocation less a millisecond: still listed, still counted.
    clock.advance_ms(DAY_MS - 1);
    assert_eq!(directory.forget_past_retention().await.unwrap(), 0);
    assert_eq!(directory.keys(Some("acme")).len(), 4);
    assert!(directory.create_key(&spec("acme")).await.is_err(), "still full");
    // At the day: the revoked key and the rotated-away key (ended at the
    // rotation) go; the one that expired a minute in stays a minute more.
    clock.advance_ms(1);
    let made = directory.create_key(&spec("acme")).await.unwrap();
    assert_eq!(directory.sizes().1, 3, "forgotten to make room");
    let ids: Vec<String> = directory.keys(None).into_iter().map(|k| k.id).collect();
    assert!(
        !ids.contains(&revoked.record.id) && !ids.contains(&kept.record.id),
        "{ids:?}"
    );
    assert!(ids.contains(&expired.record.id) && ids.contains(&rotated.record.id));
    assert_eq!(
        directory.authenticate(&revoked.key.text).await.unwrap_err(),
        Refusal::Unknown
    );
    assert_eq!(
        directory.revoke_key(&revoked.record.id).await.unwrap_err(),
        DirectoryError::UnknownKey(revoked.record.id.clone())
    );
    assert!(
        directory.authenticate(&rotated.key.text).await.is_ok(),
        "the successor works on"
    );
    clock.advance_ms(60_000);
    assert_eq!(directory.forget_past_retention().await.unwrap(), 1);
    drop(directory);
    // Forgetting is recorded: a reopen with a longer retention does not bring them back.
    let longer = DirectoryOptions {
        key_retention_ms: 365 * DAY_MS,
        ..options
    };
    let directory = open_with(&path, &clock, longer).await;
    let ids: Vec<String> = directory.keys(None).into_iter().map(|k| k.id).collect();
    assert_eq!(ids, vec![rotated.record.id.clone(), made.record.id.clone()]);
}

#[tokio::test]
async fn a_keys_budgets_change_durably_and_a_bad_change_changes_nothing() {
    let path = temp_file("update-key");
    let clock = FakeClock::new(1_700_000_000_000);
    let directory = open(&path, &clock, Vec::new()).await;
    directory.create_tenant("acme", TenantFields::default()).await.unwrap();
    let key = directory.create_key(&spec("acme")).await.unwrap();
    let budget: ratelimiter::price::budget::BudgetConfig =
        serde_json::from_value(serde_json::json!({"usd": 5, "period": "day"})).unwrap();
    let limits = KeyLimits {
        rpm: Some(9),
        budgets: Some(vec![budget]),
        ..Default::default()
    };
    let updated = directory.update_key_limits(&key.record.id, &limits).await.unwrap();
    assert_eq!(updated.limits, limits);
    let bad: ratelimiter::price::budget::BudgetConfig =
        serde_json::from_value(serde_json::json!({"usd": 5, "period": "fortnight"})).unwrap();
    let refused = KeyLimits {
        budgets: Some(vec![bad]),
        ..Default::default()
    };
    let error = directory.update_key_limits(&key.record.id, &refused).await.unwrap_err();
    assert!(
        matches!(&error, DirectoryError::Invalid { field, .. } if field.contains("period")),
        "{error:?}"
    );
    directory.revoke_key(&key.record.id).await.unwrap();
    let error = directory
        .update_key_limits(&key.record.id, &KeyLimits::default())
        .await
        .unwrap_err();
    assert!(matches!(error, DirectoryError::Conflict(_)), "{error:?}");
    drop(directory);
    let directory = open(&path, &clock, Vec::new()).await;
    assert_eq!(
        directory.key(&key.record.id).unwrap().limits,
        limits,
        "kept across a reopen"
    );
}
