//! The units one limit holds, grouped by the instant they expire.

use std::collections::VecDeque;

/// The most distinct expiry instants one limit keeps. Holds made in the same
/// millisecond share an instant, so a 60 s window never needs more than 60,000;
/// only a long window under a reservation every millisecond could reach it. At
/// 16 bytes each this caps one key at 16 MiB; past it new holds on that key are
/// denied until the oldest instant expires.
pub const EXPIRY_INSTANTS_MAX: usize = 1 << 20;

/// Units that expire together at one instant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Bucket {
    expires_at_unix_ms: u64,
    units: u64,
}

/// Held units ordered by expiry.
///
/// One limit gives every hold the same duration and time never goes back, so
/// new holds nearly always expire last: they are appended (or merged into the
/// last instant) in O(1), expiry pops from the front in O(1), and the exact time
/// until `n` units are free is a walk from the front over only the instants
/// that must pass. A hold is found again by its expiry instant (binary search)
/// to shrink or release it, so nothing is cancelled lazily and nothing stale
/// accumulates. An instant is unique while it lives, and a new hold always
/// expires after `now`, so an instant that has expired is never reused.
#[derive(Debug, Default)]
pub struct ExpiryQueue {
    buckets: VecDeque<Bucket>,
    in_use: u64,
}

impl ExpiryQueue {
    /// Units held now (expired instants included until [`ExpiryQueue::expire`] runs).
    pub fn in_use(&self) -> u64 {
        self.in_use
    }

    /// The number of distinct expiry instants kept.
    #[cfg(test)]
    pub fn instants(&self) -> usize {
        self.buckets.len()
    }

    /// Drops every instant at or before `now_unix_ms`.
    pub fn expire(&mut self, now_unix_ms: u64) {
        while let Some(front) = self.buckets.front() {
            if front.expires_at_unix_ms > now_unix_ms {
                break;
            }
            self.in_use -= front.units;
            self.buckets.pop_front();
        }
    }

    fn position(&self, expires_at_unix_ms: u64) -> Result<usize, usize> {
        if let Some(back) = self.buckets.back() {
            if back.expires_at_unix_ms == expires_at_unix_ms {
                return Ok(self.buckets.len() - 1);
            }
            if back.expires_at_unix_ms < expires_at_unix_ms {
                return Err(self.buckets.len());
            }
        }
        self.buckets
            .binary_search_by_key(&expires_at_unix_ms, |b| b.expires_at_unix_ms)
    }

    /// True when a hold expiring at `expires_at_unix_ms` can be recorded: it joins
    /// an existing instant or there is room for one more.
    pub fn can_hold(&self, expires_at_unix_ms: u64) -> bool {
        self.buckets.len() < EXPIRY_INSTANTS_MAX || self.position(expires_at_unix_ms).is_ok()
    }

    /// Holds `units` until `expires_at_unix_ms`. The caller checked capacity and
    /// [`ExpiryQueue::can_hold`].
    pub fn hold(&mut self, expires_at_unix_ms: u64, units: u64) {
        assert!(units > 0, "a hold is at least one unit");
        match self.position(expires_at_unix_ms) {
            Ok(i) => self.buckets[i].units += units,
            Err(i) => {
                assert!(self.buckets.len() < EXPIRY_INSTANTS_MAX, "caller checks can_hold");
                self.buckets.insert(
                    i,
                    Bucket {
                        expires_at_unix_ms,
                        units,
                    },
                );
            }
        }
        self.in_use += units;
    }

    /// Gives back `units` of a hold that expires at `expires_at_unix_ms`. A hold
    /// that already expired has nothing left to give back.
    pub fn release(&mut self, expires_at_unix_ms: u64, units: u64) {
        let Ok(i) = self.position(expires_at_unix_ms) else {
            return;
        };
        let bucket = &mut self.buckets[i];
        assert!(bucket.units >= units, "releasing more than was held at this instant");
        bucket.units -= units;
        self.in_use -= units;
        if bucket.units == 0 && (i == 0 || i + 1 == self.buckets.len()) {
            // Empty instants at either end are dropped at once; one in the middle
            // expires with its neighbours.
            self.buckets.remove(i);
        }
    }

