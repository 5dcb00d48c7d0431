//! Everything the memory backend holds, and the reserve and complete decisions.
//! One instance lives behind the backend's mutex; every method runs at one
//! instant `now_unix_ms`, read just before the mutex is taken, so two callers
//! may arrive with instants out of order by as long as one waited for the
//! mutex. Nothing here assumes more than that time never goes back by a whole
//! window (at least 1 s): a hold that expires before the newest one is inserted
//! in place.

use std::hash::{BuildHasher, Hasher};

use crate::model::decision::{self, OverageFallback, Reconcile};
use crate::model::definition::{DefinitionError, LimitKind, LimitReport, LimitState};
use crate::model::error::LimiterError;
use crate::model::key::LimitKey;
use crate::model::retry::{Jitter, RetryPolicy};
use crate::model::wire::{CompleteRequest, Denial, ReserveOutcome, ReserveRequest, ACTUALS_MAX, REQUIREMENTS_MAX};

use super::config::MemoryConfig;
use super::counters::MemoryCounters;
use super::fast_map::FastMap;
use super::lease_table::{Crowded, LeaseHold, LeaseTable, LimitIndex, LiveLease};
use super::limit::Limit;
use super::settled_leases::{SettledLease, SettledLeases};
use super::stack_vec::StackVec;
use crate::base::recent_ids::RecentIds;

/// The most limits one memory backend defines: indices are `u32`; a
/// deployment has a few per model and tenant, and a directory of a million
/// keys (`directory::KEYS_MAX`) up to eight per key (its rpm, daily tokens,
/// concurrency and budgets), within this.
pub const LIMITS_MAX: usize = 1 << 23;
/// How much longer than the longest window or timeout denied and settled lease
/// ids are remembered: a caller that waited out a window-long hint and retries
/// with the same id is still answered as TigerBeetle (which never forgets) would.
pub const LEASE_MEMORY_MARGIN_MS: u64 = 60_000;
/// The hint of a reserve refused for want of room in the lease table: the
/// caller's leases end as its calls complete, typically within a second or two.
pub const TOO_MANY_LEASES_RETRY_MS: u64 = 1_000;
/// How often, at most, the lease table's pressure (leases dropped, reserves
/// refused) is logged: a flood of refusals costs one line per interval.
const PRESSURE_LOG_INTERVAL_MS: u64 = 10_000;

/// The memory backend's data. The fields the snapshot reads and restores
/// (`snapshot.rs`) are visible to the memory module.
#[derive(Debug)]
pub struct MemoryState {
    config: MemoryConfig,
    pub(super) index: FastMap<LimitKey, LimitIndex>,
    pub(super) limits: Vec<Limit>,
    pub(super) leases: LeaseTable,
    pub(super) settled: SettledLeases,
    pub(super) failed: RecentIds<()>,
    /// The secret of the fingerprints of settled leases' requirements: 64-bit
    /// keyed hashes, so a retry with other requirements is told apart unless
    /// it collides, with odds of 2^-64 for a caller already misusing the id.
    /// Random per process, and saved in a snapshot so that a restored process
    /// computes the same fingerprints.
    pub(super) fingerprint_seed: u64,
    fingerprints: foldhash::quality::SeedableRandomState,
    /// Per limit index, a stable 64-bit hash of its key, which fingerprints
    /// hash instead of the index: indices depend on the order limits were
    /// defined in, which a restart changes, and fingerprints must survive one.
    fingerprint_tags: Vec<u64>,
    /// The longest window or timeout of any limit ever defined, plus
    /// [`LEASE_MEMORY_MARGIN_MS`]: how long denied and settled lease ids are remembered.
    pub(super) retention_ms: u64,
    overage_dropped_total: u64,
    overage_debt_total: u64,
    leases_evicted_total: u64,
    leases_refused_total: u64,
    /// When the table's pressure was last logged, and the counts logged then.
    pressure_logged: (u64, u64, u64),
}

