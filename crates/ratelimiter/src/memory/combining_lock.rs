//! A lock that lets its holder run the operations of the threads waiting for
//! it (flat combining), so the guarded value stays in the holder's cache and
//! only each waiter's small request and result lines move between cores.
//!
//! A caller that finds the lock free runs its operation and then those waiting
//! in the slots. A caller that finds it held publishes its operation in a free
//! slot and waits for it to be done, trying the lock again between waits: an
//! operation published just after the holder's last look at the slots is run
//! by its own caller once the holder leaves. Waiting spins briefly, then yields
//! the processor, then sleeps: it never blocks in the kernel on the lock, so a
//! handoff costs no futex wake-up, and a waiter whose holder lost its processor
//! (more runnable threads than cores, as on a busy tokio runtime) soon gives
//! way to it.
//!
//! A thread whose last operation another thread ran is patient: it publishes
//! its next one even when the lock is free and takes the lock only after
//! spinning, because under steady contention a holder is usually about to
//! come back, and the guarded value moving to a new core at every change of
//! holder is what costs most (measured in BENCHMARKS.md: two threads got 25-46 %
//! more pairs through with about 28 % less CPU).

use std::cell::UnsafeCell;
use std::fmt;
use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};
use std::thread;
use std::time::Duration;

/// How many operations can wait in slots at once: one per thread that can run
/// in parallel is enough for the machines we serve; further waiters spin on the
/// lock itself until a slot frees up.
pub const SLOTS_MAX: usize = 8;
/// The most operations of others one holder runs before it leaves, so a holder
/// serving a steady stream of waiters still returns its own result in bounded
/// time.
pub const COMBINE_BATCH_MAX: usize = 16;
/// Spins of a waiter before it yields its processor: a few microseconds at
/// most, the length of a few operations, the usual wait when the holder is
/// running; also how long a patient thread waits for a holder before taking a
/// free lock itself, which bounds what patience costs a thread left alone.
const WAIT_SPINS_MAX: u32 = 64;
/// Yields of a waiter before it sleeps between looks: a holder that stays
/// away this long has most likely lost its processor to other work.
const WAIT_YIELDS_MAX: u32 = 64;
/// A long-waiting caller's sleep between looks: short against a request's
/// latency, long enough to hand the processor to a preempted holder.
const WAIT_SLEEP: Duration = Duration::from_micros(50);

// A holder's first look at the slots runs every operation it finds there.
const _: () = assert!(COMBINE_BATCH_MAX >= SLOTS_MAX);

/// Threads seen so far, to give each its own first slot to try.
static THREADS_SEEN: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// The slot this thread tries first: a different one per thread (up to
    /// [`SLOTS_MAX`] threads), so waiters rarely contend for a slot and a
    /// thread's slot line tends to stay between the same two cores.
    static SLOT_HINT: usize = THREADS_SEEN.fetch_add(1, Ordering::Relaxed) % SLOTS_MAX;
    /// Whether this thread's last operation was run by another thread's
    /// holder: then it is likely to be again, and takes a free lock only after
    /// spinning, so the holder's cache keeps the value (see [`CombiningLock::run`]).
    static SERVED_LAST: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Slot states. A slot goes `FREE -> CLAIMED -> READY -> DONE -> FREE`, each
/// step taken by exactly one party: the waiter that claimed it, except
/// `READY -> DONE` by the lock holder that ran the operation.
const FREE: u8 = 0;
/// The claiming waiter is writing its operation into the slot.
const CLAIMED: u8 = 1;
/// The operation is published: the next lock holder may run it.
const READY: u8 = 2;
/// The operation ran; its result is in the waiter's frame.
const DONE: u8 = 3;

/// A `T` that threads take turns to modify, each call through
/// [`CombiningLock::run`], possibly run by another thread.
pub struct CombiningLock<T> {
    /// True while a thread owns `value`; on its own cache line, since every
    /// caller reads it and only acquisition writes it.
    held: Padded<AtomicBool>,
    /// Where waiters publish their operations.
    slots: [Padded<Slot<T>>; SLOTS_MAX],
    /// The guarded value: only the thread that set `held` touches it.
    value: UnsafeCell<T>,
}

