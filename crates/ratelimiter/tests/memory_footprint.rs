//! Memory per outstanding reservation of the memory backend, measured with a
//! counting global allocator. Prints the figures quoted in BENCHMARKS.md:
//!
//! `cargo test -p ratelimiter --release --test memory_footprint -- --nocapture`
//!
//! Allocation is deterministic, so the bounds asserted here cannot flake.

use std::alloc::{GlobalAlloc, Layout, System};
use std::future::Future;
use std::pin::pin;
use std::sync::atomic::{AtomicIsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use ratelimiter::memory::{MemoryBackend, MemoryConfig, SETTLED_LEASES_MAX_DEFAULT};
use ratelimiter::{
    Backend, CompleteRequest, FakeClock, LeaseId, LimitDefinition, LimitKey, Limiter, Requirement, ReserveRequest,
};

/// Counts the bytes allocated and not yet freed by the whole process.
struct Counting;

static LIVE_BYTES: AtomicIsize = AtomicIsize::new(0);

// SAFETY: every call is forwarded to the system allocator unchanged; the
// counter is only bookkeeping.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE_BYTES.fetch_add(layout.size() as isize, Ordering::Relaxed);
        System.alloc(layout)
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE_BYTES.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        System.dealloc(ptr, layout)
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE_BYTES.fetch_add(new_size as isize - layout.size() as isize, Ordering::Relaxed);
        System.realloc(ptr, layout, new_size)
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Reservations outstanding at once in each measurement.
const LEASES: u64 = 50_000;

fn ready<F: Future>(future: F) -> F::Output {
    match pin!(future).poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(output) => output,
        Poll::Pending => unreachable!("the memory backend never waits"),
    }
}

fn live_bytes() -> isize {
    LIVE_BYTES.load(Ordering::Relaxed)
}

struct Setup {
    clock: FakeClock,
    backend: MemoryBackend,
    keys: [LimitKey; 4],
}

fn setup(capacity: u64) -> Setup {
    let clock = FakeClock::new(1_000_000);
    let backend = MemoryBackend::new(Arc::new(clock.clone()), MemoryConfig::default());
    let keys = [
        LimitKey::llm_rpm("openai", "gpt-4o").unwrap(),
        LimitKey::llm_tpm("openai", "gpt-4o").unwrap(),
        LimitKey::llm_concurrency("openai", "gpt-4o").unwrap(),
        LimitKey::tenant_daily_tokens("tenant_a").unwrap(),
    ];
    let definitions = [
        LimitDefinition::rolling(keys[0].clone(), capacity, 60),
        LimitDefinition::rolling(keys[1].clone(), capacity, 60),
        LimitDefinition::concurrency(keys[2].clone(), capacity, 300),
        LimitDefinition::rolling(keys[3].clone(), capacity, 86_400),
    ];
    for definition in definitions {
        ready(backend.apply_definition(&definition.unwrap())).unwrap();
    }
    Setup { clock, backend, keys }
}

fn requests(keys: &[LimitKey; 4], first: u64) -> Vec<ReserveRequest> {
    (first..first + LEASES)
        .map(|n| {
            let requirements = keys
                .iter()
                .zip([1, 1800, 1, 1800])
                .map(|(key, amount)| Requirement {
                    key: key.clone(),
                    amount,
                })
                .collect();
            ReserveRequest::new(LeaseId::from_u128(u128::from(n) + 1), None, requirements).unwrap()
        })
        .collect()
}

/// Bytes per lease of reserving every request, advancing the clock by
/// `step_ms` between reservations.
fn bytes_per_reserve(s: &Setup, requests: &[ReserveRequest], step_ms: u64, allowed: bool) -> f64 {
    let before = live_bytes();
    for request in requests {
        let outcome = ready(s.backend.reserve(request)).unwrap();
        assert_eq!(outcome.is_allowed(), allowed);
        s.clock.advance_ms(step_ms);
    }
    (live_bytes() - before) as f64 / requests.len() as f64
}

#[test]
fn memory_per_outstanding_reservation() {
    // Worst case: every reservation in its own millisecond, so each rolling
    // limit keeps one expiry instant per lease.
    let spread = setup(1 << 50);
    let batch = requests(&spread.keys, 0);
    let spread_bytes = bytes_per_reserve(&spread, &batch, 1, true);

    // Load: many reservations per millisecond share the expiry instants.
    let dense = setup(1 << 50);
    let batch = requests(&dense.keys, 0);
    let dense_bytes = bytes_per_reserve(&dense, &batch, 0, true);

    // Denied lease ids remembered so they stay denied.
    let full = setup(1800);
    let first = requests(&full.keys, 0);
    ready(full.backend.reserve(&first[0])).unwrap();
    let denied = requests(&full.keys, LEASES);
    let failed_bytes = bytes_per_reserve(&full, &denied, 0, false);

    // Completing every outstanding lease allocates nothing: the settled-lease
    // tables are allocated once up front, and the lease table keeps its
    // capacity (up to `leases_max`) for the next leases.
    let before = live_bytes();
    for n in 0..LEASES {
        let complete = CompleteRequest::new(LeaseId::from_u128(u128::from(n) + 1), None, Vec::new()).unwrap();
        ready(dense.backend.complete(&complete)).unwrap();
    }
    let completed_bytes = (live_bytes() - before) as f64 / LEASES as f64;

    let settled_bytes = bytes_per_settled_lease();

    println!("memory backend, bytes per lease with 4 requirements ({LEASES} outstanding):");
    println!("  outstanding, one expiry instant each (worst case): {spread_bytes:.0}");
    println!("  outstanding, expiry instants shared (under load):  {dense_bytes:.0}");
    println!("  denied lease id remembered:                        {failed_bytes:.0}");
    println!("  change on complete:                                {completed_bytes:.0}");
    println!("  settled lease remembered (allocated up front):     {settled_bytes:.1}");
    assert!(spread_bytes < 512.0, "{spread_bytes} bytes per outstanding reservation");
    assert!(dense_bytes < spread_bytes);
    assert!(failed_bytes < 128.0, "{failed_bytes} bytes per denied lease id");
    assert!(completed_bytes <= 0.0, "complete allocates nothing");
    // A 32-byte entry and 2/3 of a 32-byte half of an index bucket.
    assert!(
        (53.0..54.0).contains(&settled_bytes),
        "{settled_bytes} bytes per settled lease"
    );
}

/// Bytes the default `settled_leases_max` allocates per lease it bounds: a
/// default backend against one with the smallest bound.
fn bytes_per_settled_lease() -> f64 {
    let clock = Arc::new(FakeClock::new(0));
    let before = live_bytes();
    let smallest = MemoryBackend::new(
        clock.clone(),
        MemoryConfig {
            settled_leases_max: 2,
            ..MemoryConfig::default()
        },
    );
    let small_bytes = live_bytes() - before;
    let default = MemoryBackend::new(clock, MemoryConfig::default());
    let default_bytes = live_bytes() - before - small_bytes;
    drop((smallest, default));
    (default_bytes - small_bytes) as f64 / SETTLED_LEASES_MAX_DEFAULT as f64
}
