//! One limit's live state in the memory backend: its admin state, held units,
//! debt and denial streak.

use crate::model::bucket::BucketShape;
use crate::model::definition::{available_of, DefinitionError, LimitKind, LimitReport, LimitState, LimitStatus};
use crate::model::retry::Streak;

use super::expiry_queue::ExpiryQueue;

/// A defined limit with what it holds now.
#[derive(Debug)]
pub struct Limit {
    state: LimitState,
    /// Rolling and concurrency holds, by expiry instant; empty for a bucket.
    holds: ExpiryQueue,
    /// For a limit with a calendar period, the part of `holds` that calls still in
    /// flight hold (reserved, not completed), by expiry instant: the rest is what
    /// completed calls settled ([`Limit::settled_through_period_end`]). Empty for
    /// other limits.
    in_flight: ExpiryQueue,
    /// A bucket's level; `None` for the other kinds.
    bucket: Option<BucketLevel>,
    debt: u64,
    /// Until when an `overage: owe` limit refuses every reservation: the end of
    /// the latest window or period whose usage it could not hold; 0 when it
    /// never owed.
    owed_until_unix_ms: u64,
    streak: Streak,
}

/// What a bucket holds (docs/bucket-limits.md): its level as of a slot boundary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BucketLevel {
    /// The shape under the backend's default margin: burst, slots, refills.
    shape: BucketShape,
    /// Units in the bucket, at most the burst.
    level: u64,
    /// The last slot boundary whose refill `level` includes.
    boundary: u64,
}

impl BucketLevel {
    /// Units in the bucket as of [`BucketLevel::refilled_at_unix_ms`].
    pub fn level(&self) -> u64 {
        self.level
    }

    /// The instant of the last boundary whose refill the level includes: what a
    /// snapshot saves, so that a restore shifted across a clock step refills from
    /// the shifted instant.
    pub fn refilled_at_unix_ms(&self) -> u64 {
        self.shape.boundary_unix_ms(self.boundary)
    }
}

impl Limit {
    /// A limit in `state` holding nothing (a bucket starts full), shaped under
    /// the backend's `default_margin_ms`. Errs when a bucket keeps no burst
    /// under that margin.
    pub fn new(state: LimitState, default_margin_ms: u64) -> Result<Self, DefinitionError> {
        let bucket = match state.definition().kind() {
            LimitKind::Bucket => {
                let shape = BucketShape::new(state.definition(), default_margin_ms)?;
                Some(BucketLevel {
                    shape,
                    level: shape.burst(),
                    boundary: 0,
                })
            }
            LimitKind::Rolling | LimitKind::Concurrency => None,
        };
        Ok(Self {
            state,
            holds: ExpiryQueue::default(),
            in_flight: ExpiryQueue::default(),
            bucket,
            debt: 0,
            owed_until_unix_ms: 0,
            streak: Streak::default(),
        })
    }

    /// The bucket's level, for a snapshot; `None` for the other kinds.
    pub fn bucket(&self) -> Option<BucketLevel> {
        self.bucket
    }

    /// Puts back a bucket's saved `level` as of `refilled_at_unix_ms` (a
    /// restore): never above the burst, which a changed margin may have lowered.
    pub fn restore_bucket(&mut self, level: u64, refilled_at_unix_ms: u64) {
        let bucket = self.bucket.as_mut().expect("only a bucket restores a level");
        bucket.level = level.min(bucket.shape.burst());
        bucket.boundary = bucket.shape.boundary_at(refilled_at_unix_ms);
    }

    /// The admin state.
    pub fn state(&self) -> &LimitState {
        &self.state
    }

    /// Replaces the admin state; holds, debt and streak carry over. The caller
    /// checked that the kind is unchanged. A bucket whose capacity changes gets
    /// the new shape; its level grows by the burst's growth, or loses the burst's
    /// decrease (a decrease is applied once the level holds it,
    /// [`Limit::has_room_for_decrease`]). Errs, changing nothing, when a bucket
    /// would keep no burst under `default_margin_ms`.
    pub fn set_state(&mut self, state: LimitState, default_margin_ms: u64) -> Result<(), DefinitionError> {
        assert_eq!(state.definition().kind(), self.kind(), "a limit's kind never changes");
        if let Some(bucket) = self.bucket.as_mut() {
            let shape = BucketShape::new(state.definition(), default_margin_ms)?;
            let (old, new) = (bucket.shape.burst(), shape.burst());
            bucket.level = if new >= old {
                bucket.level.saturating_add(new - old)
            } else {
                bucket.level.saturating_sub(old - new)
            }
            .min(new);
            bucket.shape = shape;
        }
        self.state = state;
        Ok(())
    }

