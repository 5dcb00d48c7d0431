//! The arithmetic of a token-bucket limit (`kind: "bucket"`, docs/bucket-limits.md),
//! written once and executed by both backends, so that the same requests get the
//! same answers from either.
//!
//! A bucket of `capacity` units refills at `capacity` per `window_seconds`, as
//! Anthropic enforces its limits ("your capacity is continuously replenished up to
//! your maximum limit, rather than being reset at fixed intervals",
//! <https://docs.anthropic.com/en/api/rate-limits>). A reservation takes its units
//! from the bucket at once; they come back by refill, never by expiry, and a
//! Complete that used less gives the difference back at once.
//!
//! Refill is discrete so that a fleet can share it exactly: time is cut into
//! slots of `window / BUCKET_SLOTS_PER_WINDOW`; at each slot boundary `b` the
//! bucket gains `cumulative(b) - cumulative(b - 1)` units, where
//! `cumulative(b) = floor(capacity * b * slot_ms / window_ms)`, so that the
//! refills of any run of slots sum to the exact rate without drift. The TigerBeetle
//! backend posts each boundary's refill as one transfer whose id names the key and
//! the boundary, so any server may post it and it counts once; the memory backend
//! adds the same amounts.
//!
//! Why the burst is smaller than the capacity: our refill comes at the end of a
//! slot while the provider's is continuous, and a call reaches the provider up to
//! a margin after our grant. In any interval of length `l`, we grant at most
//! `burst + rate * (l + slot)`; the provider sees those grants within an interval
//! of length `l + margin`. With `burst = capacity - rate * (slot + margin)`
//! (rounded down), what the provider receives in any interval of length `l` stays
//! within `capacity + rate * l`, which is exactly what its bucket allows (a token
//! bucket's arrival curve). For a 60 s window the cost is 1 s + 240 ms of refill,
//! 2.1 % of the burst, and nothing of the sustained rate.

/// Slots per window: a refill every 1/60 of the window (1 s for a minute). More
/// slots cost a smaller share of the burst but mean more refill transfers in the
/// TigerBeetle backend (at most one per slot per key, posted only when a server
/// reserves on the key); 60 keeps a minute's bucket within 1.7 % of its burst.
pub const BUCKET_SLOTS_PER_WINDOW: u64 = 60;

/// The derived constants of one bucket definition under a backend's default margin.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BucketShape {
    /// The capacity refilled per window, as defined.
    capacity: u64,
    /// The window, in ms.
    window_ms: u64,
    /// The refill slot, in ms: the window over [`BUCKET_SLOTS_PER_WINDOW`], rounded up.
    slot_ms: u64,
    /// The most units the bucket holds: the capacity less a slot's and a margin's refill.
    burst: u64,
}

impl BucketShape {
    /// The shape from its parts, or `None` when the burst would be 0.
    pub fn from_parts(capacity: u64, window_ms: u64, margin_ms: u64) -> Option<Self> {
        assert!(window_ms > 0, "a bucket's window is at least 1 s");
        let slot_ms = window_ms.div_ceil(BUCKET_SLOTS_PER_WINDOW);
        // capacity * (slot + margin) / window, rounded up: the refill the provider
        // may add while our refill lags and while the call travels.
        let lag_units = (capacity as u128 * (slot_ms + margin_ms) as u128).div_ceil(window_ms as u128);
        let burst = (capacity as u128).checked_sub(lag_units).filter(|b| *b > 0)?;
        Some(Self {
            capacity,
            window_ms,
            slot_ms,
            burst: burst as u64,
        })
    }

    /// The most units the bucket holds, and so the most one reservation can take.
    pub fn burst(&self) -> u64 {
        self.burst
    }

    /// The capacity refilled per window.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// The refill slot, in ms.
    pub fn slot_ms(&self) -> u64 {
        self.slot_ms
    }

    /// The last slot boundary at or before `now_unix_ms`: every refill up to it is due.
    pub fn boundary_at(&self, now_unix_ms: u64) -> u64 {
        now_unix_ms / self.slot_ms
    }

    /// The instant of boundary `boundary`, in unix ms (saturating).
    pub fn boundary_unix_ms(&self, boundary: u64) -> u64 {
        boundary.saturating_mul(self.slot_ms)
    }

    /// Units refilled from the epoch to boundary `boundary`: floor(capacity *
    /// boundary * slot / window). Exact in u128 for any u64 capacity and any
    /// boundary up to u64::MAX / slot_ms.
    fn cumulative(&self, boundary: u64) -> u128 {
        let elapsed_ms = boundary as u128 * self.slot_ms as u128;
        self.capacity as u128 * elapsed_ms / self.window_ms as u128
    }

    /// The refill at boundary `boundary` alone: what one refill transfer carries.
    pub fn refill_at(&self, boundary: u64) -> u64 {
        assert!(boundary > 0, "boundary 0 refills nothing");
        (self.cumulative(boundary) - self.cumulative(boundary - 1)) as u64
    }

