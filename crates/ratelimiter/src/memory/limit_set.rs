//! Every limit of the memory backend, each behind its own mutex, and the
//! decisions that touch limits: resolving keys, checking and granting
//! requirements all or nothing, releasing and reconciling holds.
//!
//! The set itself sits behind a read-write lock that is written only to add a
//! limit. A call locks the limits it needs in ascending index order (so two
//! calls never wait on each other in a cycle), decides with all of them held
//! (so all-or-nothing stays atomic), and calls on disjoint keys never meet.

use std::sync::{Mutex, MutexGuard};

use crate::definition::{LimitKind, LimitReport, LimitState, Overage};
use crate::error::LimiterError;
use crate::key::LimitKey;
use crate::retry::{Jitter, RetryPolicy};
use crate::wire::{CompleteRequest, Denial, ReserveRequest, ACTUALS_MAX, REQUIREMENTS_MAX};

use super::lease_table::{LeaseHold, LimitIndex, LiveLease};
use super::limit::Limit;
use super::stack_vec::StackVec;
use super::FastMap;

/// The most limits one memory backend defines: indices are `u32`, and a
/// deployment has a few per model and tenant, far fewer than this.
pub const LIMITS_MAX: usize = 1 << 20;
/// How much longer than the longest window or timeout denied and settled lease
/// ids are remembered: a caller that waited out a window-long hint and retries
/// with the same id is still answered as TigerBeetle (which never forgets) would.
pub const LEASE_MEMORY_MARGIN_MS: u64 = 60_000;

/// A request's requirements resolved to limits, in request order.
pub type Wanted = StackVec<(LimitIndex, u64), REQUIREMENTS_MAX>;
/// The holds of a granted request, sorted by limit.
pub type Granted = StackVec<LeaseHold, REQUIREMENTS_MAX>;

/// Units of overage a Complete dropped (`overage: none`) and recorded as debt.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OverageUnits {
    /// Dropped.
    pub dropped: u64,
    /// Recorded as debt.
    pub debt: u64,
}

/// The limits, by index, and the key index.
#[derive(Debug, Default)]
pub struct LimitSet {
    index: FastMap<LimitKey, LimitIndex>,
    /// Kinds never change, so they are readable without the limit's lock.
    kinds: Vec<LimitKind>,
    limits: Vec<Mutex<Limit>>,
}