/// A request's requirements resolved to limits, in request order.
type Wanted = StackVec<(LimitIndex, u64), REQUIREMENTS_MAX>;

impl MemoryState {
    /// An empty state; `config` was validated.
    pub fn new(config: MemoryConfig) -> Self {
        Self {
            leases: LeaseTable::new(config.leases_max, config.owner_leases_max()),
            settled: SettledLeases::new(config.settled_leases_max),
            failed: RecentIds::new(config.failed_leases_max),
            config,
            fingerprint_seed: 0,
            fingerprints: fingerprint_hasher(0),
            fingerprint_tags: Vec::new(),
            index: FastMap::default(),
            limits: Vec::new(),
            retention_ms: LEASE_MEMORY_MARGIN_MS,
            overage_dropped_total: 0,
            overage_debt_total: 0,
            leases_evicted_total: 0,
            leases_refused_total: 0,
            pressure_logged: (0, 0, 0),
        }
        .with_fingerprint_seed(rand::random())
    }

    /// The state with fingerprints keyed by `seed`: a restore takes the seed
    /// of the process that wrote the snapshot. Only before any lease settled.
    pub(super) fn with_fingerprint_seed(mut self, seed: u64) -> Self {
        self.set_fingerprint_seed(seed);
        self
    }

    /// Keys fingerprints by `seed`; the caller checked that nothing settled yet.
    pub(super) fn set_fingerprint_seed(&mut self, seed: u64) {
        assert_eq!(self.settled.len(), 0, "fingerprints re-keyed after leases settled");
        self.fingerprint_seed = seed;
        self.fingerprints = fingerprint_hasher(seed);
    }

    /// Reserve, in the order of the memory backend's contract: unknown key,
    /// idempotent replay or conflict, burnt lease id, never-fitting amount,
    /// decreasing key, then all requirements or none. `now_unix_ms` is now
    /// rounded down, `granted_unix_ms` rounded up: holds last from the latter.
    pub fn reserve(
        &mut self,
        request: &ReserveRequest,
        now_unix_ms: u64,
        granted_unix_ms: u64,
        jitter: &Jitter,
    ) -> Result<ReserveOutcome, LimiterError> {
        let wanted = self.resolve(request)?;
        self.forget_old(now_unix_ms);
        let id = request.lease_id().to_u128();
        if let Some(outcome) = self.replay(request, &wanted)? {
            return Ok(outcome);
        }
        if self.failed.get(id).is_some() {
            return Ok(ReserveOutcome::Denied(Denial::LeaseAlreadyFailed));
        }
        if let Some(denial) = self.standing_denial(&wanted) {
            return Ok(ReserveOutcome::Denied(denial));
        }
        for &(i, _) in wanted.as_slice() {
            self.limits[i as usize].expire(now_unix_ms);
        }
        let hold_ms = request.hold_ms();
        if let Some(denial) = self.shortfall(&wanted, now_unix_ms, granted_unix_ms, hold_ms, jitter) {
            self.failed.insert(id, now_unix_ms, ());
            return Ok(ReserveOutcome::Denied(denial));
        }
        let owner = request.owner().map(crate::model::owner::LeaseOwner::tag);
        self.make_room(owner, now_unix_ms)
            .map_err(|crowded| self.refuse(crowded, request, now_unix_ms))?;
        self.grant(id, owner, &wanted, now_unix_ms, granted_unix_ms, hold_ms);
        Ok(ReserveOutcome::Allowed {
            reserved_at_unix_ms: now_unix_ms,
        })
    }

