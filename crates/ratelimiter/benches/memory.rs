//! Reserve then complete of a four-requirement LLM request (rpm, tpm,
//! concurrency, daily budget) on the memory backend, on one thread and on two
//! threads together, with a `governor` direct check as the reference measured
//! in the same run (machines are noisy: compare ratios, not absolute times).
//!
//! Each figure is measured twice: as wall time (what criterion does by
//! default) and as the CPU time of the measuring threads
//! (`CLOCK_THREAD_CPUTIME_ID`), which time slices lost to other processes on a
//! shared, oversubscribed machine do not inflate.
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
use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};

use ratelimiter::{
    Actual, Backend, CompleteRequest, LeaseId, LimitDefinition, LimitKey, Limiter, MemoryBackend, MemoryConfig,
    Requirement, ReserveRequest, SystemClock,
};

/// Requests are built untimed in chunks this large, then reserved and completed
/// timed; large enough that the per-chunk timer and barrier cost nothing.
const CHUNK_PAIRS: u64 = 1024;
/// Capacities no run can exhaust, so every reserve is granted (the hot path).
const CAPACITY_UNLIMITED: u64 = 1 << 50;

/// How a run is timed.
#[derive(Debug, Clone, Copy)]
enum Timer {
    /// Elapsed real time.
    Wall,
    /// CPU time of the calling thread only.
    ThreadCpu,
}

/// A point in time of one [`Timer`].
struct Mark(Timer, Duration);

fn thread_cpu_time() -> Duration {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable timespec and the clock id is a constant.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID)");
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

fn wall_time() -> Duration {
    static EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    EPOCH.get_or_init(Instant::now).elapsed()
}

impl Mark {
    fn now(timer: Timer) -> Self {
        match timer {
            Timer::Wall => Mark(timer, wall_time()),
            Timer::ThreadCpu => Mark(timer, thread_cpu_time()),
        }
    }

    fn elapsed(&self) -> Duration {
        Mark::now(self.0).1 - self.1
    }
}

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
    /// Two sets of the four keys: another model for another tenant, so the
    /// two-thread run can also use disjoint keys.
    keys: [[LimitKey; 4]; 2],
}

impl Workload {
    fn new() -> Self {
        let backend = Arc::new(MemoryBackend::new(
            Arc::new(SystemClock::new()),
            MemoryConfig::default(),
        ));
        let key_set = |model: &str, tenant: &str| {
            [
                LimitKey::llm_rpm("openai", model).unwrap(),
                LimitKey::llm_tpm("openai", model).unwrap(),
                LimitKey::llm_concurrency("openai", model).unwrap(),
                LimitKey::tenant_daily_tokens(tenant).unwrap(),
            ]
        };
        let keys = [key_set("gpt-4o", "tenant_a"), key_set("gpt-4o-mini", "tenant_b")];
        for set in &keys {
            let definitions = [
                LimitDefinition::rolling(set[0].clone(), CAPACITY_UNLIMITED, 60),
                LimitDefinition::rolling(set[1].clone(), CAPACITY_UNLIMITED, 60),
                LimitDefinition::concurrency(set[2].clone(), CAPACITY_UNLIMITED, 300),
                LimitDefinition::rolling(set[3].clone(), CAPACITY_UNLIMITED, 86_400),
            ];
            for definition in definitions {
                ready(backend.apply_definition(&definition.unwrap())).unwrap();
            }
        }
        Self { backend, keys }
    }