// SAFETY: the value is only reached by the one thread holding `held`, so
// sharing the lock moves `T` between threads (hence `T: Send`) but never gives
// two threads access to it at once; the slots only carry pointers to
// operations whose closures and results are `Send` (see `run`).
unsafe impl<T: Send> Sync for CombiningLock<T> {}
// SAFETY: as for `Sync`: owning the lock is owning a `T`.
unsafe impl<T: Send> Send for CombiningLock<T> {}

/// Aligns its content to 128 bytes: two cache lines, as adjacent-line
/// prefetchers pair them, so two slots never share a line.
#[repr(align(128))]
struct Padded<V>(V);

/// One waiter's published operation.
struct Slot<T> {
    /// `FREE`, `CLAIMED`, `READY` or `DONE`.
    state: AtomicU8,
    /// The waiter's [`Pending`], type-erased; written only in `CLAIMED`.
    op: UnsafeCell<Option<ErasedOp<T>>>,
}

/// A pointer to a waiter's [`Pending`] and the function that runs it.
struct ErasedOp<T> {
    /// Points into the waiting caller's stack frame, which outlives the
    /// operation because the caller returns only once its slot is `DONE` or it
    /// took the operation back under the lock.
    pending: *mut (),
    /// `run_pending::<T, F, R>` for the waiter's types.
    call: unsafe fn(*mut (), &mut T),
}

/// An operation and, once run, its outcome (or its panic).
struct Pending<F, R> {
    /// Taken when the operation runs, so it runs at most once.
    op: Option<F>,
    /// Written by whoever ran the operation.
    outcome: Option<thread::Result<R>>,
}

/// Runs a published operation on `value`, catching its panic so that it
/// reaches the waiter that owns the operation rather than the holder.
///
/// # Safety
/// `pending` points to a live `Pending<F, R>` that nothing else accesses for
/// the duration of the call.
unsafe fn run_pending<T, F: FnOnce(&mut T) -> R, R>(pending: *mut (), value: &mut T) {
    // SAFETY: guaranteed by the caller.
    let pending = unsafe { &mut *pending.cast::<Pending<F, R>>() };
    let op = pending.op.take().expect("a published operation runs once");
    pending.outcome = Some(panic::catch_unwind(AssertUnwindSafe(|| op(value))));
}

/// Releases the lock when dropped, also when the holder's operation panics.
struct Held<'a, T> {
    lock: &'a CombiningLock<T>,
}

impl<T> Drop for Held<'_, T> {
    fn drop(&mut self) {
        self.lock.held.0.store(false, Ordering::Release);
    }
}

impl<T> CombiningLock<T> {
    /// A lock guarding `value`.
    pub fn new(value: T) -> Self {
        Self {
            held: Padded(AtomicBool::new(false)),
            slots: std::array::from_fn(|_| {
                Padded(Slot {
                    state: AtomicU8::new(FREE),
                    op: UnsafeCell::new(None),
                })
            }),
            value: UnsafeCell::new(value),
        }
    }

    /// Runs `op` on the value, alone, on this thread or on the thread that
    /// holds the lock; returns its result. A panic in `op` reaches this
    /// caller, and the value stays as `op` left it (there is no poisoning:
    /// callers only modify the value once nothing can fail). As with a mutex,
    /// `op` must not call `run` on the same lock: it would wait for itself.
    #[inline]
    pub fn run<F, R>(&self, op: F) -> R
    where
        F: FnOnce(&mut T) -> R + Send,
        R: Send,
    {
        let patient = SERVED_LAST.get();
        if !patient {
            if let Some(held) = self.try_hold() {
                return self.run_holding(held, op);
            }
        }
        let mut pending = Pending {
            op: Some(op),
            outcome: None,
        };
        let mut wait = Wait::default();
        loop {
            if let Some(slot) = self.claim_slot() {
                return self.wait_for(slot, &mut pending, wait, patient);
            }
            if let Some(held) = self.try_hold() {
                let op = pending.op.take().expect("not yet published");
                return self.run_holding(held, op);
            }
            wait.pause();
        }
    }

