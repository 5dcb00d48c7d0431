//! What a bucket limit costs a reservation on the TigerBeetle backend against a
//! rolling one (docs/tigerbeetle-backend.md, "Buckets"): a bucket's chain is a
//! posted take after the refills due (one per slot per key) and needs the
//! cluster clock's bound; a rolling one is a pending transfer alone.
//!
//! Interleaved rounds, each: [`SEQUENTIAL`] reserves one at a time on each
//! kind (p50 and p99), then [`CONCURRENT_TASKS`] tasks reserving for
//! [`CONCURRENT_FOR`] on each kind (reserves a second). Capacities are far
//! above what a run takes, so every reserve is granted.
//!
//! Run: `cargo run -p ratelimiterd --features tigerbeetle --example bucket_cost`
//! against `TB_ADDRESS`, or without it against a cluster it starts itself.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ratelimiter::retry::{Jitter, RetryAdvisor, RetryPolicy};
use ratelimiter::tigerbeetle::{BackendOptions, LocalCluster, TigerBeetleBackend, TigerBeetleConfig};
use ratelimiter::{Backend, LeaseId, LimitDefinition, LimitKey, Limiter, Requirement, ReserveRequest, SystemClock};

/// Rounds, each kind once in each, the order alternating, so that machine
/// noise and the first kind's after-effects hit both.
const ROUNDS: usize = 4;
/// Sequential reserves per kind and round.
const SEQUENTIAL: usize = 300;
/// Reserves per kind before measuring: sessions, definitions and the clock's probe.
const WARM_UP: usize = 50;
/// Tasks of the concurrent phase: enough to fill the submitter's batches.
const CONCURRENT_TASKS: usize = 32;
/// How long each kind's concurrent phase runs.
const CONCURRENT_FOR: Duration = Duration::from_secs(1);
/// Both limits' capacity: no run comes near it.
const CAPACITY: u64 = 1_000_000_000;
/// Both limits' window, in seconds (a bucket refills every second).
const WINDOW_SECONDS: u64 = 60;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (_cluster, address) = LocalCluster::from_env_or_start()?;
    let config = TigerBeetleConfig::for_addresses(0, address)?;
    let options = BackendOptions {
        retry: RetryAdvisor::new(RetryPolicy::default(), 1024, Jitter::from_entropy()),
        decrease_retry_ms: 10_000,
        window_margin_ms: ratelimiter::WINDOW_MARGIN_MS_DEFAULT,
        clock: Arc::new(SystemClock::new()),
    };
    let backend = Arc::new(TigerBeetleBackend::connect(&config, options, std::future::pending())?);
    let run = LeaseId::generate();
    let rolling = LimitKey::new(format!("bench:bucket_cost:{run}:rolling"))?;
    let bucket = LimitKey::new(format!("bench:bucket_cost:{run}:bucket"))?;
    backend
        .apply_definition(&LimitDefinition::rolling(rolling.clone(), CAPACITY, WINDOW_SECONDS)?)
        .await?;
    backend
        .apply_definition(&LimitDefinition::bucket(bucket.clone(), CAPACITY, WINDOW_SECONDS)?)
        .await?;
    let mut kinds = [("rolling", rolling), ("bucket", bucket)];
    for (_, key) in &kinds {
        for _ in 0..WARM_UP {
            granted(&backend, key).await?;
        }
    }
    for round in 1..=ROUNDS {
        // Whichever kind runs second meets the cluster after the other's load:
        // the order alternates.
        kinds.reverse();
        for (name, key) in &kinds {
            let mut latencies = Vec::with_capacity(SEQUENTIAL);
            for _ in 0..SEQUENTIAL {
                let started = Instant::now();
                granted(&backend, key).await?;
                latencies.push(started.elapsed());
            }
            latencies.sort();
            let at = |q: usize| latencies[(latencies.len() - 1) * q / 100];
            let rate = concurrent(&backend, key).await?;
            println!(
                "round {round} {name:7}: sequential p50 {:?} p99 {:?}; {rate:.0} reserves/s with {CONCURRENT_TASKS} tasks",
                at(50),
                at(99)
            );
        }
    }
    Ok(())
}

/// Reserves 1 unit of `key` under a new lease; an error unless granted.
async fn granted(backend: &TigerBeetleBackend, key: &LimitKey) -> Result<(), Box<dyn std::error::Error>> {
    let requirement = Requirement {
        key: key.clone(),
        amount: 1,
    };
    let request = ReserveRequest::new(LeaseId::generate(), None, vec![requirement])?;
    match backend.reserve(&request).await? {
        outcome if outcome.is_allowed() => Ok(()),
        outcome => Err(format!("reserve on {key} not granted: {outcome:?}").into()),
    }
}

/// Reserves a second with [`CONCURRENT_TASKS`] tasks on `key` for [`CONCURRENT_FOR`].
async fn concurrent(backend: &Arc<TigerBeetleBackend>, key: &LimitKey) -> Result<f64, Box<dyn std::error::Error>> {
    let started = Instant::now();
    let tasks: Vec<_> = (0..CONCURRENT_TASKS)
        .map(|_| {
            let (backend, key) = (Arc::clone(backend), key.clone());
            tokio::spawn(async move {
                let mut done = 0u64;
                while started.elapsed() < CONCURRENT_FOR {
                    granted(&backend, &key).await.map_err(|e| e.to_string())?;
                    done += 1;
                }
                Ok::<u64, String>(done)
            })
        })
        .collect();
    let mut total = 0;
    for task in tasks {
        total += task.await??;
    }
    Ok(total as f64 / started.elapsed().as_secs_f64())
}