    /// The request pair of one LLM call: reserve an upper bound of 1,800 tokens,
    /// complete with 740 used.
    fn pair(&self, lease: LeaseId, set: usize) -> (ReserveRequest, CompleteRequest) {
        let keys = &self.keys[set];
        let amounts = [1, 1800, 1, 1800];
        let requirements = keys
            .iter()
            .zip(amounts)
            .map(|(key, amount)| Requirement {
                key: key.clone(),
                amount,
            })
            .collect();
        let actuals = [&keys[1], &keys[3]]
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

    fn chunk(&self, thread: u64, first: u64, set: usize) -> Vec<(ReserveRequest, CompleteRequest)> {
        (first..first + CHUNK_PAIRS)
            .map(|n| self.pair(LeaseId::from_u128((u128::from(thread) << 64) | u128::from(n)), set))
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
fn one_thread(workload: &Workload, next: &mut u64, iters: u64, timer: Timer) -> Duration {
    let mut timed = Duration::ZERO;
    for _ in 0..iters.div_ceil(CHUNK_PAIRS) {
        let chunk = workload.chunk(0, *next, 0);
        *next += CHUNK_PAIRS;
        let start = Mark::now(timer);
        workload.run(black_box(&chunk));
        timed += start.elapsed();
    }
    timed * u32::try_from(iters).unwrap() / u32::try_from(iters.div_ceil(CHUNK_PAIRS) * CHUNK_PAIRS).unwrap()
}

/// Time per pair with two threads each doing `iters` pairs at once, on the
/// same four keys (with `disjoint`, each on its own four: another model for
/// another tenant, sharing only the backend). Wall: the pool's time per pair, below the one-thread figure
/// exactly when two threads together are faster than one. CPU: both threads'
/// CPU time per pair, what a pair costs under contention.
fn two_threads(workload: &Arc<Workload>, next: &mut u64, iters: u64, timer: Timer, disjoint: bool) -> Duration {
    let chunks = iters.div_ceil(CHUNK_PAIRS);
    let barrier = Arc::new(Barrier::new(2));
    let first = *next;
    *next += chunks * CHUNK_PAIRS;
    let handles: Vec<_> = (1..=2u64)
        .map(|thread| {
            let (workload, barrier) = (Arc::clone(workload), Arc::clone(&barrier));
            std::thread::spawn(move || {
                let mut timed = Duration::ZERO;
                for c in 0..chunks {
                    let set = if disjoint { thread as usize - 1 } else { 0 };
                    let chunk = workload.chunk(thread, first + c * CHUNK_PAIRS, set);
                    barrier.wait();
                    let start = Mark::now(timer);
                    workload.run(black_box(&chunk));
                    if let Timer::Wall = timer {
                        barrier.wait();
                    }
                    timed += start.elapsed();
                }
                timed
            })
        })
        .collect();
    let timed = pool_time(handles.into_iter().map(|h| h.join().unwrap()), timer);
    // 2 * chunks * CHUNK_PAIRS pairs took `timed`; criterion divides by `iters`.
    timed * u32::try_from(iters).unwrap() / u32::try_from(2 * chunks * CHUNK_PAIRS).unwrap()
}

/// Time per set of four `governor` checks with two threads each doing `iters`
/// sets at once on the same four limiters, measured like [`two_threads`]: the
/// reference for what sharing keys between two cores costs a limiter whose
/// whole state per key is one atomic word.
fn governor_two_threads(four: &[DefaultDirectRateLimiter], iters: u64, timer: Timer) -> Duration {
    let barrier = Barrier::new(2);
    let times: Vec<Duration> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..2)
            .map(|_| {
                s.spawn(|| {
                    barrier.wait();
                    let start = Mark::now(timer);
                    for _ in 0..iters {
                        black_box(four.iter().all(|limiter| black_box(limiter).check().is_ok()));
                    }
                    if let Timer::Wall = timer {
                        barrier.wait();
                    }
                    start.elapsed()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    pool_time(times.into_iter(), timer) / 2
}

/// What the threads of a pool took together, from each thread's own time:
/// wall time is the longest (the threads measured the same barrier-to-barrier
/// spans), CPU time the sum.
fn pool_time(times: impl Iterator<Item = Duration>, timer: Timer) -> Duration {
    match timer {
        Timer::Wall => times.max().unwrap(),
        Timer::ThreadCpu => times.sum(),
    }
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("reserve_complete_4_requirements");
    let workload = Arc::new(Workload::new());
    let mut next = 0;
    let quota = Quota::per_second(NonZeroU32::MAX);
    let governor = RateLimiter::direct(quota);
    let four: Vec<_> = (0..4).map(|_| RateLimiter::direct(quota)).collect();
    for (timer, suffix) in [(Timer::ThreadCpu, "cpu"), (Timer::Wall, "wall")] {
        group.bench_function(format!("memory_one_thread_{suffix}"), |b| {
            b.iter_custom(|iters| one_thread(&workload, &mut next, iters, timer))
        });
        group.bench_function(format!("memory_two_threads_per_pair_{suffix}"), |b| {
            b.iter_custom(|iters| two_threads(&workload, &mut next, iters, timer, false))
        });
        group.bench_function(format!("memory_two_threads_disjoint_keys_per_pair_{suffix}"), |b| {
            b.iter_custom(|iters| two_threads(&workload, &mut next, iters, timer, true))
        });
        group.bench_function(format!("governor_direct_check_{suffix}"), |b| {
            b.iter_custom(|iters| {
                let start = Mark::now(timer);
                for _ in 0..iters {
                    black_box(black_box(&governor).check()).ok();
                }
                start.elapsed()
            })
        });
        group.bench_function(format!("governor_four_direct_checks_{suffix}"), |b| {
            b.iter_custom(|iters| {
                let start = Mark::now(timer);
                for _ in 0..iters {
                    black_box(four.iter().all(|limiter| black_box(limiter).check().is_ok()));
                }
                start.elapsed()
            })
        });
        group.bench_function(
            format!("governor_four_direct_checks_two_threads_per_set_{suffix}"),
            |b| b.iter_custom(|iters| governor_two_threads(&four, iters, timer)),
        );
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