    #[inline]
    fn try_hold(&self) -> Option<Held<'_, T>> {
        // Reading first keeps waiters from taking the line from the holder.
        let free = !self.held.0.load(Ordering::Relaxed);
        let won = free
            && self
                .held
                .0
                .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
                .is_ok();
        // `then`, not `then_some`: a `Held` built and dropped would release the lock.
        won.then(|| Held { lock: self })
    }

    /// Runs the holder's own operation, then those waiting, then releases.
    #[inline]
    fn run_holding<F: FnOnce(&mut T) -> R, R>(&self, held: Held<'_, T>, op: F) -> R {
        // SAFETY: `held` proves this thread set `held` and nobody else will
        // touch the value until it is dropped, after the last use of `value`.
        let value = unsafe { &mut *self.value.get() };
        SERVED_LAST.set(false);
        let result = op(value);
        self.combine(value);
        drop(held);
        result
    }

    /// Runs up to [`COMBINE_BATCH_MAX`] published operations, looking at the
    /// slots again while the last look found some.
    fn combine(&self, value: &mut T) {
        let mut ran = 0;
        loop {
            let ran_before = ran;
            for slot in &self.slots {
                if ran == COMBINE_BATCH_MAX {
                    return;
                }
                let slot = &slot.0;
                if slot.state.load(Ordering::Acquire) != READY {
                    continue;
                }
                // SAFETY: `READY` (acquired) means the waiter finished writing
                // `op` and will not touch the slot or its `Pending` until it
                // sees `DONE` or holds the lock, which this thread does.
                unsafe {
                    let op = (*slot.op.get()).as_ref().expect("a ready slot holds an operation");
                    (op.call)(op.pending, value);
                }
                slot.state.store(DONE, Ordering::Release);
                ran += 1;
            }
            if ran == ran_before {
                return;
            }
        }
    }

    /// A slot now `CLAIMED` by this caller, if one is free.
    fn claim_slot(&self) -> Option<&Slot<T>> {
        let start = SLOT_HINT.with(|hint| *hint);
        (0..SLOTS_MAX)
            .map(|i| &self.slots[(start + i) % SLOTS_MAX].0)
            .find(|slot| {
                slot.state.load(Ordering::Relaxed) == FREE
                    && slot
                        .state
                        .compare_exchange(FREE, CLAIMED, Ordering::Acquire, Ordering::Relaxed)
                        .is_ok()
            })
    }

    /// Publishes `pending` in the claimed `slot` and waits until a holder ran
    /// it or this caller gets the lock and runs it itself.
    fn wait_for<F, R>(&self, slot: &Slot<T>, pending: &mut Pending<F, R>, mut wait: Wait, patient: bool) -> R
    where
        F: FnOnce(&mut T) -> R,
    {
        // SAFETY: the slot is `CLAIMED` by this caller, so nobody else reads
        // `op` until the `READY` store below publishes it.
        unsafe {
            *slot.op.get() = Some(ErasedOp {
                pending: (pending as *mut Pending<F, R>).cast(),
                call: run_pending::<T, F, R>,
            });
        }
        slot.state.store(READY, Ordering::Release);
        loop {
            if slot.state.load(Ordering::Acquire) == DONE {
                break;
            }
            let may_hold = !patient || wait.pauses >= WAIT_SPINS_MAX;
            if let Some(held) = may_hold.then(|| self.try_hold()).flatten() {
                // Holding the lock, nobody else can be running the operation:
                // it is either done or still ours to run.
                if slot.state.load(Ordering::Acquire) == READY {
                    slot.state.store(FREE, Ordering::Release);
                    let op = pending.op.take().expect("published operations run once");
                    return self.run_holding(held, op);
                }
                drop(held);
                break;
            }
            wait.pause();
        }
        // `DONE` (acquired): the holder wrote the outcome and let go of it.
        slot.state.store(FREE, Ordering::Release);
        SERVED_LAST.set(true);
        match pending.outcome.take().expect("a done operation has an outcome") {
            Ok(result) => result,
            Err(payload) => panic::resume_unwind(payload),
        }
    }
}

