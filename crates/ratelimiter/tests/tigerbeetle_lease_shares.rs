//! The TigerBeetle backend's lease cache shared fairly (docs/tigerbeetle-backend.md,
//! "The lease cache"), against a real local cluster: one owner's flood of reserves
//! is refused past its share with the memory backend's error, and neither that
//! flood nor a flood of reserves and completes pushes another owner's live leases
//! out of the cache: their Completes are still answered from it.

#![cfg(feature = "tigerbeetle")]

mod tigerbeetle_common;

use std::sync::Arc;
use std::time::Instant;

use ratelimiter::tigerbeetle::{ConfigFields, SubmitMode, TigerBeetleBackend, TigerBeetleConfig};
use ratelimiter::{Backend, LeaseId, LeaseOwner, LimitDefinition, LimitKey, Limiter, LimiterError, SystemClock};
use tigerbeetle_common::{backend_on, cluster, complete, in_use, reserve, unique_key};

/// The cache's size in the test: small, so that floods fill it many times over.
const CACHE_MAX: u32 = 2_000;
/// One owner's share of it (the default 25 %).
const SHARE: usize = 500;
/// The flooding owner's reserves, and its reserves completed at once.
const FLOOD_RESERVES: usize = 5_000;
const FLOOD_COMPLETED: usize = 3_000;
/// The other owner's live leases, kept through both floods.
const OTHER_LEASES: usize = 50;
/// Reserves in flight at once during a flood.
const IN_FLIGHT: usize = 64;

async fn small_cache_backend() -> TigerBeetleBackend {
    let config = TigerBeetleConfig::new(ConfigFields {
        addresses: vec![cluster().address().to_owned()],
        sessions: 2,
        batch_events_max: 200,
        submit_mode: SubmitMode::Batching,
        request_timeout_ms: 20_000,
        lease_cache_max: CACHE_MAX,
        ..ConfigFields::default()
    })
    .unwrap();
    backend_on(&config, Arc::new(SystemClock::new())).await
}

/// `count` reserves of one unit of `key` for `owner`, `IN_FLIGHT` at a time,
/// each completed at once when `completed`: the granted leases, and the
/// refusals' messages.
async fn flood(
    backend: &Arc<TigerBeetleBackend>,
    key: &LimitKey,
    owner: &LeaseOwner,
    count: usize,
    completed: bool,
) -> (Vec<LeaseId>, Vec<String>) {
    let (mut granted, mut refused) = (Vec::new(), Vec::new());
    let mut sent = 0;
    while sent < count {
        let mut wave = tokio::task::JoinSet::new();
        for _ in sent..count.min(sent + IN_FLIGHT) {
            let (backend, key, owner) = (backend.clone(), key.clone(), owner.clone());
            wave.spawn(async move {
                let request = reserve(&[(&key, 1)]).with_owner(Some(owner));
                match backend.reserve(&request).await {
                    Ok(outcome) => {
                        assert!(outcome.is_allowed(), "{outcome:?}");
                        let lease = request.lease_id();
                        if completed {
                            backend.complete(&complete(lease, &[(&key, 1)])).await.unwrap();
                        }
                        Ok(lease)
                    }
                    Err(LimiterError::TooManyLeases { message, .. }) => Err(message),
                    Err(e) => panic!("{e}"),
                }
            });
        }
        sent = count.min(sent + IN_FLIGHT);
        while let Some(result) = wave.join_next().await {
            match result.unwrap() {
                Ok(lease) => granted.push(lease),
                Err(message) => refused.push(message),
            }
        }
    }
    (granted, refused)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_owners_flood_is_refused_past_its_share_and_crowds_out_no_other_lease() {
    let backend = Arc::new(small_cache_backend().await);
    let (key, other_key) = (unique_key("flood"), unique_key("other"));
    for k in [&key, &other_key] {
        let definition = LimitDefinition::rolling(k.clone(), 1_000_000, 600).unwrap();
        backend.apply_definition(&definition).await.unwrap();
    }
    let (flooder, other) = (LeaseOwner::new("client_tokens[0]"), LeaseOwner::new("client_tokens[1]"));
    let (kept, none) = flood(&backend, &other_key, &other, OTHER_LEASES, false).await;
    assert!(none.is_empty(), "{none:?}");

    let started = Instant::now();
    let (granted, refused) = flood(&backend, &key, &flooder, FLOOD_RESERVES, false).await;
    let reserves_took = started.elapsed();
    assert_eq!((granted.len(), refused.len()), (SHARE, FLOOD_RESERVES - SHARE));
    let expected = format!("client_tokens[0] holds {SHARE} live leases, its share of the lease cache");
    assert!(refused[0].starts_with(&expected), "{}", refused[0]);
    assert_eq!(
        in_use(backend.as_ref(), &key).await,
        SHARE as u64,
        "a refused reserve reserves nothing"
    );
    // Its leases completed, the same owner floods with reserves it completes:
    // completed leases make room for one another.
    for lease in &granted {
        backend.complete(&complete(*lease, &[(&key, 1)])).await.unwrap();
    }
    let started = Instant::now();
    let (churned, none) = flood(&backend, &key, &flooder, FLOOD_COMPLETED, true).await;
    let churn_took = started.elapsed();
    assert_eq!((churned.len(), none.len()), (FLOOD_COMPLETED, 0));

    // The other owner's live leases were never pushed out: each Complete is
    // answered from the cache and reconciled (1 unit used of 1 reserved, then 0).
    let counters = backend.counters();
    assert_eq!(counters.lease_cache_evictions, 0);
    assert_eq!(counters.lease_cache_refused, (FLOOD_RESERVES - SHARE) as u64);
    assert_eq!(in_use(backend.as_ref(), &other_key).await, OTHER_LEASES as u64);
    let from_cluster = counters.completes_from_cluster;
    for lease in &kept {
        backend.complete(&complete(*lease, &[(&other_key, 0)])).await.unwrap();
    }
    let after = backend.counters();
    assert_eq!(
        after.completes_from_cluster, from_cluster,
        "none read back from the cluster"
    );
    assert_eq!(in_use(backend.as_ref(), &other_key).await, 0);
    eprintln!(
        "lease cache of {CACHE_MAX} under one owner's flood: {FLOOD_RESERVES} reserves in {reserves_took:?} \
         ({SHARE} granted, {} refused), {FLOOD_COMPLETED} reserve+complete in {churn_took:?}; \
         the other owner's {OTHER_LEASES} live leases: 0 evicted, {OTHER_LEASES} completed from the cache",
        refused.len()
    );
}