/// Locks `mutex`. A panic under a lock is a bug that already failed loudly;
/// state is only mutated after every check passed, so it stays usable.
pub fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl LimitSet {
    /// The request's requirements as limits, or the first unknown key.
    pub fn resolve(&self, request: &ReserveRequest) -> Result<Wanted, LimiterError> {
        let mut wanted = Wanted::new();
        for r in request.requirements() {
            let &i = self
                .index
                .get(&r.key)
                .ok_or_else(|| LimiterError::UnknownKey(r.key.clone()))?;
            wanted.push((i, r.amount));
        }
        Ok(wanted)
    }

    /// Locks the limits of `ascending` (strictly ascending indices).
    pub fn lock_all(&self, ascending: impl Iterator<Item = LimitIndex>) -> LockedLimits<'_> {
        let mut locked = LockedLimits {
            indices: StackVec::new(),
            guards: Vec::with_capacity(4),
        };
        for i in ascending {
            assert!(
                locked.indices.as_slice().last().is_none_or(|&last| last < i),
                "limits are locked in ascending order"
            );
            locked.indices.push(i);
            locked.guards.push(lock(&self.limits[i as usize]));
        }
        locked
    }

    /// Completes `lease`: checks every actual first (a key the lease did not
    /// reserve, or a concurrency key, is an invalid request that changes
    /// nothing), then releases the concurrency holds and reconciles the rolling
    /// ones.
    pub fn settle_lease(
        &self,
        lease: &LiveLease,
        request: &CompleteRequest,
        now_unix_ms: u64,
    ) -> Result<OverageUnits, LimiterError> {
        let mut actuals = StackVec::<(LeaseHold, u64), ACTUALS_MAX>::new();
        for actual in request.actuals() {
            let hold = self
                .index
                .get(&actual.key)
                .and_then(|&i| lease.hold(i))
                .ok_or_else(|| {
                    LimiterError::InvalidRequest(format!(
                        "actual for {}, which lease {} did not reserve",
                        actual.key,
                        request.lease_id()
                    ))
                })?;
            if self.kinds[hold.limit as usize] == LimitKind::Concurrency {
                return Err(LimiterError::InvalidRequest(format!(
                    "actual for concurrency limit {}: concurrency is released on complete, not reconciled",
                    actual.key
                )));
            }
            actuals.push((*hold, actual.actual_amount));
        }
        let mut locked = self.lock_all(lease.holds().iter().map(|h| h.limit));
        for hold in lease.holds() {
            let limit = locked.get(hold.limit);
            limit.expire(now_unix_ms);
            if limit.kind() == LimitKind::Concurrency {
                limit.release(hold.expires_at_unix_ms, hold.amount);
            }
        }
        let mut overage = OverageUnits::default();
        for (hold, actual) in actuals.as_slice() {
            reconcile(locked.get(hold.limit), hold, *actual, now_unix_ms, &mut overage);
        }
        Ok(overage)
    }

    /// Creates the limit of `state` (the caller holds the write lock and checked
    /// the key is new).
    pub fn insert(&mut self, state: &LimitState) -> Result<(), LimiterError> {
        if self.limits.len() >= LIMITS_MAX {
            return Err(LimiterError::InvalidRequest(format!(
                "the memory backend holds at most {LIMITS_MAX} limits"
            )));
        }
        let i = LimitIndex::try_from(self.limits.len()).expect("LIMITS_MAX fits u32");
        self.kinds.push(state.definition().kind());
        self.limits.push(Mutex::new(Limit::new(state.clone())));
        self.index.insert(state.definition().key().clone(), i);
        Ok(())
    }

    /// Replaces the state of an existing limit; `Ok(false)` when the key is new.
    pub fn update(&self, state: &LimitState) -> Result<bool, LimiterError> {
        let definition = state.definition();
        let Some(&i) = self.index.get(definition.key()) else {
            return Ok(false);
        };
        let mut limit = lock(&self.limits[i as usize]);
        if limit.kind() != definition.kind() {
            return Err(LimiterError::Conflict(format!(
                "limit {} is {:?}; its kind cannot change to {:?}",
                definition.key(),
                limit.kind(),
                definition.kind()
            )));
        }
        limit.set_state(state.clone());
        Ok(true)
    }

    /// The report of `key`, after dropping its ended holds.
    pub fn limit_report(&self, key: &LimitKey, now_unix_ms: u64) -> Option<LimitReport> {
        let &i = self.index.get(key)?;
        let mut limit = lock(&self.limits[i as usize]);
        limit.expire(now_unix_ms);
        Some(limit.report())
    }

    /// Every report, ordered by key (each limit locked in turn).
    pub fn limit_reports(&self, now_unix_ms: u64) -> Vec<LimitReport> {
        let mut reports: Vec<LimitReport> = self
            .limits
            .iter()
            .map(|limit| {
                let mut limit = lock(limit);
                limit.expire(now_unix_ms);
                limit.report()
            })
            .collect();
        reports.sort_unstable_by(|a, b| a.state.definition().key().cmp(b.state.definition().key()));
        reports
    }

    /// Applies every decrease whose key now has the room (`capacity - in_use >=
    /// capacity - target`), returning the new states.
    pub fn apply_pending_decreases(&self, now_unix_ms: u64) -> Vec<LimitState> {
        let mut changed = Vec::new();
        for limit in &self.limits {
            let mut limit = lock(limit);
            if !limit.is_decreasing() {
                continue;
            }
            limit.expire(now_unix_ms);
            let delta = limit.capacity() - limit.state().pending_decrease_to();
            if limit.capacity().saturating_sub(limit.in_use()) >= delta {
                let next = limit.state().with_decrease_applied();
                limit.set_state(next.clone());
                changed.push(next);
            }
        }
        changed
    }
}

/// The limits one call holds locked.
pub struct LockedLimits<'a> {
    /// Ascending.
    indices: StackVec<LimitIndex, REQUIREMENTS_MAX>,
    guards: Vec<MutexGuard<'a, Limit>>,
}

