//! What the console's "Next release" costs on the TigerBeetle backend
//! (docs/tigerbeetle-backend.md, "Next release"), against the key's own
//! `limit_report` (one account lookup) in the same run: a key with nothing
//! held, a key with a recent hold (one page of its debits), and a key whose
//! oldest hold still held lies behind [`RELEASED`] released reservations (the
//! four pages the read is bounded to).
//!
//! Rounds interleave the four reads, [`QUESTIONS`] each, the order rotating, so
//! that machine noise hits all of them.
//!
//! Run: `cargo run --release -p ratelimiterd --features tigerbeetle --example next_release_cost`
//! against `TB_ADDRESS`, or without it against a cluster it starts itself.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ratelimiter::retry::{Jitter, RetryAdvisor, RetryPolicy};
use ratelimiter::tigerbeetle::{BackendOptions, LocalCluster, TigerBeetleBackend, TigerBeetleConfig};
use ratelimiter::{
    Backend, CompleteRequest, LeaseId, LimitDefinition, LimitKey, Limiter, Requirement, ReserveRequest, SystemClock,
};

/// Rounds of the four reads.
const ROUNDS: usize = 4;
/// Questions per read and round.
const QUESTIONS: u32 = 200;
/// Reservations taken and released after the stuck key's oldest hold: more
/// than the four pages of 256 debits a question reads.
const RELEASED: usize = 600;

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
    let backend = TigerBeetleBackend::connect(&config, options, std::future::pending())?;
    let run = LeaseId::generate();
    let key = |name: &str| LimitKey::new(format!("bench:next_release:{run}:{name}"));
    let (idle, recent, stuck) = (key("idle")?, key("recent")?, key("stuck")?);
    for k in [&idle, &recent, &stuck] {
        backend
            .apply_definition(&LimitDefinition::concurrency(k.clone(), 1_000, 300)?)
            .await?;
    }
    hold(&backend, &recent, LeaseId::generate()).await?;
    hold(&backend, &stuck, LeaseId::generate()).await?;
    for _ in 0..RELEASED {
        let lease = LeaseId::generate();
        hold(&backend, &stuck, lease).await?;
        backend
            .complete(&CompleteRequest::new(lease, None, Vec::new())?)
            .await?;
    }
    for (k, held) in [(&idle, false), (&recent, true), (&stuck, true)] {
        let answer = backend.next_release_ms(k).await?;
        assert_eq!(answer.is_some(), held, "{k}: {answer:?}");
    }
    println!("round  limit_report  idle  recent  stuck  (mean per question; ratios to limit_report)");
    for round in 0..ROUNDS {
        let mut means = [Duration::ZERO; 4];
        for i in 0..4 {
            let which = (i + round) % 4;
            let started = Instant::now();
            for _ in 0..QUESTIONS {
                match which {
                    0 => drop(backend.limit_report(&idle).await?),
                    1 => drop(backend.next_release_ms(&idle).await?),
                    2 => drop(backend.next_release_ms(&recent).await?),
                    _ => drop(backend.next_release_ms(&stuck).await?),
                }
            }
            means[which] = started.elapsed() / QUESTIONS;
        }
        let ratio = |d: Duration| d.as_secs_f64() / means[0].as_secs_f64();
        println!(
            "{round}  {:?}  {:?} ({:.2})  {:?} ({:.2})  {:?} ({:.2})",
            means[0],
            means[1],
            ratio(means[1]),
            means[2],
            ratio(means[2]),
            means[3],
            ratio(means[3])
        );
    }
    Ok(())
}

async fn hold(backend: &TigerBeetleBackend, key: &LimitKey, lease: LeaseId) -> Result<(), Box<dyn std::error::Error>> {
    let request = ReserveRequest::new(
        lease,
        None,
        vec![Requirement {
            key: key.clone(),
            amount: 1,
        }],
    )?;
    assert!(
        backend.reserve(&request).await?.is_allowed(),
        "capacity is far above the run"
    );
    Ok(())
}