    /// Gives back up to `units` of what is held until `expires_at_unix_ms`: all of
    /// it when less is held there. For a record that may lag its holds (a limit's
    /// in-flight record after its definition changed), where [`ExpiryQueue::release`]
    /// would be a programming error.
    pub fn release_up_to(&mut self, expires_at_unix_ms: u64, units: u64) {
        if let Ok(i) = self.position(expires_at_unix_ms) {
            self.release(expires_at_unix_ms, units.min(self.buckets[i].units));
        }
    }

    /// Milliseconds from `now_unix_ms` until at least `units` units have expired,
    /// or `None` when fewer are held. Walks only the instants that must pass.
    pub fn ms_until_released(&self, now_unix_ms: u64, units: u64) -> Option<u64> {
        let mut released = 0u64;
        for bucket in &self.buckets {
            released += bucket.units;
            if released >= units {
                return Some(bucket.expires_at_unix_ms.saturating_sub(now_unix_ms));
            }
        }
        None
    }

    /// Units held until `instant` or later (those that expire at or after it),
    /// as of the last [`ExpiryQueue::expire`]. Walks from the latest instant back
    /// over only those at or after `instant`.
    pub fn units_from(&self, instant: u64) -> u64 {
        (self.buckets.iter().rev())
            .take_while(|b| b.expires_at_unix_ms >= instant)
            .map(|b| b.units)
            .sum()
    }

    /// Every instant kept with its units, earliest first: what a snapshot saves.
    pub fn buckets(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.buckets.iter().map(|b| (b.expires_at_unix_ms, b.units))
    }

