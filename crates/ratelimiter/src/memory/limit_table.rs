//! Every limit of the memory backend and the decisions that touch limits:
//! resolving keys, checking and granting requirements all or nothing,
//! releasing and reconciling holds. One instance lives behind the backend's
//! limits mutex; lease bookkeeping lives in the lease shards, outside it.

use crate::definition::{LimitKind, LimitReport, LimitState, Overage};
use crate::error::LimiterError;
use crate::key::LimitKey;
use crate::retry::{Jitter, RetryPolicy};
use crate::wire::{CompleteRequest, Denial, ReserveRequest, ACTUALS_MAX, REQUIREMENTS_MAX};

use super::config::MemoryConfig;
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

/// The limits and their usage.
#[derive(Debug)]
pub struct LimitTable {
    retry_policy: RetryPolicy,
    decrease_retry_ms: u64,
    index: FastMap<LimitKey, LimitIndex>,
    limits: Vec<Limit>,
    /// The longest window or timeout of any limit ever defined, plus
    /// [`LEASE_MEMORY_MARGIN_MS`]: how long denied and settled lease ids are remembered.
    retention_ms: u64,
    overage_dropped_total: u64,
    overage_debt_total: u64,
}

impl LimitTable {
    /// No limits yet.
    pub fn new(config: &MemoryConfig) -> Self {
        Self {
            retry_policy: config.retry_policy,
            decrease_retry_ms: config.decrease_retry_ms,
            index: FastMap::default(),
            limits: Vec::new(),
            retention_ms: LEASE_MEMORY_MARGIN_MS,
            overage_dropped_total: 0,
            overage_debt_total: 0,
        }
    }

    /// How long lease ids that stopped being live are remembered.
    pub fn retention_ms(&self) -> u64 {
        self.retention_ms
    }

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

    /// Denials that do not depend on usage: an amount above a whole capacity,
    /// then a key waiting for a decrease. Neither burns the lease id.
    pub fn standing_denial(&self, wanted: &Wanted) -> Option<Denial> {
        for &(i, amount) in wanted.as_slice() {
            let limit = &self.limits[i as usize];
            if amount > limit.capacity() {
                let key = limit.state().definition().key().clone();
                return Some(Denial::ExceedsCapacity { key });
            }
        }
        let &(i, _) = wanted
            .as_slice()
            .iter()
            .find(|&&(i, _)| self.limits[i as usize].is_decreasing())?;
        Some(Denial::LimitDecreasing {
            key: self.limits[i as usize].state().definition().key().clone(),
            retry_after_ms: self.decrease_retry_ms,
        })
    }