    /// True when a pending decrease to the state's target can be applied now:
    /// the units in use fit the smaller capacity, or a bucket holds the burst's
    /// decrease. The caller expired or refilled first.
    pub fn has_room_for_decrease(&self, default_margin_ms: u64) -> bool {
        let target = self.state.pending_decrease_to();
        match &self.bucket {
            Some(bucket) => {
                let smaller = self.state.definition().with_capacity(target).ok();
                let burst = smaller.map_or(0, |d| d.grantable_max(default_margin_ms));
                bucket.level >= bucket.shape.burst().saturating_sub(burst)
            }
            None => self.capacity().saturating_sub(self.in_use()) >= self.capacity() - target,
        }
    }

    /// Rolling or concurrency.
    pub fn kind(&self) -> LimitKind {
        self.state.definition().kind()
    }

    /// The capacity in force (while decreasing, the old one).
    pub fn capacity(&self) -> u64 {
        self.state.definition().capacity()
    }

    /// True while a decrease waits: new reservations are refused.
    pub fn is_decreasing(&self) -> bool {
        self.state.status() == LimitStatus::Decreasing
    }

    /// When a hold made at `now_unix_ms` ends: after the window plus its margin
    /// (`default_margin_ms` when the definition gives none), or the timeout.
    pub fn hold_until(&self, now_unix_ms: u64, default_margin_ms: u64) -> u64 {
        (self.state.definition()).hold_end_unix_ms(now_unix_ms, default_margin_ms)
    }

    /// For a limit with a calendar period, the units that completed calls hold until
    /// the end of the period holding `now_unix_ms` or later: what stays held until
    /// the boundary even if every call in flight completes with a usage of 0
    /// ([`crate::decision::period_is_spent`]). `None` for a limit without a period.
    /// The caller expired old holds first.
    pub fn settled_through_period_end(&self, now_unix_ms: u64) -> Option<u64> {
        let end_unix_ms = self.state.definition().period()?.end_unix_ms(now_unix_ms);
        let held = self.holds.units_from(end_unix_ms);
        // A restore may have dropped a hold its lease still names: never below 0.
        Some(held.saturating_sub(self.in_flight.units_from(end_unix_ms)))
    }

    /// True when the limit has a calendar period, whose holds are told apart as in
    /// flight or settled.
    pub fn has_period(&self) -> bool {
        self.state.definition().period().is_some()
    }

    /// Records that a call in flight holds `units` of this limit until
    /// `expires_at_unix_ms` (a grant, or a live lease restored); nothing for a
    /// limit without a period. The hold itself is made by [`Limit::hold`].
    pub fn hold_in_flight(&mut self, expires_at_unix_ms: u64, units: u64) {
        if self.has_period() && units > 0 {
            self.in_flight.hold(expires_at_unix_ms, units);
        }
    }

    /// Records that the call holding `units` until `expires_at_unix_ms` is no
    /// longer in flight (completed, or dropped without a Complete): what it still
    /// holds then counts as settled.
    pub fn settle_in_flight(&mut self, expires_at_unix_ms: u64, units: u64) {
        if units > 0 {
            // Up to: a hold granted before the definition gave the period was
            // never recorded as in flight.
            self.in_flight.release_up_to(expires_at_unix_ms, units);
        }
    }

    /// Forgets every hold that ended at or before `now_unix_ms`; a bucket adds
    /// the refills of the slot boundaries passed since it last did (an instant
    /// earlier than that, from a caller that waited for the lock, adds nothing).
    pub fn expire(&mut self, now_unix_ms: u64) {
        match self.bucket.as_mut() {
            Some(bucket) => {
                let boundary = bucket.shape.boundary_at(now_unix_ms);
                if boundary > bucket.boundary {
                    bucket.level = bucket.shape.level_after_refill(bucket.level, bucket.boundary, boundary);
                    bucket.boundary = boundary;
                }
            }
            None => {
                self.holds.expire(now_unix_ms);
                self.in_flight.expire(now_unix_ms);
            }
        }
    }