impl LockedLimits<'_> {
    /// The locked limit `i`; locking it was the caller's promise.
    pub fn get(&mut self, i: LimitIndex) -> &mut Limit {
        let at = self.indices.as_slice().binary_search(&i).expect("limit not locked");
        &mut self.guards[at]
    }

    /// Denials that do not depend on usage: an amount above a whole capacity,
    /// then a key waiting for a decrease. Neither burns the lease id.
    pub fn standing_denial(&mut self, wanted: &Wanted, decrease_retry_ms: u64) -> Option<Denial> {
        for &(i, amount) in wanted.as_slice() {
            let limit = self.get(i);
            if amount > limit.capacity() {
                let key = limit.state().definition().key().clone();
                return Some(Denial::ExceedsCapacity { key });
            }
        }
        for &(i, _) in wanted.as_slice() {
            let limit = self.get(i);
            if limit.is_decreasing() {
                let key = limit.state().definition().key().clone();
                let retry_after_ms = decrease_retry_ms;
                return Some(Denial::LimitDecreasing { key, retry_after_ms });
            }
        }
        None
    }

    /// Grants every requirement at `now_unix_ms`, or none: the denial names the
    /// first key that does not fit, with the largest hint of all that do not.
    pub fn try_grant(
        &mut self,
        wanted: &Wanted,
        now_unix_ms: u64,
        policy: &RetryPolicy,
        jitter: &Jitter,
    ) -> Result<Granted, Denial> {
        for &(i, _) in wanted.as_slice() {
            self.get(i).expire(now_unix_ms);
        }
        if let Some(denial) = self.shortfall(wanted, now_unix_ms, policy, jitter) {
            return Err(denial);
        }
        let mut holds = Granted::new();
        for &(i, amount) in wanted.as_slice() {
            let limit = self.get(i);
            let expires_at_unix_ms = limit.hold_until(now_unix_ms);
            limit.hold(expires_at_unix_ms, amount);
            if limit.kind() == LimitKind::Concurrency {
                limit.streak_mut().record_allow(now_unix_ms);
            }
            holds.push(LeaseHold {
                limit: i,
                amount,
                expires_at_unix_ms,
            });
        }
        holds.as_mut_slice().sort_unstable_by_key(|h| h.limit);
        Ok(holds)
    }

    fn shortfall(
        &mut self,
        wanted: &Wanted,
        now_unix_ms: u64,
        policy: &RetryPolicy,
        jitter: &Jitter,
    ) -> Option<Denial> {
        let mut first = None;
        let mut retry_after_ms = 0;
        for &(i, amount) in wanted.as_slice() {
            let limit = self.get(i);
            if limit.fits(amount, limit.hold_until(now_unix_ms)) {
                continue;
            }
            first.get_or_insert(i);
            retry_after_ms = retry_after_ms.max(hint_ms(policy, limit, amount, now_unix_ms, jitter));
        }
        let key = self.get(first?).state().definition().key().clone();
        Some(Denial::InsufficientCapacity { key, retry_after_ms })
    }
}

/// Shrinks a rolling hold to `actual` for the rest of its window, or holds the
/// overage for the rest of the window when it fits; else the overage becomes
/// debt or is dropped. A window already over has no rest to hold in.
fn reconcile(limit: &mut Limit, hold: &LeaseHold, actual: u64, now_unix_ms: u64, overage: &mut OverageUnits) {
    if actual <= hold.amount {
        limit.release(hold.expires_at_unix_ms, hold.amount - actual);
        return;
    }
    let extra = actual - hold.amount;
    if hold.expires_at_unix_ms > now_unix_ms && limit.fits(extra, hold.expires_at_unix_ms) {
        limit.hold(hold.expires_at_unix_ms, extra);
        return;
    }
    match limit.state().definition().overage() {
        Overage::Debt => {
            limit.add_debt(extra);
            overage.debt = overage.debt.saturating_add(extra);
        }
        Overage::None => overage.dropped = overage.dropped.saturating_add(extra),
    }
}

/// The hint for one failing requirement: exact for rolling limits (the time
/// until enough units expire), ADR 0010 backoff for concurrency limits, whose
/// holds usually end at Complete, long before their timeout. Jitter is added.
fn hint_ms(policy: &RetryPolicy, limit: &mut Limit, amount: u64, now_unix_ms: u64, jitter: &Jitter) -> u64 {
    let kind = limit.kind();
    let base_ms = match kind {
        LimitKind::Rolling => limit.exact_wait_ms(now_unix_ms, amount),
        LimitKind::Concurrency => {
            let streak = limit.streak_mut().record_deny(now_unix_ms);
            policy
                .concurrency
                .backoff_ms(limit.state().definition().hold_ms(), streak)
        }
    };
    base_ms + jitter.sample_ms(policy.jitter_ms(kind))
}

/// `wanted` sorted by limit, so requirement lists compare as sets and limits
/// are locked in order.
pub fn sorted(wanted: &Wanted) -> Wanted {
    let mut sorted = *wanted;
    sorted.as_mut_slice().sort_unstable_by_key(|&(i, _)| i);
    sorted
}
