//! Prototype 2 (docs/testing.md, "Prototypes") and the backend benchmark: reservations of
//! four linked pending transfers per second, and their latency, in three ways in one run:
//!
//! - `client`: the reference, each worker sends its chain straight with the Rust
//!   client (sessions shared round robin; the client library coalesces what is
//!   queued on a session);
//! - `direct`: `TigerBeetleBackend::reserve` with the submitter off;
//! - `batching`: `TigerBeetleBackend::reserve` with the submitter on.
//!
//! Every run interleaves the modes round by round, so a noisy machine hurts them
//! alike, and reports ratios against `client`.
//!
//! Run: `cargo run --release -p ratelimiterd --features tigerbeetle --example proto_tb_batching -- \
//!   [--workers 64] [--reservations 20000] [--rounds 3] [--sessions 1] [--flush-micros 0] [--batch-events 8000]`
//! against `TB_ADDRESS`, or without it against a cluster it starts itself; the
//! submitter's settings default to the backend's defaults.

#[path = "support/tb_reference.rs"]
mod tb_reference;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ratelimiter::retry::{Jitter, RetryAdvisor, RetryPolicy};
use ratelimiter::tigerbeetle::{
    BackendOptions, ConfigFields, LocalCluster, SubmitMode, TigerBeetleBackend, TigerBeetleConfig,
};
use ratelimiter::{Backend, LeaseId, LimitDefinition, LimitKey, Limiter, Requirement, ReserveRequest, SystemClock};
use tb_reference::{Hold, ReferenceClient};

/// The requirements of one reservation, as the LLM helper makes them with a daily budget
/// (docs/client-library.md, "The LLM helper"): RPM, TPM, concurrency and a tenant budget.
const CHAIN_LENGTH: usize = 4;
/// The limits' window: an hour, longer than any run, so nothing expires.
const WINDOW_SECONDS: u32 = 3_600;

#[derive(Clone, Copy)]
struct Args {
    workers: usize,
    reservations: usize,
    rounds: usize,
    sessions: u32,
    flush_micros: u64,
    batch_events: u32,
}

fn args() -> Args {
    let defaults = ConfigFields::default();
    let mut args = Args {
        workers: 64,
        reservations: 20_000,
        rounds: 3,
        sessions: defaults.sessions,
        flush_micros: defaults.flush_interval_micros,
        batch_events: defaults.batch_events_max,
    };
    let argv: Vec<String> = std::env::args().skip(1).collect();
    for pair in argv.chunks(2) {
        let value = pair.get(1).map(String::as_str).unwrap_or("");
        let number = || {
            value
                .parse::<u64>()
                .unwrap_or_else(|_| panic!("{} takes a number", pair[0]))
        };
        match pair[0].as_str() {
            "--workers" => args.workers = number() as usize,
            "--reservations" => args.reservations = number() as usize,
            "--rounds" => args.rounds = number() as usize,
            "--sessions" => args.sessions = number() as u32,
            "--flush-micros" => args.flush_micros = number(),
            "--batch-events" => args.batch_events = number() as u32,
            other => panic!("unknown flag {other}"),
        }
    }
    args
}

/// Latencies and wall time of one mode in one round.
struct Sample {
    latencies_us: Vec<u64>,
    wall: Duration,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = args();
    let (_cluster, addresses) = LocalCluster::from_env_or_start()?;
    let address = addresses.join(",");
    println!(
        "cluster {address}; {} workers, {} reservations of {CHAIN_LENGTH} transfers per mode and round, {} rounds, {} sessions",
        args.workers, args.reservations, args.rounds, args.sessions
    );
    let keys: Vec<LimitKey> = (0..CHAIN_LENGTH)
        .map(|i| LimitKey::new(format!("bench:{}:{i}", LeaseId::generate())))
        .collect::<Result<_, _>>()?;
    let batching = Arc::new(backend(&addresses, &args, SubmitMode::Batching)?);
    let direct = Arc::new(backend(&addresses, &args, SubmitMode::Direct)?);
    eprintln!("defining {CHAIN_LENGTH} limits");
    for key in &keys {
        // Capacity far above the run's total: every reservation is granted.
        let definition = LimitDefinition::rolling(key.clone(), u64::MAX / 4, WINDOW_SECONDS.into())?;
        batching.apply_definition(&definition).await?;
        direct
            .apply_state(&batching.limit_report(key).await?.ok_or("lost")?.state)
            .await?;
    }
    let holds = keys
        .iter()
        .map(|key| Hold {
            key: key.clone(),
            amount: 1,
            timeout_seconds: WINDOW_SECONDS,
        })
        .collect();
    let reference = Arc::new(ReferenceClient::connect(0, &address, args.sessions as usize, holds)?);
    // Warm-up: every session registers with the cluster before anything is timed.
    let warm_up = Args {
        reservations: args.workers * args.sessions as usize,
        ..args
    };
    let c = reference.clone();
    run(&warm_up, move || raw_reserve(c.clone())).await;
    let (b, k) = (direct.clone(), keys.clone());
    run(&warm_up, move || backend_reserve(b.clone(), k.clone())).await;
    let (b, k) = (batching.clone(), keys.clone());
    run(&warm_up, move || backend_reserve(b.clone(), k.clone())).await;
    let warm_up_stats = batching.submitter_stats().snapshot();
    eprintln!("measuring");
    let mut results: Vec<(&str, Vec<Sample>)> = vec![("client", vec![]), ("direct", vec![]), ("batching", vec![])];
    for round in 0..args.rounds {
        let c = reference.clone();
        results[0].1.push(run(&args, move || raw_reserve(c.clone())).await);
        let (b, k) = (direct.clone(), keys.clone());
        results[1]
            .1
            .push(run(&args, move || backend_reserve(b.clone(), k.clone())).await);
        let (b, k) = (batching.clone(), keys.clone());
        results[2]
            .1
            .push(run(&args, move || backend_reserve(b.clone(), k.clone())).await);
        println!("round {} done", round + 1);
    }
    print_table(&results);
    let stats = batching.submitter_stats().snapshot();
    let batches = stats.batches - warm_up_stats.batches;
    let items = stats.items - warm_up_stats.items;
    let transfers = stats.transfers - warm_up_stats.transfers;
    println!(
        "batching submitter: {batches} batches, {:.1} reservations and {:.1} transfers per batch on average, largest {} transfers",
        items as f64 / batches.max(1) as f64,
        transfers as f64 / batches.max(1) as f64,
        stats.largest_batch
    );
    Ok(())
}