    /// Grants every requirement at `now_unix_ms`, or none: the denial names the
    /// first key that does not fit, with the largest hint of all that do not.
    pub fn try_grant(&mut self, wanted: &Wanted, now_unix_ms: u64, jitter: &Jitter) -> Result<Granted, Denial> {
        for &(i, _) in wanted.as_slice() {
            self.limits[i as usize].expire(now_unix_ms);
        }
        if let Some(denial) = self.shortfall(wanted, now_unix_ms, jitter) {
            return Err(denial);
        }
        let mut holds = Granted::new();
        for &(i, amount) in wanted.as_slice() {
            let limit = &mut self.limits[i as usize];
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

    /// `None` when every requirement fits; else the denial naming the first key
    /// that does not, with the largest hint of all the keys that do not.
    fn shortfall(&mut self, wanted: &Wanted, now_unix_ms: u64, jitter: &Jitter) -> Option<Denial> {
        let mut first = None;
        let mut retry_after_ms = 0;
        for &(i, amount) in wanted.as_slice() {
            let limit = &self.limits[i as usize];
            if limit.fits(amount, limit.hold_until(now_unix_ms)) {
                continue;
            }
            first.get_or_insert(i);
            let hint_ms = hint_ms(
                &self.retry_policy,
                &mut self.limits[i as usize],
                amount,
                now_unix_ms,
                jitter,
            );
            retry_after_ms = retry_after_ms.max(hint_ms);
        }
        let key = self.limits[first? as usize].state().definition().key().clone();
        Some(Denial::InsufficientCapacity { key, retry_after_ms })
    }

    /// Completes `lease`: checks every actual first (a key the lease did not
    /// reserve, or a concurrency key, is an invalid request that changes
    /// nothing), then releases the concurrency holds and reconciles the rolling
    /// ones.
    pub fn settle_lease(
        &mut self,
        lease: &LiveLease,
        request: &CompleteRequest,
        now_unix_ms: u64,
    ) -> Result<(), LimiterError> {
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
            if self.limits[hold.limit as usize].kind() == LimitKind::Concurrency {
                return Err(LimiterError::InvalidRequest(format!(
                    "actual for concurrency limit {}: concurrency is released on complete, not reconciled",
                    actual.key
                )));
            }
            actuals.push((*hold, actual.actual_amount));
        }
        for hold in lease.holds() {
            let limit = &mut self.limits[hold.limit as usize];
            limit.expire(now_unix_ms);
            if limit.kind() == LimitKind::Concurrency {
                limit.release(hold.expires_at_unix_ms, hold.amount);
            }
        }
        for (hold, actual) in actuals.as_slice() {
            self.reconcile(hold, *actual, now_unix_ms);
        }
        Ok(())
    }

    /// Shrinks a rolling hold to `actual` for the rest of its window, or holds
    /// the overage for the rest of the window when it fits; else the overage
    /// becomes debt or is dropped. A window already over has no rest to hold in.
    fn reconcile(&mut self, hold: &LeaseHold, actual: u64, now_unix_ms: u64) {
        let limit = &mut self.limits[hold.limit as usize];
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
                self.overage_debt_total = self.overage_debt_total.saturating_add(extra);
            }
            Overage::None => self.overage_dropped_total = self.overage_dropped_total.saturating_add(extra),
        }
    }

    /// Creates the limit of `state` or replaces its state; holds carry over.
    pub fn apply_state(&mut self, state: &LimitState) -> Result<(), LimiterError> {
        let definition = state.definition();
        match self.index.get(definition.key()) {
            Some(&i) => {
                let limit = &mut self.limits[i as usize];
                if limit.kind() != definition.kind() {
                    return Err(LimiterError::Conflict(format!(
                        "limit {} is {:?}; its kind cannot change to {:?}",
                        definition.key(),
                        limit.kind(),
                        definition.kind()
                    )));
                }
                limit.set_state(state.clone());
            }
            None => {
                if self.limits.len() >= LIMITS_MAX {
                    return Err(LimiterError::InvalidRequest(format!(
                        "the memory backend holds at most {LIMITS_MAX} limits"
                    )));
                }
                let i = LimitIndex::try_from(self.limits.len()).expect("LIMITS_MAX fits u32");
                self.limits.push(Limit::new(state.clone()));
                self.index.insert(definition.key().clone(), i);
            }
        }
        self.retention_ms = self.retention_ms.max(definition.hold_ms() + LEASE_MEMORY_MARGIN_MS);
        Ok(())
    }

    /// The report of `key`, after dropping its ended holds.
    pub fn limit_report(&mut self, key: &LimitKey, now_unix_ms: u64) -> Option<LimitReport> {
        let &i = self.index.get(key)?;
        let limit = &mut self.limits[i as usize];
        limit.expire(now_unix_ms);
        Some(limit.report())
    }

    /// Every report, ordered by key.
    pub fn limit_reports(&mut self, now_unix_ms: u64) -> Vec<LimitReport> {
        let mut reports: Vec<LimitReport> = self
            .limits
            .iter_mut()
            .map(|limit| {
                limit.expire(now_unix_ms);
                limit.report()
            })
            .collect();
        reports.sort_unstable_by(|a, b| a.state.definition().key().cmp(b.state.definition().key()));
        reports
    }

    /// Applies every decrease whose key now has the room (`capacity - in_use >=
    /// capacity - target`), returning the new states.
    pub fn apply_pending_decreases(&mut self, now_unix_ms: u64) -> Vec<LimitState> {
        let mut changed = Vec::new();
        for limit in self.limits.iter_mut().filter(|l| l.is_decreasing()) {
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

    /// Units of overage dropped (`overage: none`) and recorded as debt.
    pub fn overage_totals(&self) -> (u64, u64) {
        (self.overage_dropped_total, self.overage_debt_total)
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

/// `wanted` sorted by limit, so requirement lists compare as sets.
pub fn sorted(wanted: &Wanted) -> Wanted {
    let mut sorted = *wanted;
    sorted.as_mut_slice().sort_unstable_by_key(|&(i, _)| i);
    sorted
}
