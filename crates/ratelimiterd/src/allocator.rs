//! The global allocator's tuning: how long mimalloc keeps memory it no longer
//! uses before returning it to the operating system (BENCHMARKS.md, "What keys
//! and money cost a call").
//!
//! mimalloc returns ("purges") free pages 10 ms after they empty by default. A
//! gateway's memory breathes at the rhythm of its batches (the spend ledger's
//! writes, the memory snapshots, a burst of calls): pages emptied at the end of
//! one batch are purged and faulted back, zeroed by the kernel, at the start of
//! the next, and each purge is an `madvise` whose TLB shootdown interrupts every
//! worker. Measured on the gateway benchmark's closed loop on a loaded machine,
//! a purge delay of one second took the server's CPU per call from 1.26–1.33×
//! to 1.15–1.17× of the build before keys and money, in the same rounds; on a
//! quiet machine the difference was within the noise (BENCHMARKS.md).

use std::ffi::{c_int, c_long};

/// mimalloc's option number for `mi_option_purge_delay`: its place in the
/// `mi_option_e` enumeration of `mimalloc.h` (v3), which `libmimalloc-sys`
/// does not name. The test below proves the number against the option's
/// environment variable.
const MI_OPTION_PURGE_DELAY: c_int = 15;

/// How long free memory is kept before it is returned: one second, the period
/// of the slowest batch that breathes on the call path (the spend ledger's
/// write interval and the memory snapshots' default), so the memory of one
/// batch is reused by the next instead of being returned and faulted back.
/// What it costs: at most a second's worth of freed memory held a little longer.
pub const PURGE_DELAY_MS: c_long = 1_000;

/// The environment variable with which an operator sets the purge delay
/// themselves; when it is set, [`tune`] leaves the delay as they chose.
pub const PURGE_DELAY_VARIABLE: &str = "MIMALLOC_PURGE_DELAY";

/// Sets the allocator's purge delay to [`PURGE_DELAY_MS`] unless the operator
/// set [`PURGE_DELAY_VARIABLE`]. Called first thing in `main`.
pub fn tune() {
    if std::env::var_os(PURGE_DELAY_VARIABLE).is_some() {
        return;
    }
    // SAFETY: mimalloc's options are plain integers behind its own atomics;
    // setting one is allowed at any time, from any thread.
    unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, PURGE_DELAY_MS) };
}

/// The allocator's purge delay in ms, as mimalloc reads it.
pub fn purge_delay_ms() -> c_long {
    // SAFETY: reading an option has no precondition.
    unsafe { libmimalloc_sys::mi_option_get(MI_OPTION_PURGE_DELAY) }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The child run of [`the_option_number_is_the_purge_delay`]: mimalloc
    /// reads its options from the environment the process started with.
    const CHILD: &str = "RATELIMITERD_ALLOCATOR_TEST_CHILD";

    #[test]
    fn the_option_number_is_the_purge_delay() {
        if std::env::var_os(CHILD).is_some() {
            assert_eq!(
                purge_delay_ms(),
                4_321,
                "option {MI_OPTION_PURGE_DELAY} is not the purge delay"
            );
            tune();
            assert_eq!(purge_delay_ms(), 4_321, "an operator's own setting is kept");
            return;
        }
        let exe = std::env::current_exe().expect("the test binary");
        let status = std::process::Command::new(exe)
            .args([
                "--exact",
                "allocator::tests::the_option_number_is_the_purge_delay",
                "--nocapture",
            ])
            .env(CHILD, "1")
            .env(PURGE_DELAY_VARIABLE, "4321")
            .status()
            .expect("the child runs");
        assert!(status.success(), "the child's checks failed");
    }

    #[test]
    fn tune_sets_the_delay_when_the_operator_did_not() {
        if std::env::var_os(PURGE_DELAY_VARIABLE).is_some() {
            return;
        }
        tune();
        assert_eq!(purge_delay_ms(), PURGE_DELAY_MS);
    }
}