fn backend(
    addresses: &[String],
    args: &Args,
    mode: SubmitMode,
) -> Result<TigerBeetleBackend, Box<dyn std::error::Error>> {
    let config = TigerBeetleConfig::new(ConfigFields {
        addresses: addresses.to_vec(),
        sessions: args.sessions,
        batch_events_max: args.batch_events,
        flush_interval_micros: args.flush_micros,
        submit_mode: mode,
        request_timeout_ms: 30_000,
        ..ConfigFields::default()
    })?;
    let options = BackendOptions {
        retry: RetryAdvisor::new(RetryPolicy::default(), 1024, Jitter::from_entropy()),
        decrease_retry_ms: 10_000,
        window_margin_ms: ratelimiter::WINDOW_MARGIN_MS_DEFAULT,
        clock: Arc::new(SystemClock::new()),
    };
    Ok(TigerBeetleBackend::connect(&config, options, std::future::pending())?)
}

/// Runs `args.reservations` operations on `args.workers` concurrent workers.
async fn run<F, Fut>(args: &Args, op: F) -> Sample
where
    F: Fn() -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let remaining = Arc::new(AtomicU64::new(args.reservations as u64));
    let started = Instant::now();
    let tasks: Vec<_> = (0..args.workers)
        .map(|_| {
            let (remaining, op) = (remaining.clone(), op.clone());
            tokio::spawn(async move {
                let mut latencies = Vec::new();
                while remaining
                    .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
                    .is_ok()
                {
                    let start = Instant::now();
                    op().await;
                    latencies.push(start.elapsed().as_micros() as u64);
                }
                latencies
            })
        })
        .collect();
    let mut latencies_us = Vec::with_capacity(args.reservations);
    for task in tasks {
        latencies_us.extend(task.await.expect("worker panicked"));
    }
    Sample {
        latencies_us,
        wall: started.elapsed(),
    }
}

async fn backend_reserve(backend: Arc<TigerBeetleBackend>, keys: Vec<LimitKey>) {
    let requirements = keys.into_iter().map(|key| Requirement { key, amount: 1 }).collect();
    let request = ReserveRequest::new(LeaseId::generate(), None, requirements).expect("valid request");
    let outcome = backend.reserve(&request).await.expect("reserve failed");
    assert!(outcome.is_allowed(), "denied: {outcome:?}");
}

async fn raw_reserve(reference: Arc<ReferenceClient>) {
    reference.reserve().await;
}

fn percentile(sorted: &[u64], p: f64) -> u64 {
    let rank = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

fn print_table(results: &[(&str, Vec<Sample>)]) {
    let summary: Vec<(&str, f64, u64, u64, u64)> = results
        .iter()
        .map(|(name, samples)| {
            let mut all: Vec<u64> = samples.iter().flat_map(|s| s.latencies_us.iter().copied()).collect();
            all.sort_unstable();
            let wall: f64 = samples.iter().map(|s| s.wall.as_secs_f64()).sum();
            let rate = all.len() as f64 / wall;
            (
                *name,
                rate,
                percentile(&all, 0.5),
                percentile(&all, 0.95),
                percentile(&all, 0.99),
            )
        })
        .collect();
    let reference = summary[0].1;
    println!("| mode | reservations/s | vs client | p50 µs | p95 µs | p99 µs |");
    println!("|---|---:|---:|---:|---:|---:|");
    for (name, rate, p50, p95, p99) in summary {
        println!(
            "| {name} | {rate:.0} | {:.2} | {p50} | {p95} | {p99} |",
            rate / reference
        );
    }
}