impl<T> fmt::Debug for CombiningLock<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The value is only readable under the lock; a `Debug` that waited
        // for it could deadlock a caller formatting from inside an operation.
        f.debug_struct("CombiningLock").finish_non_exhaustive()
    }
}

impl<T> Drop for CombiningLock<T> {
    fn drop(&mut self) {
        // Every `run` returns only after its slot is free again, and `drop`
        // needs every borrow to have ended.
        debug_assert!(self.slots.iter_mut().all(|slot| *slot.0.state.get_mut() == FREE));
    }
}

/// A waiter's backoff: spin, then yield, then sleep, each bounded.
#[derive(Default)]
struct Wait {
    /// Pauses so far, which decides the kind of the next one.
    pauses: u32,
}

impl Wait {
    fn pause(&mut self) {
        if self.pauses < WAIT_SPINS_MAX {
            std::hint::spin_loop();
        } else if self.pauses < WAIT_SPINS_MAX + WAIT_YIELDS_MAX {
            thread::yield_now();
        } else {
            thread::sleep(WAIT_SLEEP);
        }
        self.pauses = self.pauses.saturating_add(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    /// Only a broken lock keeps a test waiting this long.
    const WAIT_LIMIT: Duration = Duration::from_secs(120);
    /// More threads than slots, so waiters also contend for slots; fewer under
    /// Miri, which runs every thread's every step.
    const THREADS: usize = if cfg!(miri) { 3 } else { SLOTS_MAX + 4 };
    const OPS_PER_THREAD: usize = if cfg!(miri) { 25 } else { 20_000 };
    /// Steps between an operation's read and write of the counter.
    const OVERLAP_SPINS: usize = if cfg!(miri) { 1 } else { 64 };

    fn wait_until(what: &str, done: impl Fn() -> bool) {
        let start = Instant::now();
        while !done() {
            assert!(start.elapsed() < WAIT_LIMIT, "gave up waiting for {what}");
            thread::yield_now();
        }
    }

    fn published<T>(lock: &CombiningLock<T>) -> usize {
        let ready = |slot: &&Padded<Slot<T>>| slot.0.state.load(Ordering::Acquire) == READY;
        lock.slots.iter().filter(ready).count()
    }

    #[test]
    fn runs_an_operation_and_returns_its_result() {
        let lock = CombiningLock::new(vec![1]);
        let len = lock.run(|v| {
            v.push(2);
            v.len()
        });
        assert_eq!(len, 2);
        assert_eq!(lock.run(|v| v.clone()), [1, 2]);
    }

    #[test]
    fn every_operation_runs_exactly_once_and_alone() {
        // A plain read-then-write counter: two operations at once, or one run
        // twice or never, would repeat or skip a value.
        let lock = CombiningLock::new(0usize);
        let seen: Vec<Vec<usize>> = thread::scope(|s| {
            let increments = || {
                let increment = |n: &mut usize| {
                    let before = *n;
                    // Widens the window in which an overlapping call would
                    // read the same value.
                    for _ in 0..OVERLAP_SPINS {
                        std::hint::black_box(before);
                    }
                    *n = before + 1;
                    before
                };
                (0..OPS_PER_THREAD).map(|_| lock.run(increment)).collect::<Vec<_>>()
            };
            let threads: Vec<_> = (0..THREADS).map(|_| s.spawn(increments)).collect();
            threads.into_iter().map(|t| t.join().unwrap()).collect()
        });
        for own in &seen {
            assert!(
                own.windows(2).all(|w| w[0] < w[1]),
                "one thread's calls run in its order"
            );
        }
        let mut all = seen.concat();
        all.sort_unstable();
        assert!(all.into_iter().eq(0..THREADS * OPS_PER_THREAD));
        assert_eq!(lock.run(|n| *n), THREADS * OPS_PER_THREAD);
    }

    #[test]
    fn the_holder_runs_a_waiting_operation_on_its_own_thread() {
        let lock = CombiningLock::new(Vec::new());
        let waiter_ran_on = thread::scope(|s| {
            let waiter = lock.run(|log| {
                let waiter = s.spawn(|| {
                    lock.run(|log: &mut Vec<&str>| {
                        log.push("waiter");
                        thread::current().id()
                    })
                });
                wait_until("the waiter to publish", || published(&lock) == 1);
                log.push("holder");
                waiter
            });
            waiter.join().unwrap()
        });
        assert_eq!(waiter_ran_on, thread::current().id());
        assert_eq!(lock.run(|log| log.clone()), ["holder", "waiter"]);
        assert_eq!(published(&lock), 0);
    }

    #[test]
    fn a_thread_served_by_a_holder_still_runs_alone_when_nobody_holds_the_lock() {
        let lock = CombiningLock::new(0u32);
        let on = |n: &mut u32| {
            *n += 1;
            thread::current().id()
        };
        let holder_left = AtomicBool::new(false);
        thread::scope(|s| {
            let waiter = lock.run(|_| {
                // Served by this holder, then patient: its second call finds
                // the lock free and nobody coming, and must take it itself.
                let waiter = s.spawn(|| {
                    let served_on = lock.run(on);
                    wait_until("the holder to leave", || holder_left.load(Ordering::Acquire));
                    (served_on, lock.run(on), thread::current().id())
                });
                wait_until("the waiter to publish", || published(&lock) == 1);
                waiter
            });
            holder_left.store(true, Ordering::Release);
            let (served_on, alone_on, waiter) = waiter.join().unwrap();
            assert_eq!(served_on, thread::current().id());
            assert_eq!(alone_on, waiter);
        });
        assert_eq!(lock.run(|n| *n), 2);
        assert_eq!(published(&lock), 0);
    }

    #[test]
    fn a_full_set_of_slots_is_drained_and_the_waiters_beyond_it_still_finish() {
        let lock = CombiningLock::new(0usize);
        let holder = thread::current().id();
        let ran_on = thread::scope(|s| {
            let waiters = lock.run(|_| {
                let waiters: Vec<_> = (0..SLOTS_MAX + 2)
                    .map(|_| {
                        s.spawn(|| {
                            lock.run(|n| {
                                *n += 1;
                                thread::current().id()
                            })
                        })
                    })
                    .collect();
                wait_until("every slot to be published", || published(&lock) == SLOTS_MAX);
                waiters
            });
            waiters.into_iter().map(|w| w.join().unwrap()).collect::<Vec<_>>()
        });
        let by_holder = ran_on.iter().filter(|&&id| id == holder).count();
        assert!(
            by_holder >= SLOTS_MAX,
            "the holder ran every published operation ({by_holder})"
        );
        assert_eq!(lock.run(|n| *n), SLOTS_MAX + 2);
    }

    #[test]
    fn a_panic_in_a_combined_operation_reaches_its_own_caller() {
        let lock = CombiningLock::new(0u32);
        let caught = thread::scope(|s| {
            let waiter = lock.run(|n| {
                *n += 1;
                let waiter = s.spawn(|| {
                    panic::catch_unwind(AssertUnwindSafe(|| lock.run(|_| -> u32 { panic!("the waiter's own") })))
                });
                wait_until("the waiter to publish", || published(&lock) == 1);
                waiter
            });
            waiter.join().expect("the panic was caught in the waiter")
        });
        let payload = caught.expect_err("the waiter's operation panicked");
        assert_eq!(payload.downcast_ref::<&str>(), Some(&"the waiter's own"));
        assert_eq!(lock.run(|n| *n), 1, "the holder's own operation is kept");
    }

    #[test]
    fn a_holder_that_panics_releases_the_lock_and_strands_no_waiter() {
        let lock = CombiningLock::new(0u32);
        let waiter_saw = thread::scope(|s| {
            let mut waiter = None;
            let holder = panic::catch_unwind(AssertUnwindSafe(|| {
                lock.run(|n| {
                    waiter = Some(s.spawn(|| {
                        lock.run(|n| {
                            *n += 10;
                            *n
                        })
                    }));
                    wait_until("the waiter to publish", || published(&lock) == 1);
                    *n += 1;
                    panic!("the holder's own");
                })
            }));
            assert!(holder.is_err());
            waiter.expect("spawned").join().unwrap()
        });
        assert_eq!(waiter_saw, 11, "the waiter ran its own operation after the holder left");
        assert_eq!(lock.run(|n| *n), 11);
    }
}
