//! What the memory backend's snapshots cost (issue 15, BENCHMARKS.md "Memory
//! snapshots"): the pause a snapshot's copy puts on reserves and completes at
//! 100,000 live leases, the encoding, write and restore times, and
//! reserve+complete pairs per second on two threads with snapshots off and on,
//! in the same run (the machine is shared: compare the ratios).
//!
//! `cargo run --release -p ratelimiter --example snapshot_cost`

use std::future::Future;
use std::pin::pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use ratelimiter::memory::MemorySnapshot;
use ratelimiter::{
    Actual, Backend, CompleteRequest, LeaseId, LimitDefinition, LimitKey, Limiter, MemoryBackend, MemoryConfig,
    Requirement, ReserveRequest, SystemClock,
};

/// Live (reserved, not completed) leases while the pause is measured: the
/// default `leases_max`, a full lease table.
const LIVE_LEASES: u64 = 100_000;
/// Settled leases remembered besides them, as a busy server has: the snapshot
/// copies these too.
const SETTLED_LEASES: u64 = 400_000;
/// Snapshots taken to measure the pause; the median and the largest are shown.
const PAUSES_MEASURED: usize = 20;
/// How long each throughput run lasts.
const RUN_MS: u64 = 3_000;
/// Threads doing pairs in a throughput run: the machine's two cores.
const PAIR_THREADS: usize = 2;
/// Capacities no run exhausts, so every reserve is granted (the hot path).
const CAPACITY_UNLIMITED: u64 = 1 << 50;

/// Polls a future the memory backend returns; it never waits.
fn ready<F: Future>(future: F) -> F::Output {
    let mut future = pin!(future);
    match future.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(output) => output,
        Poll::Pending => unreachable!("the memory backend never waits"),
    }
}

fn key(name: &str) -> LimitKey {
    LimitKey::new(name).unwrap()
}

/// The four-requirement LLM call of the memory benchmark (rpm, tpm,
/// concurrency, daily tokens), on a backend with room for more live leases
/// than the pause measurement holds, so the throughput runs evict none.
fn backend() -> MemoryBackend {
    let config = MemoryConfig {
        leases_max: 2 * LIVE_LEASES as usize,
        ..MemoryConfig::default()
    };
    let backend = MemoryBackend::new(Arc::new(SystemClock::new()), config);
    for definition in [
        LimitDefinition::rolling(key("rpm"), CAPACITY_UNLIMITED, 60),
        LimitDefinition::rolling(key("tpm"), CAPACITY_UNLIMITED, 60),
        LimitDefinition::concurrency(key("inflight"), CAPACITY_UNLIMITED, 300),
        LimitDefinition::rolling(key("daily"), CAPACITY_UNLIMITED, 86_400),
    ] {
        let state = ratelimiter::definition::LimitState::active(definition.unwrap());
        ready(backend.apply_state(&state)).unwrap();
    }
    backend
}

fn reserve(backend: &MemoryBackend) -> LeaseId {
    let lease = LeaseId::generate();
    let needs = [("rpm", 1), ("tpm", 1_800), ("inflight", 1), ("daily", 1_800)];
    let requirements = needs
        .iter()
        .map(|&(name, amount)| Requirement { key: key(name), amount })
        .collect();
    let request = ReserveRequest::new(lease, None, requirements).unwrap();
    ready(backend.reserve(&request)).unwrap();
    lease
}

