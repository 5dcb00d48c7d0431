//! A lower bound of the cluster's clock (docs/tigerbeetle-backend.md, "Clocks"):
//! what a Complete of a lease reserved by another process measures the
//! window's elapsed time with, instead of two servers' wall clocks.
//!
//! The cluster stamps every transfer it writes with its own time, in ns, and
//! times every hold from that stamp (its physical time, kept within a bounded
//! skew of the replicas' clocks: <https://docs.tigerbeetle.com/coding/time/>). The stamp of a transfer this process
//! wrote is a time the cluster had reached when the write was answered, so it
//! is a lower bound of the cluster's "now" from then on; between readings the
//! bound moves with this process's monotonic clock, discounted by
//! [`DRIFT_PPM`], so it never runs ahead of the cluster. When no reading is
//! younger than [`READING_AGE_MAX`], a probe (a zero-amount transfer of its
//! own, looked up for its stamp) takes a new one; concurrent Completes share
//! one probe. Stamps of transfers merely looked up (a lease's reservations)
//! are not readings: they may be a window old, and would pass for fresh.
//!
//! The elapsed time it gives is never more than truly elapsed on the cluster:
//! a Complete holds a re-reservation at least until the original window
//! ends, at most the probe's round trip, the discount and TigerBeetle's
//! whole-second timeouts longer.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The most this process's monotonic clock is assumed to run faster than the
/// cluster's, in parts per million: ten times what a quartz oscillator drifts
/// (about 100 ppm at worst) and twice the most NTP ever slews (500 ppm).
pub const DRIFT_PPM: u64 = 1_000;

/// Parts per million in a whole, to apply [`DRIFT_PPM`].
const PPM: u64 = 1_000_000;

/// How old a reading may grow before a Complete that needs the cluster's time
/// probes again: over a minute the drift discount costs at most 60 ms of
/// extra hold, and a probe a minute (two small requests) is nothing beside
/// the thousands of requests a second a busy server sends.
pub const READING_AGE_MAX: Duration = Duration::from_secs(60);

/// One time stamp of the cluster and when this process had it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Reading {
    /// The cluster's time, in ns since the epoch.
    cluster_ns: u64,
    /// A moment at which the cluster had reached `cluster_ns`.
    at: Instant,
}

impl Reading {
    /// The lower bound this reading gives at `now`: the reading plus the
    /// monotonic time since, less the drift discount, rounded down.
    fn bound_at(&self, now: Instant) -> u64 {
        let since_ns = u64::try_from(now.saturating_duration_since(self.at).as_nanos()).unwrap_or(u64::MAX);
        self.cluster_ns.saturating_add(discounted_ns(since_ns))
    }
}

/// `ns` of this process's monotonic clock as the least the cluster's clock
/// advanced meanwhile: less [`DRIFT_PPM`], rounded down.
fn discounted_ns(ns: u64) -> u64 {
    let kept = u128::from(ns) * u128::from(PPM - DRIFT_PPM) / u128::from(PPM);
    u64::try_from(kept).expect("a discounted u64 fits u64")
}

/// The best reading of the cluster's clock so far, and the probes taken.
#[derive(Debug, Default)]
pub struct ClusterClock {
    /// The reading whose bound is highest; `None` before the first.
    reading: Mutex<Option<Reading>>,
    /// Held while probing, so concurrent Completes share one probe.
    probe_gate: tokio::sync::Mutex<()>,
    /// Probes written (a metric).
    probes: AtomicU64,
}

impl ClusterClock {
    /// Takes `cluster_ns`, a time stamp the cluster had written by `at`,
    /// when it gives a higher bound than the reading held.
    pub fn observe(&self, cluster_ns: u64, at: Instant) {
        let new = Reading { cluster_ns, at };
        let mut reading = self.reading.lock().expect("cluster clock lock");
        let better = match *reading {
            None => true,
            Some(old) => {
                let later = old.at.max(at);
                new.bound_at(later) > old.bound_at(later)
            }
        };
        if better {
            *reading = Some(new);
        }
    }

    /// The cluster's time at `now`, at least: `None` when no reading is at
    /// most [`READING_AGE_MAX`] old.
    pub fn fresh_bound_ns(&self, now: Instant) -> Option<u64> {
        let reading = (*self.reading.lock().expect("cluster clock lock"))?;
        (now.saturating_duration_since(reading.at) <= READING_AGE_MAX).then(|| reading.bound_at(now))
    }

    /// Probes written since the start.
    pub fn probes(&self) -> u64 {
        self.probes.load(Ordering::Relaxed)
    }

    /// Waits for the probe gate: whoever holds it probes, the others then
    /// find its reading fresh.
    pub async fn probe_gate(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.probe_gate.lock().await
    }

    /// Counts one probe.
    pub fn count_probe(&self) {
        self.probes.fetch_add(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND_NS: u64 = 1_000_000_000;

    #[test]
    fn the_bound_advances_slower_than_the_local_clock_by_the_drift() {
        let clock = ClusterClock::default();
        let start = Instant::now();
        assert_eq!(clock.fresh_bound_ns(start), None, "no reading yet");
        clock.observe(1_000 * SECOND_NS, start);
        assert_eq!(clock.fresh_bound_ns(start), Some(1_000 * SECOND_NS));
        let later = start + Duration::from_secs(10);
        // 10 s less 1,000 ppm: 9.99 s.
        assert_eq!(clock.fresh_bound_ns(later), Some(1_000 * SECOND_NS + 9_990_000_000));
        assert_eq!(discounted_ns(999), 998, "rounded toward less elapsed");
    }

    #[test]
    fn a_reading_older_than_the_maximum_age_is_not_fresh() {
        let clock = ClusterClock::default();
        let start = Instant::now();
        clock.observe(SECOND_NS, start);
        assert!(clock.fresh_bound_ns(start + READING_AGE_MAX).is_some());
        assert_eq!(
            clock.fresh_bound_ns(start + READING_AGE_MAX + Duration::from_millis(1)),
            None
        );
    }

    #[test]
    fn only_a_higher_bound_replaces_the_reading() {
        let clock = ClusterClock::default();
        let start = Instant::now();
        clock.observe(100 * SECOND_NS, start);
        let later = start + Duration::from_secs(30);
        // An older stamp had later bounds less.
        clock.observe(50 * SECOND_NS, later);
        assert_eq!(
            clock.fresh_bound_ns(later),
            Some(100 * SECOND_NS + discounted_ns(30 * SECOND_NS))
        );
        // A fresher one bounds more, and restarts the age.
        clock.observe(131 * SECOND_NS, later);
        assert_eq!(clock.fresh_bound_ns(later), Some(131 * SECOND_NS));
        assert!(clock.fresh_bound_ns(later + READING_AGE_MAX).is_some());
        // A reading taken before the held one and observed late compares at
        // the same moment: 101 s at the start bounds 130.97 s by then.
        clock.observe(101 * SECOND_NS, start);
        assert_eq!(clock.fresh_bound_ns(later), Some(131 * SECOND_NS));
    }
}
