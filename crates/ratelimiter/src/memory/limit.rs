//! One limit's live state in the memory backend: its admin state, held units,
//! debt and denial streak.

use crate::definition::{LimitKind, LimitReport, LimitState, LimitStatus};
use crate::retry::Streak;

use super::expiry_queue::ExpiryQueue;

/// A defined limit with what it holds now.
#[derive(Debug)]
pub struct Limit {
    state: LimitState,
    holds: ExpiryQueue,
    debt: u64,
    streak: Streak,
}

impl Limit {
    /// A limit in `state` holding nothing.
    pub fn new(state: LimitState) -> Self {
        Self {
            state,
            holds: ExpiryQueue::default(),
            debt: 0,
            streak: Streak::default(),
        }
    }

    /// The admin state.
    pub fn state(&self) -> &LimitState {
        &self.state
    }

    /// Replaces the admin state; holds, debt and streak carry over. The caller
    /// checked that the kind is unchanged.
    pub fn set_state(&mut self, state: LimitState) {
        assert_eq!(state.definition().kind(), self.kind(), "a limit's kind never changes");
        self.state = state;
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
        now_unix_ms + self.state.definition().hold_with_margin_ms(default_margin_ms)
    }

    /// Forgets every hold that ended at or before `now_unix_ms`.
    pub fn expire(&mut self, now_unix_ms: u64) {
        self.holds.expire(now_unix_ms);
    }

    /// True when `units` more fit now and can be recorded until `expires_at_unix_ms`.
    /// The caller expired old holds first.
    pub fn fits(&self, units: u64, expires_at_unix_ms: u64) -> bool {
        // Compared as free room, not as `in_use + units`: with capacities and
        // amounts near u64::MAX (an actual of u64::MAX, say) the sum would wrap.
        units <= self.free() && self.holds.can_hold(expires_at_unix_ms)
    }

    /// Units that may still be held: capacity minus usage, never below 0.
    fn free(&self) -> u64 {
        self.capacity().saturating_sub(self.holds.in_use())
    }

    /// Holds `units` until `expires_at_unix_ms`; the caller checked [`Limit::fits`].
    pub fn hold(&mut self, expires_at_unix_ms: u64, units: u64) {
        self.holds.hold(expires_at_unix_ms, units);
    }

    /// Gives back `units` of the hold ending at `expires_at_unix_ms` (nothing if it ended).
    pub fn release(&mut self, expires_at_unix_ms: u64, units: u64) {
        self.holds.release(expires_at_unix_ms, units);
    }

    /// Units held now, as of the last [`Limit::expire`].
    pub fn in_use(&self) -> u64 {
        self.holds.in_use()
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

    /// The exact time until `units` fit, from the holds' expiry instants: the
    /// rolling hint. At least 1 ms, since a denial means not now.
    pub fn exact_wait_ms(&self, now_unix_ms: u64, units: u64) -> u64 {
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

    /// The denial streak, as a snapshot saves it.
    pub fn streak(&self) -> Streak {
        self.streak
    }

    /// The denial streak, for the concurrency backoff.
    pub fn streak_mut(&mut self) -> &mut Streak {
        &mut self.streak
    }

    /// State, usage and debt, as of the last [`Limit::expire`].
    pub fn report(&self) -> LimitReport {
        LimitReport {
            state: self.state.clone(),
            in_use: self.holds.in_use(),
            debt: self.debt,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::definition::LimitDefinition;
    use crate::key::LimitKey;

    fn limit(capacity: u64) -> Limit {
        let definition = LimitDefinition::rolling(LimitKey::new("k").unwrap(), capacity, 60).unwrap();
        Limit::new(LimitState::active(definition))
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
}
