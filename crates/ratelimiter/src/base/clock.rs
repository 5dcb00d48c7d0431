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

    /// The machine's boot clock, read at the same moment as the clock: it
    /// tells how much real time passed between two processes of one boot
    /// whatever the wall clock did meanwhile, so a memory snapshot restored
    /// after a wall-clock step still ends its holds on time. `None` when
    /// unknown (then a restore trusts the wall clock).
    fn boot_instant(&self) -> Option<BootInstant> {
        None
    }
}

/// A reading of the boot clock (Linux `CLOCK_BOOTTIME`): it never steps, counts
/// suspended time, and is shared by every process of one boot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BootInstant {
    /// Which boot (`/proc/sys/kernel/random/boot_id`): readings of two boots
    /// do not compare. Never 0, which the snapshot format keeps for "unknown".
    pub boot_id: u128,
    /// Microseconds since that boot.
    pub since_boot_micros: u64,
}

impl BootInstant {
    /// Whole milliseconds of real time from `earlier` to `self`, rounded down;
    /// `None` across boots or backwards (readings that do not compare).
    pub fn ms_since(&self, earlier: &BootInstant) -> Option<u64> {
        if self.boot_id != earlier.boot_id {
            return None;
        }
        let micros = self.since_boot_micros.checked_sub(earlier.since_boot_micros)?;
        Some(micros / MICROS_PER_MS)
    }

    /// The boot clock now, on Linux; `None` elsewhere or when unreadable.
    pub fn now() -> Option<BootInstant> {
        let boot_id = boot_id()?;
        let since_boot_micros = since_boot_micros()?;
        Some(BootInstant {
            boot_id,
            since_boot_micros,
        })
    }
}

/// This boot's id, read once per process (it cannot change while it runs).
fn boot_id() -> Option<u128> {
    static BOOT_ID: std::sync::OnceLock<Option<u128>> = std::sync::OnceLock::new();
    *BOOT_ID.get_or_init(|| {
        let text = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
        let hex: String = text.trim().chars().filter(|c| *c != '-').collect();
        u128::from_str_radix(&hex, 16).ok().filter(|&id| id != 0)
    })
}

#[cfg(target_os = "linux")]
fn since_boot_micros() -> Option<u64> {
    let mut now = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `now` is a valid, writable timespec for the call's duration.
    if unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut now) } != 0 {
        return None;
    }
    let seconds = u64::try_from(now.tv_sec).ok()?;
    let nanos = u64::try_from(now.tv_nsec).ok()?;
    Some(seconds * 1_000_000 + nanos / 1_000)
}

#[cfg(not(target_os = "linux"))]
fn since_boot_micros() -> Option<u64> {
    None
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

    fn boot_instant(&self) -> Option<BootInstant> {
        BootInstant::now()
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
/// inside a millisecond as real clocks do. Clones share one time. Its boot
/// clock (one fixed boot) moves with it, and starts where its wall time
/// starts unless [`FakeClock::after_wall_step`] made it.
#[derive(Debug, Clone)]
pub struct FakeClock {
    now_unix_micros: Arc<AtomicU64>,
    /// Wall time minus boot time, in µs: fixed for one clock.
    boot_offset_micros: i64,
}

/// The boot id of every fake clock: they all model one machine's boot.
const FAKE_BOOT_ID: u128 = 0xFA4E_B007;

impl FakeClock {
    /// A fake clock at `start_unix_ms`.
    pub fn new(start_unix_ms: u64) -> Self {
        Self {
            now_unix_micros: Arc::new(AtomicU64::new(start_unix_ms * MICROS_PER_MS)),
            boot_offset_micros: 0,
        }
    }

    /// The clock a new process of the same boot reads after the wall clock
    /// stepped by `step_ms` (forward or back, as NTP or an operator does):
    /// its own time, wall time `step_ms` away from this clock's, boot time
    /// the same. A backend's clock never steps within one process (see
    /// [`SystemClock`]); a step shows across a restart.
    pub fn after_wall_step(&self, step_ms: i64) -> FakeClock {
        let now = self.now_unix_micros();
        let stepped = now
            .checked_add_signed(step_ms * MICROS_PER_MS as i64)
            .expect("a step within u64 µs");
        FakeClock {
            now_unix_micros: Arc::new(AtomicU64::new(stepped)),
            boot_offset_micros: self.boot_offset_micros + step_ms * MICROS_PER_MS as i64,
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

    fn boot_instant(&self) -> Option<BootInstant> {
        let since_boot_micros = self
            .now_unix_micros()
            .checked_add_signed(-self.boot_offset_micros)
            .expect("boot time within u64 µs");
        Some(BootInstant {
            boot_id: FAKE_BOOT_ID,
            since_boot_micros,
        })
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

    #[test]
    fn the_boot_clock_counts_real_time_whatever_the_wall_clock_does() {
        let clock = FakeClock::new(10_000_000);
        let before = clock.boot_instant().unwrap();
        clock.advance_ms(500);
        let stepped = clock.after_wall_step(-3_600_000);
        assert_eq!(stepped.now_unix_ms(), 10_000_500 - 3_600_000);
        assert_eq!(stepped.boot_instant().unwrap().ms_since(&before), Some(500));
        let other_boot = BootInstant {
            boot_id: 1,
            since_boot_micros: u64::MAX,
        };
        assert_eq!(other_boot.ms_since(&before), None);
        assert_eq!(before.ms_since(&stepped.boot_instant().unwrap()), None, "backwards");
        if let Some(real) = SystemClock::new().boot_instant() {
            let later = BootInstant::now().unwrap();
            assert!(later.ms_since(&real).is_some());
        }
    }

    #[tokio::test(start_paused = true)]
    async fn tokio_clock_follows_paused_time() {
        let clock = TokioClock::new();
        let start = clock.now_unix_ms();
        tokio::time::sleep(std::time::Duration::from_secs(60)).await;
        assert_eq!(clock.now_unix_ms() - start, 60_000);
    }
}
