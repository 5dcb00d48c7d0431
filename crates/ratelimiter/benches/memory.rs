//! Reserve then complete of a four-requirement LLM request (rpm, tpm,
//! concurrency, daily budget) on the memory backend, on one thread and on two
//! threads together, with a `governor` direct check as the reference measured
//! in the same run (machines are noisy: compare ratios, not absolute times).
//!
//! `cargo bench -p ratelimiter --bench memory`

use std::future::Future;
use std::hint::black_box;
use std::num::NonZeroU32;
use std::pin::pin;
use std::sync::{Arc, Barrier};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use governor::{Quota, RateLimiter};

use ratelimiter::{
    Actual, Backend, CompleteRequest, LeaseId, LimitDefinition, LimitKey, Limiter, MemoryBackend, MemoryConfig,
    Requirement, ReserveRequest, SystemClock,
};

/// Requests are built untimed in chunks this large, then reserved and completed
/// timed; large enough that the per-chunk timer and barrier cost nothing.
const CHUNK_PAIRS: u64 = 1024;
/// Capacities no run can exhaust, so every reserve is granted (the hot path).
const CAPACITY_UNLIMITED: u64 = 1 << 50;

/// Polls a future the memory backend returns; it never waits.
fn ready<F: Future>(future: F) -> F::Output {
    let mut future = pin!(future);
    match future.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(output) => output,
        Poll::Pending => unreachable!("the memory backend never waits"),
    }
}

struct Workload {
    backend: Arc<MemoryBackend>,
    keys: [LimitKey; 4],
}

impl Workload {
    fn new() -> Self {
        let config = MemoryConfig {
            leases_max: std::env::var("LEASES_MAX")
                .map(|v| v.parse().unwrap())
                .unwrap_or(100_000),
            ..Default::default()
        };
        let backend = Arc::new(MemoryBackend::new(Arc::new(SystemClock::new()), config));
        let keys = [
            LimitKey::llm_rpm("openai", "gpt-4o").unwrap(),
            LimitKey::llm_tpm("openai", "gpt-4o").unwrap(),
            LimitKey::llm_concurrency("openai", "gpt-4o").unwrap(),
            LimitKey::tenant_daily_tokens("tenant_a").unwrap(),
        ];
        let definitions = [
            LimitDefinition::rolling(keys[0].clone(), CAPACITY_UNLIMITED, 60),
            LimitDefinition::rolling(keys[1].clone(), CAPACITY_UNLIMITED, 60),
            LimitDefinition::concurrency(keys[2].clone(), CAPACITY_UNLIMITED, 300),
            LimitDefinition::rolling(keys[3].clone(), CAPACITY_UNLIMITED, 86_400),
        ];
        for definition in definitions {
            ready(backend.apply_definition(&definition.unwrap())).unwrap();
        }
        Self { backend, keys }
    }

    /// The request pair of one LLM call: reserve an upper bound of 1,800 tokens,
    /// complete with 740 used.
    fn pair(&self, lease: LeaseId) -> (ReserveRequest, CompleteRequest) {
        let amounts = [1, 1800, 1, 1800];
        let requirements = self
            .keys
            .iter()
            .zip(amounts)
            .map(|(key, amount)| Requirement {
                key: key.clone(),
                amount,
            })
            .collect();
        let actuals = [&self.keys[1], &self.keys[3]]
            .into_iter()
            .map(|key| Actual {
                key: key.clone(),
                actual_amount: 740,
            })
            .collect();
        (
            ReserveRequest::new(lease, None, requirements).unwrap(),
            CompleteRequest::new(lease, None, actuals).unwrap(),
        )
    }

    fn chunk(&self, thread: u64, first: u64) -> Vec<(ReserveRequest, CompleteRequest)> {
        (first..first + CHUNK_PAIRS)
            .map(|n| self.pair(LeaseId::from_u128((u128::from(thread) << 64) | u128::from(n))))
            .collect()
    }

    fn run(&self, chunk: &[(ReserveRequest, CompleteRequest)]) {
        for (reserve, complete) in chunk {
            let outcome = ready(self.backend.reserve(reserve)).unwrap();
            assert!(outcome.is_allowed());
            ready(self.backend.complete(complete)).unwrap();
        }
    }
}

/// Time of `iters` pairs on one thread, requests built untimed.
fn one_thread(workload: &Workload, next: &mut u64, iters: u64) -> Duration {
    let mut timed = Duration::ZERO;
    for _ in 0..iters.div_ceil(CHUNK_PAIRS) {
        let chunk = workload.chunk(0, *next);
        *next += CHUNK_PAIRS;
        let start = Instant::now();
        workload.run(black_box(&chunk));
        timed += start.elapsed();
    }
    timed * u32::try_from(iters).unwrap() / u32::try_from(iters.div_ceil(CHUNK_PAIRS) * CHUNK_PAIRS).unwrap()
}

/// Wall time per pair with two threads each doing `iters` pairs at once, on
/// the same four keys: the figure is per pair of the pool, so it is below the
/// one-thread figure exactly when two threads together are faster than one.
fn two_threads(workload: &Arc<Workload>, next: &mut u64, iters: u64) -> Duration {
    let chunks = iters.div_ceil(CHUNK_PAIRS);
    let barrier = Arc::new(Barrier::new(2));
    let first = *next;
    *next += chunks * CHUNK_PAIRS;
    let handles: Vec<_> = (1..=2u64)
        .map(|thread| {
            let (workload, barrier) = (Arc::clone(workload), Arc::clone(&barrier));
            std::thread::spawn(move || {
                let mut wall = Duration::ZERO;
                for c in 0..chunks {
                    let chunk = workload.chunk(thread, first + c * CHUNK_PAIRS);
                    barrier.wait();
                    let start = Instant::now();
                    workload.run(black_box(&chunk));
                    barrier.wait();
                    wall += start.elapsed();
                }
                wall
            })
        })
        .collect();
    let wall = handles.into_iter().map(|h| h.join().unwrap()).max().unwrap();
    // 2 * chunks * CHUNK_PAIRS pairs took `wall`; criterion divides by `iters`.
    wall * u32::try_from(iters).unwrap() / u32::try_from(2 * chunks * CHUNK_PAIRS).unwrap()
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("reserve_complete_4_requirements");
    let workload = Arc::new(Workload::new());
    let mut next = 0;
    group.bench_function("memory_one_thread", |b| {
        b.iter_custom(|iters| one_thread(&workload, &mut next, iters))
    });
    group.bench_function("memory_two_threads_per_pair", |b| {
        b.iter_custom(|iters| two_threads(&workload, &mut next, iters))
    });
    let quota = Quota::per_second(NonZeroU32::MAX);
    let governor = RateLimiter::direct(quota);
    group.bench_function("governor_direct_check", |b| {
        b.iter(|| black_box(governor.check()).is_ok())
    });
    let four: Vec<_> = (0..4).map(|_| RateLimiter::direct(quota)).collect();
    group.bench_function("governor_four_direct_checks", |b| {
        b.iter(|| four.iter().all(|limiter| black_box(limiter.check()).is_ok()))
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