    fn resolve(&self, request: &ReserveRequest) -> Result<Wanted, LimiterError> {
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

    fn forget_old(&mut self, now_unix_ms: u64) {
        self.failed.expire(now_unix_ms, self.retention_ms);
    }

    /// The answer to a lease id seen allowed before: the same grant again, or a
    /// conflict when the requirements differ.
    fn replay(&self, request: &ReserveRequest, wanted: &Wanted) -> Result<Option<ReserveOutcome>, LimiterError> {
        let id = request.lease_id().to_u128();
        let (reserved_at_unix_ms, same) = if let Some(lease) = self.leases.get(id) {
            let held = lease.holds().iter().map(|h| (h.limit, h.amount));
            (
                lease.reserved_at_unix_ms,
                held.eq(sorted(wanted).as_slice().iter().copied()),
            )
        } else if let Some(settled) = self.settled.get(id) {
            let fingerprint = self.fingerprint(sorted(wanted).as_slice().iter().copied());
            (settled.reserved_at_unix_ms, settled.fingerprint == fingerprint)
        } else {
            return Ok(None);
        };
        if !same {
            return Err(decision::lease_reused(request.lease_id()));
        }
        Ok(Some(ReserveOutcome::Allowed { reserved_at_unix_ms }))
    }

    /// Denials that do not depend on usage (the shared precedence of
    /// [`decision::standing_denial`]). Neither burns the lease id.
    fn standing_denial(&self, wanted: &Wanted) -> Option<Denial> {
        let requirements = wanted
            .as_slice()
            .iter()
            .map(|&(i, amount)| (self.limits[i as usize].state(), amount));
        decision::standing_denial(
            requirements,
            self.config.decrease_retry_ms,
            self.config.window_margin_ms,
        )
    }

    /// `None` when every requirement fits; else the denial naming the first key
    /// that does not, with the largest hint of all the keys that do not. A key with
    /// a calendar period whose period is spent (what completed calls settled leaves
    /// no room: [`decision::period_is_spent`]) is a final answer, which comes first.
    fn shortfall(
        &mut self,
        wanted: &Wanted,
        now_unix_ms: u64,
        granted_unix_ms: u64,
        hold_ms: Option<u64>,
        jitter: &Jitter,
    ) -> Option<Denial> {
        let mut first = None;
        let mut never = None;
        let mut retry_after_ms = 0;
        for &(i, amount) in wanted.as_slice() {
            let limit = &self.limits[i as usize];
            let owes = limit.owes(now_unix_ms);
            if !owes && limit.fits(amount, self.hold_end(limit, granted_unix_ms, hold_ms)) {
                continue;
            }
            // An owing limit with a calendar period owes until the period
            // ends: no retry can succeed before, as when its period is spent.
            let settled = limit.settled_through_period_end(now_unix_ms);
            let spent = settled.is_some_and(|settled| decision::period_is_spent(limit.capacity(), settled, amount));
            let spent = spent || (owes && limit.has_period());
            if never.is_none() && spent {
                never = Some(i);
            }
            first.get_or_insert(i);
            let hint_ms = hint_ms(
                &self.config.retry_policy,
                &mut self.limits[i as usize],
                amount,
                now_unix_ms,
                jitter,
            );
            retry_after_ms = retry_after_ms.max(hint_ms);
        }
        if let Some(i) = never {
            let key = self.limits[i as usize].state().definition().key().clone();
            return Some(decision::period_exhausted(key));
        }
        let key = self.limits[first? as usize].state().definition().key().clone();
        Some(Denial::InsufficientCapacity { key, retry_after_ms })
    }

    /// When a hold of `limit` granted at `granted_unix_ms` ends: after the
    /// request's own `hold_ms` when it gave one, else the definition's window
    /// plus margin or timeout.
    fn hold_end(&self, limit: &Limit, granted_unix_ms: u64, hold_ms: Option<u64>) -> u64 {
        match hold_ms {
            Some(hold_ms) => granted_unix_ms + hold_ms,
            None => limit.hold_until(granted_unix_ms, self.config.window_margin_ms),
        }
    }

    /// Makes room in the lease table for a lease of `owner`: while there is
    /// none, the lease whose holds all ended first goes (it holds nothing; it
    /// is remembered as settled, and counted). `Err` when no lease has ended:
    /// a lease in force is never pushed out.
    fn make_room(&mut self, owner: Option<u64>, now_unix_ms: u64) -> Result<(), Crowded> {
        while let Some(crowded) = self.leases.crowding(owner) {
            let Some((id, ended)) = self.leases.pop_ended(now_unix_ms) else {
                return Err(crowded);
            };
            self.leases_evicted_total += 1;
            self.settle(id, &ended, now_unix_ms);
        }
        self.log_pressure(now_unix_ms);
        Ok(())
    }

    /// The error of a reserve the table has no room for, counted and logged.
    fn refuse(&mut self, crowded: Crowded, request: &ReserveRequest, now_unix_ms: u64) -> LimiterError {
        self.leases_refused_total += 1;
        self.log_pressure(now_unix_ms);
        let message = match (crowded, request.owner()) {
            (Crowded::OwnerShare(held), Some(owner)) => format!(
                "{} holds {held} live leases, its share of the lease table ({}% of {}); complete some first",
                owner.name(),
                self.config.lease_share_percent,
                self.config.leases_max
            ),
            (Crowded::Full(live), _) | (Crowded::OwnerShare(live), None) => {
                format!("the lease table is full: its {live} leases are all in force; complete some first")
            }
        };
        LimiterError::TooManyLeases {
            retry_after_ms: TOO_MANY_LEASES_RETRY_MS,
            message,
        }
    }

    /// Logs the leases dropped and the reserves refused since the last line,
    /// at most once per [`PRESSURE_LOG_INTERVAL_MS`]. No lease id is logged.
    fn log_pressure(&mut self, now_unix_ms: u64) {
        let (logged_at_unix_ms, evicted, refused) = self.pressure_logged;
        let changed = (self.leases_evicted_total, self.leases_refused_total) != (evicted, refused);
        if !changed || now_unix_ms < logged_at_unix_ms.saturating_add(PRESSURE_LOG_INTERVAL_MS) {
            return;
        }
        tracing::warn!(
            ended_leases_dropped = self.leases_evicted_total - evicted,
            reserves_refused = self.leases_refused_total - refused,
            leases_live = self.leases.len(),
            leases_max = self.config.leases_max,
            "the lease table is crowded: leases whose holds ended were dropped, or reserves refused with \
             too_many_leases"
        );
        self.pressure_logged = (now_unix_ms, self.leases_evicted_total, self.leases_refused_total);
    }

    /// Counts a live lease a restore had no room for (a smaller
    /// `leases_max`): its holds stay until they end, unreconciled.
    pub(super) fn count_restore_eviction(&mut self, id: u128, lease: &LiveLease, now_unix_ms: u64) {
        self.leases_evicted_total += 1;
        // No Complete can reach it now: what it holds stays held, as settled.
        for hold in lease.holds() {
            (self.limits[hold.limit as usize]).settle_in_flight(hold.expires_at_unix_ms, hold.amount);
        }
        self.settle(id, lease, now_unix_ms);
    }

    fn grant(
        &mut self,
        id: u128,
        owner: Option<u64>,
        wanted: &Wanted,
        now_unix_ms: u64,
        granted_unix_ms: u64,
        hold_ms: Option<u64>,
    ) {
        let mut holds = StackVec::<LeaseHold, REQUIREMENTS_MAX>::new();
        for &(i, amount) in wanted.as_slice() {
            let expires_at_unix_ms = self.hold_end(&self.limits[i as usize], granted_unix_ms, hold_ms);
            let limit = &mut self.limits[i as usize];
            limit.hold(expires_at_unix_ms, amount);
            limit.hold_in_flight(expires_at_unix_ms, amount);
            if limit.kind() == LimitKind::Concurrency || limit.has_period() {
                limit.streak_mut().record_allow(now_unix_ms);
            }
            holds.push(LeaseHold {
                limit: i,
                amount,
                expires_at_unix_ms,
            });
        }
        holds.as_mut_slice().sort_unstable_by_key(|h| h.limit);
        self.leases
            .insert(id, LiveLease::new(now_unix_ms, holds.as_slice()), owner);
    }

    /// Remembers a lease that stopped being live, for idempotent retries: for
    /// at least `retention_ms` unless `settled_leases_max` forces it out.
    pub(super) fn settle(&mut self, id: u128, lease: &LiveLease, now_unix_ms: u64) {
        let settled = SettledLease {
            reserved_at_unix_ms: lease.reserved_at_unix_ms,
            fingerprint: self.fingerprint(lease.holds().iter().map(|h| (h.limit, h.amount))),
        };
        self.settled.insert(id, settled, now_unix_ms, self.retention_ms);
    }

    /// A keyed hash of a set of requirements: the sum of each one's keyed
    /// hash over its limit's key tag, not its index, so it is the same in a
    /// restored process, where indices and so their order differ.
    fn fingerprint(&self, sorted: impl Iterator<Item = (LimitIndex, u64)>) -> u64 {
        sorted.fold(0u64, |sum, (limit, amount)| {
            let mut hasher = self.fingerprints.build_hasher();
            hasher.write_u64(self.fingerprint_tags[limit as usize]);
            hasher.write_u64(amount);
            sum.wrapping_add(hasher.finish())
        })
    }

    /// Complete: releases the lease's concurrency holds and reconciles its
    /// rolling holds with `actuals`. Every actual is checked before anything
    /// changes; an unknown or settled lease changes nothing.
    pub fn complete(&mut self, request: &CompleteRequest, now_unix_ms: u64) -> Result<(), LimiterError> {
        self.forget_old(now_unix_ms);
        let id = request.lease_id().to_u128();
        let Some(lease) = self.leases.get(id) else {
            return Ok(());
        };
        let mut actuals = StackVec::<(LimitIndex, u64), ACTUALS_MAX>::new();
        for actual in request.actuals() {
            let hold = self.index.get(&actual.key).and_then(|&i| lease.hold(i));
            let held_kind = hold.map(|h| self.limits[h.limit as usize].kind());
            decision::check_actual(request.lease_id(), &actual.key, held_kind)?;
            let hold = hold.expect("check_actual accepts only held keys");
            let capacity = self.limits[hold.limit as usize].state().definition().capacity();
            decision::check_actual_amount(&actual.key, actual.actual_amount, capacity)?;
            actuals.push((hold.limit, actual.actual_amount));
        }
        let lease = self.leases.remove(id).expect("the lease was just found");
        for hold in lease.holds() {
            let limit = &mut self.limits[hold.limit as usize];
            limit.expire(now_unix_ms);
            limit.settle_in_flight(hold.expires_at_unix_ms, hold.amount);
            let actual = actuals.as_slice().iter().find(|(i, _)| *i == hold.limit);
            self.reconcile(hold, actual.map(|&(_, units)| units), now_unix_ms);
        }
        self.settle(id, &lease, now_unix_ms);
        Ok(())
    }

    /// Carries out the shared reconcile plan ([`decision::reconcile`]) for one
    /// hold of a completed lease: a concurrency hold ends; a rolling hold
    /// shrinks to `actual` for the rest of its window, or holds the overage for
    /// the rest of the window when it fits; else the overage becomes debt or is
    /// dropped.
    fn reconcile(&mut self, hold: &LeaseHold, actual: Option<u64>, now_unix_ms: u64) {
        let limit = &mut self.limits[hold.limit as usize];
        let window_over = hold.expires_at_unix_ms <= now_unix_ms;
        let extra = match decision::reconcile(limit.kind(), hold.amount, actual, window_over) {
            Reconcile::Keep => return,
            Reconcile::Release => {
                limit.release(hold.expires_at_unix_ms, hold.amount);
                return;
            }
            Reconcile::Shrink { release } => {
                limit.release(hold.expires_at_unix_ms, release);
                return;
            }
            Reconcile::Overage { extra } if limit.fits(extra, hold.expires_at_unix_ms) => {
                limit.hold(hold.expires_at_unix_ms, extra);
                return;
            }
            Reconcile::Overage { extra } | Reconcile::OverageAfterWindow { extra } => extra,
        };
        match decision::overage_fallback(limit.state().definition().overage()) {
            OverageFallback::Debt => {
                limit.add_debt(extra);
                // The usage belongs to the hold's window or period: an owing
                // limit refuses until it ends (nothing when it has ended).
                limit.owe_until(hold.expires_at_unix_ms);
                self.overage_debt_total = self.overage_debt_total.saturating_add(extra);
            }
            OverageFallback::Dropped => self.overage_dropped_total = self.overage_dropped_total.saturating_add(extra),
        }
    }

    /// Creates the limit of `state` or replaces its state; holds carry over.
    pub fn apply_state(&mut self, state: &LimitState) -> Result<(), LimiterError> {
        let definition = state.definition();
        let margin_ms = self.config.window_margin_ms;
        match self.index.get(definition.key()) {
            Some(&i) => {
                let limit = &mut self.limits[i as usize];
                if limit.kind() != definition.kind() {
                    return Err(DefinitionError::KindChange {
                        key: definition.key().clone(),
                        existing: limit.kind(),
                        requested: definition.kind(),
                    }
                    .into());
                }
                limit.set_state(state.clone(), margin_ms)?;
            }
            None => {
                if self.limits.len() >= LIMITS_MAX {
                    return Err(decision::limits_full(LIMITS_MAX));
                }
                let i = LimitIndex::try_from(self.limits.len()).expect("LIMITS_MAX fits u32");
                self.limits.push(Limit::new(state.clone(), margin_ms)?);
                self.fingerprint_tags.push(key_tag(definition.key()));
                self.index.insert(definition.key().clone(), i);
            }
        }
        self.retention_ms = self
            .retention_ms
            .max(definition.hold_with_margin_ms(self.config.window_margin_ms) + LEASE_MEMORY_MARGIN_MS);
        Ok(())
    }

    /// The report of `key`, after dropping its ended holds.
    pub fn limit_report(&mut self, key: &LimitKey, now_unix_ms: u64) -> Option<LimitReport> {
        let &i = self.index.get(key)?;
        let limit = &mut self.limits[i as usize];
        limit.expire(now_unix_ms);
        Some(limit.report(now_unix_ms))
    }

    /// What a new reservation of `key` can take now, as its report would say
    /// it, without copying its state; `None` for an undefined key.
    pub fn limit_available(&mut self, key: &LimitKey, now_unix_ms: u64) -> Option<u64> {
        let &i = self.index.get(key)?;
        let limit = &mut self.limits[i as usize];
        limit.expire(now_unix_ms);
        Some(limit.available(now_unix_ms))
    }

    /// Milliseconds until `key` next gets a held unit back, after dropping its
    /// ended holds; `None` for an undefined key or one holding nothing.
    pub fn next_release_ms(&mut self, key: &LimitKey, now_unix_ms: u64) -> Option<u64> {
        let &i = self.index.get(key)?;
        let limit = &mut self.limits[i as usize];
        limit.expire(now_unix_ms);
        limit.next_release_ms(now_unix_ms)
    }

    /// Every report, ordered by key.
    pub fn limit_reports(&mut self, now_unix_ms: u64) -> Vec<LimitReport> {
        let mut reports: Vec<LimitReport> = self
            .limits
            .iter_mut()
            .map(|limit| {
                limit.expire(now_unix_ms);
                limit.report(now_unix_ms)
            })
            .collect();
        reports.sort_unstable_by(|a, b| a.state.definition().key().cmp(b.state.definition().key()));
        reports
    }

    /// Applies every decrease whose key now has the room (`capacity - in_use >=
    /// capacity - target`; a bucket: its level holds the burst's decrease),
    /// returning the new states.
    pub fn apply_pending_decreases(&mut self, now_unix_ms: u64) -> Vec<LimitState> {
        let mut changed = Vec::new();
        let margin_ms = self.config.window_margin_ms;
        for limit in self.limits.iter_mut().filter(|l| l.is_decreasing()) {
            limit.expire(now_unix_ms);
            if !limit.has_room_for_decrease(margin_ms) {
                continue;
            }
            let next = limit.state().with_decrease_applied();
            // A smaller bucket that keeps no burst was refused when it was defined.
            if limit.set_state(next.clone(), margin_ms).is_ok() {
                changed.push(next);
            }
        }
        changed
    }

    /// The counters, for metrics.
    pub fn counters(&self) -> MemoryCounters {
        MemoryCounters {
            overage_dropped_total: self.overage_dropped_total,
            overage_debt_total: self.overage_debt_total,
            leases_evicted_total: self.leases_evicted_total,
            leases_refused_total: self.leases_refused_total,
            settled_leases_evicted_total: self.settled.evicted_total(),
            failed_leases_evicted_total: self.failed.evicted_total(),
            leases_live: self.leases.len() as u64,
            settled_leases_remembered: self.settled.len() as u64,
            failed_leases_remembered: self.failed.len() as u64,
        }
    }
}

/// The hint for one failing requirement: exact for rolling limits (the time until enough
/// units expire), backoff (docs/retry-hints.md, "ADR 0010 backoff") for concurrency
/// limits, whose holds usually end at Complete, long before their timeout. Jitter is
/// added.
fn hint_ms(policy: &RetryPolicy, limit: &mut Limit, amount: u64, now_unix_ms: u64, jitter: &Jitter) -> u64 {
    let kind = limit.kind();
    if limit.owes(now_unix_ms) {
        // Nothing is admitted before what it owes is behind it.
        let owed_ms = limit.owed_until_unix_ms() - now_unix_ms;
        return owed_ms + jitter.sample_ms(policy.jitter_ms(kind));
    }
    if let Some(period) = limit.state().definition().period() {
        // Room comes back before the boundary when a shorter hold ends (the exact
        // wait) or when calls in flight complete (the backoff of a key freed by
        // Completes, [`RetryPolicy::retry_after_ms`]).
        let exact_ms = limit.exact_wait_ms(now_unix_ms, amount);
        if now_unix_ms.saturating_add(exact_ms) < period.end_unix_ms(now_unix_ms) {
            return exact_ms + jitter.sample_ms(policy.jitter_ms(kind));
        }
        let streak = limit.streak_mut().record_deny(now_unix_ms);
        return policy.retry_after_ms(limit.state().definition(), streak, jitter);
    }
    let base_ms = match kind {
        LimitKind::Rolling | LimitKind::Bucket => limit.exact_wait_ms(now_unix_ms, amount),
        LimitKind::Concurrency => {
            let streak = limit.streak_mut().record_deny(now_unix_ms);
            policy
                .concurrency
                .backoff_ms(limit.state().definition().hold_ms(), streak)
        }
    };
    base_ms + jitter.sample_ms(policy.jitter_ms(kind))
}

/// The fingerprint hasher keyed by `seed`; the shared part of foldhash's key
/// is its fixed one, so the seed alone decides every fingerprint. (A foldhash
/// release that changed its output would change fingerprints too: it must
/// come with a new snapshot format version.)
fn fingerprint_hasher(seed: u64) -> foldhash::quality::SeedableRandomState {
    foldhash::quality::SeedableRandomState::with_seed(seed, foldhash::SharedSeed::global_fixed())
}

/// A stable 64-bit hash of `key`: the first 8 bytes of its SHA-256, the same
/// in every process and build.
fn key_tag(key: &LimitKey) -> u64 {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(key.as_str().as_bytes());
    u64::from_le_bytes(digest[..8].try_into().expect("a SHA-256 digest has 8 bytes"))
}

/// `wanted` sorted by limit, so requirement lists compare as sets.
fn sorted(wanted: &Wanted) -> Wanted {
    let mut sorted = *wanted;
    sorted.as_mut_slice().sort_unstable_by_key(|&(i, _)| i);
    sorted
}