    /// True when `units` more fit now and can be recorded until `expires_at_unix_ms`.
    /// The caller expired old holds first.
    pub fn fits(&self, units: u64, expires_at_unix_ms: u64) -> bool {
        // Compared as free room, not as `in_use + units`: with capacities and
        // amounts near u64::MAX (an actual of u64::MAX, say) the sum would wrap.
        match &self.bucket {
            Some(bucket) => units <= bucket.level,
            None => units <= self.free() && self.holds.can_hold(expires_at_unix_ms),
        }
    }

    /// Units that may still be held: capacity minus usage, never below 0; a
    /// bucket's level.
    fn free(&self) -> u64 {
        match &self.bucket {
            Some(bucket) => bucket.level,
            None => self.capacity().saturating_sub(self.holds.in_use()),
        }
    }

    /// Holds `units` until `expires_at_unix_ms`, or takes them from a bucket; the
    /// caller checked [`Limit::fits`].
    pub fn hold(&mut self, expires_at_unix_ms: u64, units: u64) {
        match self.bucket.as_mut() {
            Some(bucket) => {
                assert!(units <= bucket.level, "the caller checked that the units fit");
                bucket.level -= units;
            }
            None => self.holds.hold(expires_at_unix_ms, units),
        }
    }

    /// Gives back `units` of the hold ending at `expires_at_unix_ms` (nothing if
    /// it ended); a bucket takes them back at once, up to its burst (the caller
    /// checked that the hold's window is not over).
    pub fn release(&mut self, expires_at_unix_ms: u64, units: u64) {
        match self.bucket.as_mut() {
            Some(bucket) => bucket.level = bucket.shape.level_after_refund(bucket.level, units),
            None => self.holds.release(expires_at_unix_ms, units),
        }
    }

    /// Units held now, as of the last [`Limit::expire`]; for a bucket, what it
    /// lacks of its burst.
    pub fn in_use(&self) -> u64 {
        match &self.bucket {
            Some(bucket) => bucket.shape.burst() - bucket.level,
            None => self.holds.in_use(),
        }
    }

    /// Every hold as (expiry instant, units), earliest first, as of the last
    /// [`Limit::expire`]: what a snapshot saves.
    pub fn holds(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.holds.buckets()
    }

    /// Can `units` be held until `expires_at_unix_ms` whatever the capacity?
    /// A restore puts back what was held, so only the instant bound applies.
    pub fn can_hold(&self, expires_at_unix_ms: u64) -> bool {
        self.holds.can_hold(expires_at_unix_ms)
    }

    /// The recorded debt.
    pub fn debt(&self) -> u64 {
        self.debt
    }

    /// Adds overage to the debt (saturating: debt is a report, not a balance).
    pub fn add_debt(&mut self, units: u64) {
        self.debt = self.debt.saturating_add(units);
    }

    /// Until when the limit refuses every reservation because it owes (0: it
    /// never owed), as a snapshot saves it.
    pub fn owed_until_unix_ms(&self) -> u64 {
        self.owed_until_unix_ms
    }

    /// Records that usage the limit could not hold belongs to a window or
    /// period ending at `until_unix_ms`: under `overage: owe` it refuses every
    /// reservation until then (the latest such end wins); nothing otherwise.
    pub fn owe_until(&mut self, until_unix_ms: u64) {
        if self.state.definition().overage().refuses_while_owing() {
            self.owed_until_unix_ms = self.owed_until_unix_ms.max(until_unix_ms);
        }
    }

    /// Whether the limit refuses every reservation at `now_unix_ms` because it
    /// owes ([`Limit::owe_until`]). A limit changed to another overage policy
    /// since no longer refuses.
    pub fn owes(&self, now_unix_ms: u64) -> bool {
        self.state.definition().overage().refuses_while_owing() && now_unix_ms < self.owed_until_unix_ms
    }

