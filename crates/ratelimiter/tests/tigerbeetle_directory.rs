//! The gateway's tenants and keys on a real TigerBeetle cluster: two servers
//! (two backends, each with its own directory, sharing nothing but the
//! cluster) see each other's creations, revocations, rotations and deletions
//! within one second by their periodic reads alone; a name created on both at
//! once is created once; a flood of unknown keys reads the log a bounded
//! number of times.

#![cfg(feature = "tigerbeetle")]

mod tigerbeetle_common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use ratelimiter::directory::{Directory, DirectoryError, KeySpec, Refusal, TenantFields, UNKNOWN_KEY_READ_INTERVAL_MS};
use ratelimiter::tigerbeetle::{SubmitMode, TigerBeetleDirectoryStore};
use ratelimiter::{LeaseId, SystemClock};

/// The fleet's promise: every server agrees within this.
const FLEET_AGREES_WITHIN: Duration = Duration::from_secs(1);

/// One server: a backend on the shared cluster and its directory, reading periodically.
async fn server() -> Arc<Directory> {
    let clock = Arc::new(SystemClock::new());
    let backend = Arc::new(tigerbeetle_common::backend_with(SubmitMode::Batching, clock.clone()).await);
    let store = Arc::new(TigerBeetleDirectoryStore::new(backend));
    let directory = Arc::new(Directory::open(store, clock, Vec::new()).await.unwrap());
    directory.start_refresh().expect("a shared store is read periodically");
    directory
}

/// A tenant name no other test uses (tests share the cluster).
fn unique(name: &str) -> String {
    format!("{name}-{}", LeaseId::generate().to_string().to_lowercase())
}

/// How long until `check` holds on `server`, polling every 5 ms; panics past 5 s.
async fn until(what: &str, check: impl Fn() -> bool) -> Duration {
    let started = Instant::now();
    while !check() {
        assert!(started.elapsed() < Duration::from_secs(5), "{what}: not within 5 s");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    started.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_servers_see_each_others_changes_within_a_second() {
    let (a, b) = (server().await, server().await);
    let tenant = unique("acme");
    a.create_tenant(&tenant, TenantFields::default()).await.unwrap();
    let spec = KeySpec {
        tenant: tenant.clone(),
        ..Default::default()
    };
    let key = a.create_key(&spec).await.unwrap();
    // Without the read an unknown key makes: the periodic reads alone.
    let created = until("created on A, served by B", || {
        b.authenticate_now(&key.key.text).is_ok()
    })
    .await;
    a.revoke_key(&key.record.id).await.unwrap();
    let revoked = until("revoked on A, refused by B", || {
        matches!(b.authenticate_now(&key.key.text), Err(Refusal::Revoked))
    })
    .await;
    let old = b.create_key(&spec).await.unwrap();
    until("created on B, served by A", || {
        a.authenticate_now(&old.key.text).is_ok()
    })
    .await;
    let new = a.rotate_key(&old.record.id, 0).await.unwrap();
    let rotated = until("rotated on A without grace, old refused by B", || {
        b.authenticate_now(&old.key.text).is_err() && b.authenticate_now(&new.key.text).is_ok()
    })
    .await;
    b.delete_tenant(&tenant).await.unwrap();
    let deleted = until("tenant deleted on B, its key refused by A", || {
        a.authenticate_now(&new.key.text).is_err()
    })
    .await;
    println!(
        "B agreed after: created {created:?}, revoked {revoked:?}, rotated {rotated:?}; A after a delete {deleted:?}"
    );
    for (what, delay) in [
        ("create", created),
        ("revoke", revoked),
        ("rotate", rotated),
        ("delete", deleted),
    ] {
        assert!(delay < FLEET_AGREES_WITHIN, "{what}: {delay:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_unknown_to_a_server_is_read_at_once_and_a_name_is_created_once() {
    let (a, b) = (server().await, server().await);
    let tenant = unique("race");
    let (on_a, on_b) = tokio::join!(
        a.create_tenant(&tenant, TenantFields::default()),
        b.create_tenant(&tenant, TenantFields::default())
    );
    let outcomes = [on_a.is_ok(), on_b.is_ok()];
    assert_eq!(outcomes.iter().filter(|ok| **ok).count(), 1, "{on_a:?} {on_b:?}");
    for refused in [on_a, on_b].into_iter().filter_map(Result::err) {
        assert_eq!(refused, DirectoryError::Exists(tenant.clone()));
    }
    let key = a
        .create_key(&KeySpec {
            tenant: tenant.clone(),
            ..Default::default()
        })
        .await
        .unwrap();
    // B reads the log for a key it does not know: served at once, not at its next periodic read.
    let started = Instant::now();
    assert!(b.authenticate(&key.key.text).await.is_ok());
    assert!(
        started.elapsed() < Duration::from_millis(500),
        "{:?}",
        started.elapsed()
    );

    // A flood of wrong keys: reads spaced by the interval, whatever their number.
    let before = b.unknown_key_reads();
    let started = Instant::now();
    let tasks: Vec<_> = (0..20)
        .map(|t| {
            let b = b.clone();
            tokio::spawn(async move {
                for i in 0..10 {
                    assert_eq!(
                        b.authenticate(&format!("rlk-wrong-{t}-{i}")).await.unwrap_err(),
                        Refusal::Unknown
                    );
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    let reads = b.unknown_key_reads() - before;
    let allowed = started.elapsed().as_millis() as u64 / UNKNOWN_KEY_READ_INTERVAL_MS + 2;
    assert!(
        reads <= allowed,
        "200 unknown keys made {reads} reads in {:?}",
        started.elapsed()
    );
}
