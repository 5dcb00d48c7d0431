//! Threads reserving and completing on shared keys at once: the memory backend
//! never grants more than capacity, and its accounting ends exactly where the
//! grants say it must. With more threads than cores, many calls are run by
//! another thread's lock holder (the combining lock), so this also checks that
//! every combined call runs once, alone, and answers its own caller.

use std::future::Future;
use std::pin::pin;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use ratelimiter::{
    Actual, Backend, CompleteRequest, FakeClock, LeaseId, LimitDefinition, LimitKey, Limiter, MemoryBackend,
    MemoryConfig, Requirement, ReserveRequest,
};

const ATTEMPTS_PER_THREAD: u64 = 3_000;
const TOKENS_CAPACITY: u64 = 20_000;
const SLOTS_CAPACITY: i64 = 6;

fn ready<F: Future>(future: F) -> F::Output {
    match pin!(future).poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(output) => output,
        Poll::Pending => unreachable!("the memory backend never waits"),
    }
}

/// A small deterministic generator per thread (xorshift), so runs repeat.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// One thread's calls: reserve (tokens and a slot) or complete a random open
/// lease with a random actual at most its reservation; counts what it keeps.
fn worker(
    t: u64,
    backend: &MemoryBackend,
    tokens: &LimitKey,
    slots: &LimitKey,
    held_slots: &AtomicI64,
    kept_tokens: &AtomicU64,
    open_slots: &AtomicI64,
) {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ (t + 1));
    let mut open: Vec<(LeaseId, u64)> = Vec::new();
    for _ in 0..ATTEMPTS_PER_THREAD {
        if !open.is_empty() && rng.below(2) == 0 {
            let (lease, amount) = open.swap_remove(rng.below(open.len() as u64) as usize);
            let actual = rng.below(amount + 1);
            held_slots.fetch_sub(1, Ordering::SeqCst);
            let actuals = vec![Actual {
                key: tokens.clone(),
                actual_amount: actual,
            }];
            let request = CompleteRequest::new(lease, None, actuals).unwrap();
            ready(backend.complete(&request)).unwrap();
            kept_tokens.fetch_sub(amount - actual, Ordering::SeqCst);
            continue;
        }
        let amount = 1 + rng.below(40);
        let lease = LeaseId::generate();
        let requirements = vec![
            Requirement {
                key: tokens.clone(),
                amount,
            },
            Requirement {
                key: slots.clone(),
                amount: 1,
            },
        ];
        let mut requirements = requirements;
        if rng.below(2) == 0 {
            // Both orders, so no lock ordering the backend might use can deadlock.
            requirements.reverse();
        }
        let request = ReserveRequest::new(lease, None, requirements).unwrap();
        if ready(backend.reserve(&request)).unwrap().is_allowed() {
            kept_tokens.fetch_add(amount, Ordering::SeqCst);
            let now_held = held_slots.fetch_add(1, Ordering::SeqCst) + 1;
            assert!(now_held <= SLOTS_CAPACITY, "{now_held} slots held at once");
            open.push((lease, amount));
        }
    }
    open_slots.fetch_add(open.len() as i64, Ordering::SeqCst);
}

#[test]
fn four_concurrent_threads_never_over_admit() {
    stress(4);
}

#[test]
fn eight_concurrent_threads_never_over_admit() {
    stress(8);
}

fn stress(threads: u64) {
    // Time stands still, so no rolling hold expires: every token granted stays
    // counted, and the sum of what the grants kept must fit the capacity.
    let clock = FakeClock::new(1_000_000);
    let backend = Arc::new(MemoryBackend::new(Arc::new(clock), MemoryConfig::default()));
    let tokens = LimitKey::new("stress:tpm").unwrap();
    let slots = LimitKey::new("stress:concurrency").unwrap();
    ready(backend.apply_definition(&LimitDefinition::rolling(tokens.clone(), TOKENS_CAPACITY, 60).unwrap())).unwrap();
    let slots_definition = LimitDefinition::concurrency(slots.clone(), SLOTS_CAPACITY as u64, 60).unwrap();
    ready(backend.apply_definition(&slots_definition)).unwrap();

    // Slots held as the threads see them: raised after a grant, lowered before
    // the complete, so it never exceeds what the backend holds.
    let held_slots = Arc::new(AtomicI64::new(0));
    let kept_tokens = Arc::new(AtomicU64::new(0));
    let open_slots = Arc::new(AtomicI64::new(0));
    let threads: Vec<_> = (0..threads)
        .map(|t| {
            let (backend, tokens, slots) = (Arc::clone(&backend), tokens.clone(), slots.clone());
            let (held_slots, kept_tokens, open_slots) = (
                Arc::clone(&held_slots),
                Arc::clone(&kept_tokens),
                Arc::clone(&open_slots),
            );
            std::thread::spawn(move || worker(t, &backend, &tokens, &slots, &held_slots, &kept_tokens, &open_slots))
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    let tokens_report = ready(backend.limit_report(&tokens)).unwrap().unwrap();
    let slots_report = ready(backend.limit_report(&slots)).unwrap().unwrap();
    let kept = kept_tokens.load(Ordering::SeqCst);
    assert!(kept <= TOKENS_CAPACITY, "{kept} tokens granted and kept");
    assert_eq!(tokens_report.in_use, kept, "the backend counts exactly the kept grants");
    assert_eq!(slots_report.in_use as i64, open_slots.load(Ordering::SeqCst));
    assert!(
        kept > TOKENS_CAPACITY / 2,
        "the run reached contention ({kept} tokens kept)"
    );
}
