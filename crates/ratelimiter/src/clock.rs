//! Injected time. Backends and the scheduler read time only through [`Clock`], so
//! tests advance a fake clock instead of sleeping.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// A source of the current time in Unix milliseconds that never goes backwards.
pub trait Clock: Send + Sync + std::fmt::Debug + 'static {
    /// Milliseconds since the Unix epoch, monotonic within one process.
    fn now_unix_ms(&self) -> u64;

    /// Microseconds since the Unix epoch, monotonic within one process; its
    /// whole milliseconds are [`Clock::now_unix_ms`]. A backend rounds a
    /// grant's instant up with it, so that a hold lasts at least its window
    /// after the grant however far into a millisecond the grant came. Clocks
    /// without sub-millisecond time keep the default: whole milliseconds.
    fn now_unix_micros(&self) -> u64 {
        self.now_unix_ms() * 1_000
    }
}

/// Microseconds in a millisecond, to split a clock's reading.
const MICROS_PER_MS: u64 = 1_000;

fn system_unix_ms() -> u64 {
    let since_epoch = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("system clock before 1970");
    u64::try_from(since_epoch.as_millis()).expect("time fits u64 ms")
}

/// Wall time anchored once, then advanced by a monotonic clock, so a wall-clock
/// step (NTP, an operator) can neither shorten nor lengthen live windows.
#[derive(Debug, Clone)]
pub struct SystemClock {
    anchor_unix_ms: u64,
    anchor: Instant,
}

impl SystemClock {
    /// Anchors at the current wall time.
    pub fn new() -> Self {
        Self {
            anchor_unix_ms: system_unix_ms(),
            anchor: Instant::now(),
        }
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for SystemClock {
    fn now_unix_ms(&self) -> u64 {
        self.now_unix_micros() / MICROS_PER_MS
    }

    fn now_unix_micros(&self) -> u64 {
        let elapsed_micros = u64::try_from(self.anchor.elapsed().as_micros()).expect("elapsed fits u64 µs");
        self.anchor_unix_ms * MICROS_PER_MS + elapsed_micros
    }
}

/// Wall time anchored once, then advanced by tokio's clock: with
/// `tokio::time::pause()` it moves only when the runtime's virtual time does, so
/// a scheduler and a memory backend under test share one virtual timeline.
#[derive(Debug, Clone)]
pub struct TokioClock {
    anchor_unix_ms: u64,
    anchor: tokio::time::Instant,
}

impl TokioClock {
    /// Anchors at the current wall time and tokio instant.
    pub fn new() -> Self {
        Self {
            anchor_unix_ms: system_unix_ms(),
            anchor: tokio::time::Instant::now(),
        }
    }
}

impl Default for TokioClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for TokioClock {
    fn now_unix_ms(&self) -> u64 {
        self.now_unix_micros() / MICROS_PER_MS
    }

    fn now_unix_micros(&self) -> u64 {
        let elapsed_micros = u64::try_from(self.anchor.elapsed().as_micros()).expect("elapsed fits u64 µs");
        self.anchor_unix_ms * MICROS_PER_MS + elapsed_micros
    }
}

/// A clock that moves only when told to, in microseconds, so tests can grant
/// inside a millisecond as real clocks do. Clones share one time.
#[derive(Debug, Clone)]
pub struct FakeClock {
    now_unix_micros: Arc<AtomicU64>,
}

impl FakeClock {
    /// A fake clock at `start_unix_ms`.
    pub fn new(start_unix_ms: u64) -> Self {
        Self {
            now_unix_micros: Arc::new(AtomicU64::new(start_unix_ms * MICROS_PER_MS)),
        }
    }

    /// Moves time forward by `ms`.
    pub fn advance_ms(&self, ms: u64) {
        self.advance_micros(ms * MICROS_PER_MS);
    }

    /// Moves time forward by `micros`: part of a millisecond, for tests of rounding.
    pub fn advance_micros(&self, micros: u64) {
        self.now_unix_micros.fetch_add(micros, Ordering::SeqCst);
    }
}

impl Clock for FakeClock {
    fn now_unix_ms(&self) -> u64 {
        self.now_unix_micros() / MICROS_PER_MS
    }

    fn now_unix_micros(&self) -> u64 {
        self.now_unix_micros.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fake_clock_moves_only_when_advanced_and_clones_share_time() {
        let clock = FakeClock::new(1_000);
        let other = clock.clone();
        assert_eq!(clock.now_unix_ms(), 1_000);
        other.advance_ms(250);
        assert_eq!(clock.now_unix_ms(), 1_250);
        other.advance_micros(999);
        assert_eq!((clock.now_unix_ms(), clock.now_unix_micros()), (1_250, 1_250_999));
    }

    #[test]
    fn system_clock_is_near_wall_time_and_monotonic() {
        let clock = SystemClock::new();
        let a = clock.now_unix_ms();
        let b = clock.now_unix_ms();
        assert!(b >= a);
        assert!(clock.now_unix_micros() / 1_000 >= b);
        assert!(a.abs_diff(system_unix_ms()) < 1_000);
    }

    #[tokio::test(start_paused = true)]
    async fn tokio_clock_follows_paused_time() {
        let clock = TokioClock::new();
        let start = clock.now_unix_ms();
        tokio::time::sleep(std::time::Duration::from_secs(60)).await;
        assert_eq!(clock.now_unix_ms() - start, 60_000);
    }
}
