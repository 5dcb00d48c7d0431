//! Keys forgotten past their retention on a real TigerBeetle cluster, apart
//! from the other directory tests (a cluster of its own: a forgetting spans
//! every key of the log): one server forgets, another reading the same
//! cluster drops the key within a second, and a server starting afterwards
//! never lists it, whatever its own retention.

#![cfg(feature = "tigerbeetle")]

mod tigerbeetle_common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use ratelimiter::directory::{Directory, DirectoryOptions, KeySpec, Refusal, TenantFields};
use ratelimiter::tigerbeetle::{SubmitMode, TigerBeetleDirectoryStore};
use ratelimiter::{Clock, FakeClock, SystemClock};

/// A day, in ms: the forgetting server's retention.
const DAY_MS: u64 = 86_400_000;

/// A server on the shared cluster with `clock` and `options`, reading periodically.
async fn server(clock: Arc<dyn Clock>, options: DirectoryOptions) -> Arc<Directory> {
    let backend = Arc::new(tigerbeetle_common::backend_with(SubmitMode::Batching, clock.clone()).await);
    let store = Arc::new(TigerBeetleDirectoryStore::new(backend));
    let directory = Directory::open_with(store, clock, Vec::new(), options).await.unwrap();
    let directory = Arc::new(directory);
    directory.start_refresh().expect("a shared store is read periodically");
    directory
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_forgotten_by_one_server_is_forgotten_by_every_server_of_the_cluster() {
    let system = SystemClock::new();
    let fake = FakeClock::new(system.now_unix_ms());
    let one_day = DirectoryOptions {
        key_retention_ms: DAY_MS,
        ..Default::default()
    };
    let a = server(Arc::new(fake.clone()), one_day).await;
    let b = server(Arc::new(SystemClock::new()), DirectoryOptions::default()).await;
    a.create_tenant("acme", TenantFields::default()).await.unwrap();
    let spec = KeySpec {
        tenant: "acme".into(),
        ..Default::default()
    };
    let revoked = a.create_key(&spec).await.unwrap();
    let kept = a.create_key(&spec).await.unwrap();
    a.revoke_key(&revoked.record.id).await.unwrap();
    fake.advance_ms(DAY_MS);
    assert_eq!(a.forget_past_retention().await.unwrap(), 1);
    let started = Instant::now();
    while b.sizes().1 != 1 {
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "B still keeps {:?}",
            b.keys(None)
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(b.authenticate_now(&revoked.key.text).unwrap_err(), Refusal::Unknown);
    assert!(b.authenticate_now(&kept.key.text).is_ok());
    // A server starting now reads the whole log, the forgetting included.
    let c = server(Arc::new(SystemClock::new()), DirectoryOptions::default()).await;
    let ids: Vec<String> = c.keys(None).into_iter().map(|k| k.id).collect();
    assert_eq!(ids, vec![kept.record.id.clone()]);
}