    /// Boundaries a refill catch-up needs at most: after this many, an empty
    /// bucket is full again, so earlier boundaries change nothing.
    pub fn boundaries_to_fill(&self) -> u64 {
        BUCKET_SLOTS_PER_WINDOW + 1
    }

    /// The refill of boundaries `after + 1 ..= through`, capped at the burst
    /// (beyond it the bucket is full whatever it held).
    pub fn refill_between(&self, after: u64, through: u64) -> u64 {
        if through <= after {
            return 0;
        }
        let refill = self.cumulative(through) - self.cumulative(after);
        refill.min(self.burst as u128) as u64
    }

    /// The bucket's level at boundary `through`, from `level` at boundary `after`.
    pub fn level_after_refill(&self, level: u64, after: u64, through: u64) -> u64 {
        level
            .saturating_add(self.refill_between(after, through))
            .min(self.burst)
    }

    /// The level after `units` come back (a Complete that used less): never above the burst.
    pub fn level_after_refund(&self, level: u64, units: u64) -> u64 {
        level.saturating_add(units).min(self.burst)
    }

    /// How long, in ms from `now_unix_ms`, until a bucket at `level` as of
    /// boundary `after` holds `units`; 0 when it holds them now. `None` when no
    /// refill ever makes them fit (more than the burst).
    pub fn wait_ms(&self, level: u64, after: u64, units: u64, now_unix_ms: u64) -> Option<u64> {
        if units > self.burst {
            return None;
        }
        let now_boundary = self.boundary_at(now_unix_ms).max(after);
        if self.level_after_refill(level, after, now_boundary) >= units {
            return Some(0);
        }
        // The first boundary b with cumulative(b) >= cumulative(after) + missing,
        // that is capacity * b * slot >= target * window.
        let missing = units - level;
        let target = self.cumulative(after) + missing as u128;
        let per_boundary = self.capacity as u128 * self.slot_ms as u128;
        let boundary = (target * self.window_ms as u128).div_ceil(per_boundary);
        let at_ms = (boundary * self.slot_ms as u128).min(u64::MAX as u128) as u64;
        Some(at_ms.saturating_sub(now_unix_ms).max(1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn minute(capacity: u64) -> BucketShape {
        BucketShape::from_parts(capacity, 60_000, 240).unwrap()
    }

    #[test]
    fn the_burst_leaves_a_slot_and_a_margin_of_refill() {
        let shape = minute(80_000);
        assert_eq!(shape.slot_ms(), 1_000);
        // 80,000 * 1,240 / 60,000 = 1,653.3, rounded up.
        assert_eq!(shape.burst(), 80_000 - 1_654);
        assert_eq!(minute(50).burst(), 48);
        assert!(BucketShape::from_parts(1, 1_000, 50).is_none(), "no burst left");
        assert_eq!(BucketShape::from_parts(100, 1_000, 50).unwrap().slot_ms(), 17);
    }

    #[test]
    fn refills_sum_to_the_rate_without_drift() {
        let shape = minute(7);
        let first = 1_000_000;
        let sum: u64 = (first..first + 600).map(|b| shape.refill_at(b)).sum();
        assert_eq!(sum, 70, "ten windows refill ten capacities");
        assert!((first..first + 600).all(|b| shape.refill_at(b) <= 1));
        assert_eq!(
            shape.refill_between(first, first + 600),
            shape.burst(),
            "capped at the burst"
        );
    }

    #[test]
    fn the_level_refills_to_the_burst_and_refunds_stop_there() {
        let shape = minute(6_000);
        let burst = shape.burst();
        assert_eq!(shape.level_after_refill(0, 10, 11), 100);
        assert_eq!(shape.level_after_refill(0, 10, 10_000), burst);
        assert_eq!(shape.level_after_refund(burst - 5, 50), burst);
        assert_eq!(shape.level_after_refund(0, 50), 50);
    }

    #[test]
    fn the_wait_is_the_first_boundary_whose_refill_fits() {
        let shape = minute(6_000); // 100 per 1 s slot
        let after = 1_000; // boundary at 1,000,000 ms
        let now = 1_000_250;
        assert_eq!(shape.wait_ms(50, after, 40, now), Some(0));
        assert_eq!(shape.wait_ms(50, after, 150, now), Some(750), "boundary 1,001");
        assert_eq!(shape.wait_ms(50, after, 151, now), Some(1_750), "boundary 1,002");
        assert_eq!(shape.wait_ms(0, after, shape.burst(), now), Some(58_750));
        assert_eq!(shape.wait_ms(0, after, shape.burst() + 1, now), None);
        // A later now with boundaries not yet applied counts their refill.
        assert_eq!(shape.wait_ms(0, after, 150, 1_002_000), Some(0));
    }
}
