//! The memory backend's lease table under pressure (docs/memory-backend.md, "Shares
//! of the lease table"): a lease in force is never pushed out, one owner's flood of
//! reserves is refused beyond its share, and the other owners' leases still
//! complete and free what they hold.

use std::sync::Arc;

use ratelimiter::memory::{MemoryBackend, MemoryConfig, TOO_MANY_LEASES_RETRY_MS};
use ratelimiter::retry::Jitter;
use ratelimiter::testkit::{assert_allowed, Fixture, MemoryHarness};
use ratelimiter::{
    CompleteRequest, LeaseId, LeaseOwner, LimitKey, Limiter, LimiterError, Requirement, ReserveOutcome, ReserveRequest,
};

/// The reserves of the flooding client: far more than its share.
const FLOOD_RESERVES: usize = 100_000;

fn backend(h: &MemoryHarness, leases_max: usize) -> Arc<MemoryBackend> {
    let config = MemoryConfig {
        leases_max,
        window_margin_ms: 0,
        ..MemoryConfig::default()
    };
    Arc::new(MemoryBackend::with_jitter(
        Arc::new(h.clock().clone()),
        config,
        Jitter::seeded(1),
    ))
}

fn request(lease: LeaseId, owner: Option<&LeaseOwner>, needs: &[(&LimitKey, u64)]) -> ReserveRequest {
    let requirements = needs
        .iter()
        .map(|&(key, amount)| Requirement {
            key: key.clone(),
            amount,
        })
        .collect();
    ReserveRequest::new(lease, None, requirements)
        .unwrap()
        .with_owner(owner.cloned())
}

fn assert_too_many(context: &str, result: &Result<ReserveOutcome, LimiterError>) -> String {
    match result {
        Err(LimiterError::TooManyLeases {
            retry_after_ms,
            message,
        }) => {
            assert_eq!(*retry_after_ms, TOO_MANY_LEASES_RETRY_MS, "{context}");
            message.clone()
        }
        other => panic!("{context}: expected too_many_leases, got {other:?}"),
    }
}

#[tokio::test]
async fn one_owner_flooding_reserves_neither_evicts_nor_blocks_another_owners_leases() {
    let h = MemoryHarness::with_config(MemoryConfig::default());
    let memory = backend(&h, 1_000);
    let f = Fixture::with_backend(&h, memory.clone());
    let conc = f.concurrency("svc:b:concurrency", 10, 600).await;
    let tpm = f.rolling("svc:b:tpm", 1_000_000, 60).await;
    let flood_key = f.rolling("svc:a:rpm", u64::MAX / 2, 60).await;
    let (a, b) = (LeaseOwner::new("client_tokens[0]"), LeaseOwner::new("client_tokens[1]"));
    let victim = LeaseId::generate();
    let granted = memory
        .reserve(&request(victim, Some(&b), &[(&conc, 1), (&tpm, 500)]))
        .await;
    assert_allowed("b's lease", &granted.unwrap());

    let (mut allowed, mut refused) = (0, 0);
    for _ in 0..FLOOD_RESERVES {
        match memory
            .reserve(&request(LeaseId::generate(), Some(&a), &[(&flood_key, 1)]))
            .await
        {
            Ok(outcome) if outcome.is_allowed() => allowed += 1,
            result => {
                assert_too_many("a beyond its share", &result);
                refused += 1;
            }
        }
    }
    assert_eq!(allowed, 250, "25 % of 1,000");
    assert_eq!(refused, FLOOD_RESERVES - 250);
    let counters = memory.counters();
    assert_eq!((counters.leases_evicted_total, counters.leases_live), (0, 251));
    assert_eq!(counters.leases_refused_total, (FLOOD_RESERVES - 250) as u64);
    let message = assert_too_many(
        "the message names the owner and its share",
        &memory
            .reserve(&request(LeaseId::generate(), Some(&a), &[(&flood_key, 1)]))
            .await,
    );
    assert!(message.contains("client_tokens[0] holds 250 live leases"), "{message}");

    // B is served at once, and its first lease still completes and frees its holds.
    let granted = memory
        .reserve(&request(LeaseId::generate(), Some(&b), &[(&conc, 1)]))
        .await;
    assert_allowed("b again", &granted.unwrap());
    f.assert_in_use("b holds two", &[(&conc, 2), (&tpm, 500)]).await;
    let done = CompleteRequest::new(
        victim,
        None,
        vec![ratelimiter::Actual {
            key: tpm.clone(),
            actual_amount: 100,
        }],
    )
    .unwrap();
    memory.complete(&done).await.unwrap();
    f.assert_in_use("reconciled and released", &[(&conc, 1), (&tpm, 100)])
        .await;
}

#[tokio::test]
async fn a_full_table_refuses_rather_than_evict_a_lease_in_force() {
    let h = MemoryHarness::with_config(MemoryConfig::default());
    let memory = backend(&h, 2);
    let f = Fixture::with_backend(&h, memory.clone());
    let conc = f.concurrency("conc", 5, 2).await;
    let tpm = f.rolling("tpm", 100, 1).await;
    let oldest = LeaseId::generate();
    let at = assert_allowed("oldest", &f.reserve(oldest, &[(&conc, 1), (&tpm, 50)]).await);
    f.advance(10).await;
    let (newer, _) = f.reserve_new(&[(&conc, 1)]).await;
    let full = LeaseId::generate();
    let message = assert_too_many("full", &f.try_reserve(full, &[(&conc, 1)]).await);
    assert!(message.contains("the lease table is full"), "{message}");
    assert_eq!(memory.counters().leases_evicted_total, 0);
    f.assert_in_use("nothing reserved for the refused one", &[(&conc, 2), (&tpm, 50)])
        .await;

    // The oldest still completes: reconciled and released.
    f.complete(oldest, &[(&tpm, 10)]).await;
    f.assert_in_use("reconciled", &[(&conc, 1), (&tpm, 10)]).await;
    assert_allowed("the refused id was not burnt", &f.reserve(full, &[(&conc, 1)]).await);

    // Once every hold of a lease ended, it makes room, counted, and its replay is answered.
    f.advance(2_000).await;
    f.assert_in_use("timed out", &[(&conc, 0)]).await;
    assert_allowed("in the ended lease's place", &f.reserve_new(&[(&conc, 1)]).await.1);
    assert_eq!(memory.counters().leases_evicted_total, 1);
    let again = f.reserve(newer, &[(&conc, 1)]).await;
    assert!(again.is_allowed(), "replay of the dropped lease");
    assert!(
        assert_allowed(
            "the oldest's replay",
            &f.reserve(oldest, &[(&conc, 1), (&tpm, 50)]).await
        ) == at
    );
    f.assert_in_use("replays reserved nothing", &[(&conc, 1)]).await;
}