    /// The exact time until `units` fit, from the holds' expiry instants: the
    /// rolling hint; a bucket's, from its refills. At least 1 ms, since a denial
    /// means not now.
    pub fn exact_wait_ms(&self, now_unix_ms: u64, units: u64) -> u64 {
        if let Some(bucket) = &self.bucket {
            let wait_ms = (bucket.shape)
                .wait_ms(bucket.level, bucket.boundary, units, now_unix_ms)
                .expect("the standing denial refused units above the burst");
            return wait_ms.max(1);
        }
        let free = self.free();
        let wait_ms = if units > free {
            let must_expire = units - free;
            self.holds
                .ms_until_released(now_unix_ms, must_expire)
                .expect("units <= capacity, so enough expiring holds exist")
        } else {
            // The units fit but the key has no room for another expiry instant.
            let first = self.holds.first_expiry_unix_ms().expect("a full queue is not empty");
            first.saturating_sub(now_unix_ms)
        };
        wait_ms.max(1)
    }

    /// Milliseconds from `now_unix_ms` until some held unit comes back, as of
    /// the last [`Limit::expire`]: the earliest hold's end, or a bucket's next
    /// refill. `None` when nothing is held (a full bucket).
    pub fn next_release_ms(&self, now_unix_ms: u64) -> Option<u64> {
        match &self.bucket {
            Some(bucket) if bucket.level < bucket.shape.burst() => {
                (bucket.shape).wait_ms(bucket.level, bucket.boundary, bucket.level + 1, now_unix_ms)
            }
            Some(_) => None,
            None => (self.holds.first_expiry_unix_ms()).map(|at| at.saturating_sub(now_unix_ms)),
        }
    }

    /// The denial streak, as a snapshot saves it.
    pub fn streak(&self) -> Streak {
        self.streak
    }

    /// The denial streak, for the concurrency backoff.
    pub fn streak_mut(&mut self) -> &mut Streak {
        &mut self.streak
    }

    /// What a new reservation can take at `now_unix_ms`, as of the last
    /// [`Limit::expire`]: what [`Limit::report`] would say is available.
    pub fn available(&self, now_unix_ms: u64) -> u64 {
        available_of(
            self.state.definition().capacity(),
            self.in_use(),
            self.owes(now_unix_ms),
        )
    }

    /// State, usage and debt at `now_unix_ms`, as of the last [`Limit::expire`].
    pub fn report(&self, now_unix_ms: u64) -> LimitReport {
        LimitReport {
            state: self.state.clone(),
            in_use: self.in_use(),
            debt: self.debt,
            owing: self.owes(now_unix_ms),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::definition::LimitDefinition;
    use crate::model::key::LimitKey;

    fn limit(capacity: u64) -> Limit {
        let definition = LimitDefinition::rolling(LimitKey::new("k").unwrap(), capacity, 60).unwrap();
        Limit::new(LimitState::active(definition), 50).unwrap()
    }

    #[test]
    fn amounts_near_u64_max_do_not_wrap() {
        let mut huge = limit(u64::MAX);
        huge.hold(60_000, u64::MAX - 1);
        assert!(!huge.fits(2, 60_000), "u64::MAX - 1 + 2 wraps to 0");
        assert!(huge.fits(1, 60_000));
        assert_eq!(huge.exact_wait_ms(0, u64::MAX), 60_000);
        let mut small = limit(100);
        small.hold(60_000, 20);
        assert!(!small.fits(u64::MAX - 10, 60_000), "20 + u64::MAX - 10 wraps to 9");
        assert!(small.fits(80, 60_000) && !small.fits(81, 60_000));
    }

    #[test]
    fn the_next_release_is_the_first_hold_end_or_the_next_refill() {
        let mut rolling = limit(100);
        assert_eq!(rolling.next_release_ms(0), None, "nothing held");
        rolling.hold(60_000, 5);
        rolling.hold(30_000, 5);
        assert_eq!(rolling.next_release_ms(10_000), Some(20_000));
        rolling.expire(30_000);
        assert_eq!(rolling.next_release_ms(30_000), Some(30_000));
        let definition = LimitDefinition::bucket(LimitKey::new("b").unwrap(), 60, 60).unwrap();
        let mut bucket = Limit::new(LimitState::active(definition), 50).unwrap();
        assert_eq!(bucket.next_release_ms(0), None, "a full bucket holds nothing");
        bucket.expire(0);
        bucket.hold(0, 1);
        let wait_ms = bucket.next_release_ms(0).expect("one unit out");
        assert!(wait_ms > 0 && wait_ms <= 60_000, "{wait_ms}");
    }
}
