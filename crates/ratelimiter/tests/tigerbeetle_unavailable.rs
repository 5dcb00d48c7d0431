//! The TigerBeetle backend when the cluster does not answer: bounded queues
//! answer at once when full, callers get 503 after their timeout, health fails
//! within its bound. Needs no cluster: the address has nothing listening.

#![cfg(feature = "tigerbeetle")]

use std::sync::Arc;

use ratelimiter::retry::{Jitter, RetryAdvisor, RetryPolicy};
use ratelimiter::tigerbeetle::client as tb;
use ratelimiter::tigerbeetle::pool::{ClientPool, PoolError};
use ratelimiter::tigerbeetle::submitter::Submitter;
use ratelimiter::tigerbeetle::{BackendOptions, ConfigFields, SubmitMode, TigerBeetleBackend, TigerBeetleConfig};
use ratelimiter::{
    Backend, LeaseId, LimitDefinition, LimitKey, Limiter, LimiterError, Requirement, ReserveRequest, SystemClock,
};

/// A loopback address nothing listens on.
fn dead_address() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().to_string()
}

fn config(mode: SubmitMode, queue_depth_max: u32) -> TigerBeetleConfig {
    TigerBeetleConfig::new(ConfigFields {
        addresses: vec![dead_address()],
        sessions: 1,
        submit_mode: mode,
        request_timeout_ms: 300,
        queue_depth_max,
        ..ConfigFields::default()
    })
    .unwrap()
}

fn transfer(id: u128) -> tb::Transfer {
    tb::Transfer::new(id)
        .with_debit_account_id(1)
        .with_credit_account_id(2)
        .with_amount(1)
        .with_ledger(1)
        .with_code(1)
}

async fn outcomes(submitter: Arc<Submitter>, count: u128) -> (usize, usize) {
    let tasks: Vec<_> = (1..=count)
        .map(|id| {
            let submitter = submitter.clone();
            tokio::spawn(async move { submitter.submit(vec![transfer(id)]).await })
        })
        .collect();
    let (mut busy, mut timeouts) = (0, 0);
    for task in tasks {
        match task.await.unwrap() {
            Err(PoolError::Busy) => busy += 1,
            Err(PoolError::Timeout(_)) => timeouts += 1,
            other => panic!("unexpected {other:?}"),
        }
    }
    (busy, timeouts)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_batching_queue_answers_busy_at_once() {
    let config = config(SubmitMode::Batching, 2);
    let pool = Arc::new(ClientPool::open(&config, 1).unwrap());
    // The only slot is taken, as by a batch that never comes back.
    let _in_flight = pool.try_slot().unwrap();
    let submitter = Arc::new(Submitter::start(pool, &config, std::future::pending()));
    // One item waits for the session in the dispatcher, two are queued: the
    // rest is shed at once.
    let (busy, timeouts) = outcomes(submitter, 20).await;
    assert!(timeouts <= 3, "{timeouts} waited");
    assert_eq!(busy + timeouts, 20);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_direct_pool_answers_busy_at_once() {
    let config = config(SubmitMode::Direct, 2);
    let pool = Arc::new(ClientPool::open(&config, 2).unwrap());
    let submitter = Arc::new(Submitter::start(pool, &config, std::future::pending()));
    let (busy, timeouts) = outcomes(submitter, 20).await;
    assert!(timeouts <= 2, "{timeouts} waited");
    assert_eq!(busy + timeouts, 20);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_backend_reports_unavailable() {
    let options = BackendOptions {
        retry: RetryAdvisor::new(RetryPolicy::default(), 16, Jitter::seeded(1)),
        decrease_retry_ms: 10_000,
        // Holds end exactly at their window: the tests time expiry to the second.
        window_margin_ms: 0,
        clock: Arc::new(SystemClock::new()),
    };
    let backend =
        TigerBeetleBackend::connect(&config(SubmitMode::Batching, 16), options, std::future::pending()).unwrap();
    assert!(matches!(backend.health().await, Err(LimiterError::Unavailable { .. })));
    let key = LimitKey::new("k").unwrap();
    let definition = LimitDefinition::rolling(key.clone(), 1, 60).unwrap();
    assert!(matches!(
        backend.apply_definition(&definition).await,
        Err(LimiterError::Unavailable { .. })
    ));
    // The key is not known here, and whether another server defined it can
    // only be read from the cluster: the answer is unknown, not a 404.
    let request = ReserveRequest::new(LeaseId::generate(), None, vec![Requirement { key, amount: 1 }]).unwrap();
    assert!(matches!(
        backend.reserve(&request).await,
        Err(LimiterError::Unavailable { .. })
    ));
}