fn complete(backend: &MemoryBackend, lease: LeaseId) {
    let actuals = vec![
        Actual {
            key: key("tpm"),
            actual_amount: 740,
        },
        Actual {
            key: key("daily"),
            actual_amount: 740,
        },
    ];
    ready(backend.complete(&CompleteRequest::new(lease, None, actuals).unwrap())).unwrap();
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Pause, encoding, write, read and restore at [`LIVE_LEASES`] live leases.
fn one_snapshot(backend: &MemoryBackend, dir: &std::path::Path) {
    let mut pauses: Vec<Duration> = (0..PAUSES_MEASURED)
        .map(|_| {
            let start = Instant::now();
            std::hint::black_box(backend.snapshot());
            start.elapsed()
        })
        .collect();
    pauses.sort();
    let mut reused = backend.snapshot();
    let mut reused_pauses: Vec<Duration> = (0..PAUSES_MEASURED)
        .map(|_| {
            let start = Instant::now();
            backend.snapshot_into(&mut reused);
            start.elapsed()
        })
        .collect();
    reused_pauses.sort();
    println!(
        "pause into a reused snapshot (what the server does): median {:.2} ms, max {:.2} ms",
        ms(reused_pauses[PAUSES_MEASURED / 2]),
        ms(reused_pauses[PAUSES_MEASURED - 1]),
    );
    let snapshot = backend.snapshot();
    let start = Instant::now();
    let bytes = snapshot.encode();
    let encode = start.elapsed();
    let path = dir.join("memory-snapshot.bin");
    let start = Instant::now();
    snapshot.write_atomic(&path).unwrap();
    let write = start.elapsed();
    let start = Instant::now();
    let read = MemorySnapshot::read(&path).unwrap().unwrap();
    let decode = start.elapsed();
    let fresh = self::backend();
    let start = Instant::now();
    let report = fresh.restore(&read).unwrap();
    let restore = start.elapsed();
    assert_eq!(report.leases_live, LIVE_LEASES);
    println!(
        "{LIVE_LEASES} live + {SETTLED_LEASES} settled leases: pause (copy under the lock) of a fresh snapshot median {:.2} ms, max {:.2} ms; \
         encode {:.2} ms, {:.1} MB; write+fsync {:.2} ms; read+decode {:.2} ms; restore {:.2} ms",
        ms(pauses[PAUSES_MEASURED / 2]),
        ms(pauses[PAUSES_MEASURED - 1]),
        ms(encode),
        bytes.len() as f64 / 1e6,
        ms(write),
        ms(decode),
        ms(restore),
    );
}

/// Pairs per second on [`PAIR_THREADS`] threads for [`RUN_MS`], with a
/// snapshot saved every `interval` on another thread (none without one).
fn pairs_per_second(backend: &Arc<MemoryBackend>, interval: Option<Duration>, dir: &std::path::Path) -> f64 {
    let stop = Arc::new(AtomicBool::new(false));
    let pairs = Arc::new(AtomicU64::new(0));
    let workers: Vec<_> = (0..PAIR_THREADS)
        .map(|_| {
            let (backend, stop, pairs) = (backend.clone(), stop.clone(), pairs.clone());
            std::thread::spawn(move || {
                let mut done = 0;
                while !stop.load(Ordering::Relaxed) {
                    let lease = reserve(&backend);
                    complete(&backend, lease);
                    done += 1;
                }
                pairs.fetch_add(done, Ordering::Relaxed);
            })
        })
        .collect();
    let saver = interval.map(|interval| {
        let (backend, stop, path) = (backend.clone(), stop.clone(), dir.join("periodic.bin"));
        std::thread::spawn(move || {
            let mut worst = Duration::ZERO;
            let mut snapshot = MemorySnapshot::empty();
            while !stop.load(Ordering::Relaxed) {
                std::thread::sleep(interval);
                let start = Instant::now();
                backend.snapshot_into(&mut snapshot);
                worst = worst.max(start.elapsed());
                snapshot.write_atomic(&path).unwrap();
            }
            worst
        })
    });
    let start = Instant::now();
    std::thread::sleep(Duration::from_millis(RUN_MS));
    stop.store(true, Ordering::Relaxed);
    workers.into_iter().for_each(|w| w.join().unwrap());
    let rate = pairs.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64();
    if let Some(saver) = saver {
        let worst = saver.join().unwrap();
        println!("  (largest pause in this run: {:.2} ms)", ms(worst));
    }
    rate
}

fn main() {
    let dir = std::env::temp_dir().join(format!("snapshot-cost-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let backend = Arc::new(backend());
    for _ in 0..SETTLED_LEASES {
        let lease = reserve(&backend);
        complete(&backend, lease);
    }
    for _ in 0..LIVE_LEASES {
        reserve(&backend);
    }
    one_snapshot(&backend, &dir);
    let runs = [
        ("off", None),
        ("every 1 s", Some(Duration::from_millis(1_000))),
        ("every 100 ms", Some(Duration::from_millis(100))),
        ("off", None),
        ("every 1 s", Some(Duration::from_millis(1_000))),
    ];
    let mut off = Vec::new();
    for (name, interval) in runs {
        let rate = pairs_per_second(&backend, interval, &dir);
        if interval.is_none() {
            off.push(rate);
        }
        let reference = off.iter().sum::<f64>() / off.len() as f64;
        println!(
            "snapshots {name}: {:.0} pairs/s on {PAIR_THREADS} threads ({:.1}% of off so far)",
            rate,
            100.0 * rate / reference
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