    /// The earliest instant still kept, if any.
    pub fn first_expiry_unix_ms(&self) -> Option<u64> {
        self.buckets.front().map(|b| b.expires_at_unix_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_merge_per_instant_and_expire_in_order() {
        let mut q = ExpiryQueue::default();
        q.hold(100, 3);
        q.hold(100, 2);
        q.hold(200, 1);
        assert_eq!((q.in_use(), q.instants()), (6, 2));
        q.expire(99);
        assert_eq!(q.in_use(), 6);
        q.expire(100);
        assert_eq!((q.in_use(), q.instants()), (1, 1));
        q.expire(1_000);
        assert_eq!((q.in_use(), q.instants()), (0, 0));
    }

    #[test]
    fn out_of_order_holds_are_inserted_in_place() {
        let mut q = ExpiryQueue::default();
        q.hold(300, 1);
        q.hold(100, 2);
        q.hold(200, 4);
        q.hold(200, 1);
        assert_eq!(q.ms_until_released(0, 2), Some(100));
        assert_eq!(q.ms_until_released(0, 3), Some(200));
        assert_eq!(q.ms_until_released(0, 7), Some(200));
        assert_eq!(q.ms_until_released(0, 8), Some(300));
        assert_eq!(q.ms_until_released(0, 9), None);
        q.expire(200);
        assert_eq!(q.in_use(), 1);
    }

    #[test]
    fn release_finds_the_instant_and_ignores_expired_holds() {
        let mut q = ExpiryQueue::default();
        q.hold(100, 5);
        q.hold(200, 5);
        q.hold(300, 5);
        q.release(200, 5);
        assert_eq!((q.in_use(), q.instants()), (10, 3), "an empty middle instant stays");
        q.release(300, 2);
        assert_eq!(q.in_use(), 8);
        q.release(300, 3);
        assert_eq!((q.in_use(), q.instants()), (5, 2), "an empty last instant goes");
        q.expire(150);
        q.release(100, 5);
        assert_eq!(q.in_use(), 0, "the expired hold gave nothing back twice");
        assert_eq!(q.ms_until_released(150, 1), None);
        assert_eq!(q.first_expiry_unix_ms(), Some(200));
        q.expire(200);
        assert_eq!(q.first_expiry_unix_ms(), None);
    }

    #[test]
    fn units_from_counts_the_instants_at_or_after() {
        let mut q = ExpiryQueue::default();
        assert_eq!(q.units_from(0), 0);
        q.hold(100, 1);
        q.hold(200, 2);
        q.hold(300, 4);
        assert_eq!(q.units_from(0), 7);
        assert_eq!(q.units_from(200), 6, "an instant equal to the bound counts");
        assert_eq!(q.units_from(201), 4);
        assert_eq!(q.units_from(301), 0);
        q.release_up_to(300, 10);
        assert_eq!(q.units_from(200), 2, "all that was held there, not more");
        q.release_up_to(250, 1);
        assert_eq!(q.in_use(), 3, "nothing held at that instant");
    }

    #[test]
    #[should_panic(expected = "releasing more than was held")]
    fn releasing_more_than_held_is_a_programming_error() {
        let mut q = ExpiryQueue::default();
        q.hold(100, 1);
        q.release(100, 2);
    }

    /// The first design (docs/memory-backend.md, "Data structures"): a min-heap by expiry
    /// with lazy cancellation, each hold a slab entry (never reused here, which favours
    /// the heap's speed and costs it memory). Only for the comparison below.
    mod lazy_heap {
        use std::cmp::Reverse;
        use std::collections::BinaryHeap;

        #[derive(Default)]
        pub struct LazyHeap {
            pub heap: BinaryHeap<Reverse<(u64, usize)>>,
            pub amounts: Vec<u64>,
            pub in_use: u64,
        }

        impl LazyHeap {
            pub fn hold(&mut self, expires_at: u64, units: u64) -> usize {
                self.amounts.push(units);
                self.heap.push(Reverse((expires_at, self.amounts.len() - 1)));
                self.in_use += units;
                self.amounts.len() - 1
            }
            pub fn release(&mut self, slot: usize, units: u64) {
                self.amounts[slot] -= units;
                self.in_use -= units;
            }
            pub fn expire(&mut self, now: u64) {
                while let Some(&Reverse((at, slot))) = self.heap.peek() {
                    if at > now {
                        break;
                    }
                    self.heap.pop();
                    self.in_use -= self.amounts[slot];
                    self.amounts[slot] = 0;
                }
            }
            /// The exact hint: pops a copy of the heap until enough has expired.
            pub fn ms_until_released(&self, now: u64, units: u64) -> Option<u64> {
                let mut copy = self.heap.clone();
                let mut released = 0;
                while let Some(Reverse((at, slot))) = copy.pop() {
                    released += self.amounts[slot];
                    if released >= units {
                        return Some(at - now);
                    }
                }
                None
            }
        }
    }

    /// Measures the expiry queue against the lazy heap on a TPM key: a 60 s
    /// window, 1,000 calls a second (one per millisecond), each reserving
    /// 1,800 tokens and reconciled to 740, and a denial hint that needs 1% of
    /// the window to expire. Prints the figures quoted in BENCHMARKS.md:
    /// `cargo test -p ratelimiter --release --lib expiry_queue_against_lazy_heap -- --ignored --nocapture`
    #[test]
    #[ignore = "a measurement, not a check; run it by name"]
    fn expiry_queue_against_lazy_heap() {
        use std::hint::black_box;
        use std::time::Instant;
        const CALLS: u64 = 600_000;
        let at = |n: u64| 60_000 + n; // one call per ms, i.e. 1,000 a second
        let start = Instant::now();
        let mut queue = ExpiryQueue::default();
        for n in 0..CALLS {
            queue.hold(at(n), 1800);
            queue.release(at(n), 1060);
            queue.expire(n);
        }
        let queue_ns = start.elapsed().as_nanos() as f64 / CALLS as f64;
        let start = Instant::now();
        let mut heap = lazy_heap::LazyHeap::default();
        for n in 0..CALLS {
            let slot = heap.hold(at(n), 1800);
            heap.release(slot, 1060);
            heap.expire(n);
        }
        let heap_ns = start.elapsed().as_nanos() as f64 / CALLS as f64;
        assert_eq!(queue.in_use(), heap.in_use);
        let now = CALLS;
        let need = queue.in_use() / 100;
        let start = Instant::now();
        let queue_hint = black_box(queue.ms_until_released(now, need));
        let queue_hint_ns = start.elapsed().as_nanos();
        let start = Instant::now();
        let heap_hint = black_box(heap.ms_until_released(now, need));
        let heap_hint_ns = start.elapsed().as_nanos();
        assert_eq!(queue_hint, heap_hint);
        println!("per call (hold, reconcile, expire): expiry queue {queue_ns:.1} ns, lazy heap {heap_ns:.1} ns");
        println!(
            "exact hint over {} live holds: expiry queue {queue_hint_ns} ns, lazy heap {heap_hint_ns} ns",
            heap.heap.len()
        );
        println!(
            "memory: expiry queue {} instants x 16 B, lazy heap {} nodes x 16 B + {} slab entries x 8 B",
            queue.instants(),
            heap.heap.len(),
            heap.amounts.len()
        );
    }
}
