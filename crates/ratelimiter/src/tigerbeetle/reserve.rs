//! Reserve (docs/tigerbeetle-backend.md, "Reserve"; docs/decisions.md, "Reserve
//! precedence"): one linked chain of pending transfers per lease, resource → operator,
//! sent without any read. TigerBeetle applies the chain all or nothing and refuses a
//! transfer that would debit a resource account beyond its credits, so nothing is ever
//! over-admitted.

use crate::base::id::LeaseId;
use crate::model::decision;
use crate::model::definition::{LimitKind, LimitState};
use crate::model::error::LimiterError;
use crate::model::wire::{Denial, ReserveOutcome, ReserveRequest};
use tigerbeetle_unofficial as tb;

use super::buckets::{self, Bucket};
use super::chain::{is_different_existing, lease_chain, lease_timeout_seconds};
use super::ids;
use super::lease_cache::{fingerprint, HeldRequirement, LeaseRecord};
use super::pool::PoolError;
use super::shared::{unavailable, Shared};
use super::submitter::Failure;

use tb::error::CreateTransferErrorKind as Kind;

/// The requirement (its index in the request) of each owed check the chain
/// carries after its reservations, in chain order: two transfers each
/// ([`ids::owed_check`]).
type OwedChecks = Vec<usize>;

/// What the backend decided before sending anything.
enum Plan {
    /// Send this chain, after the refills due on these buckets (the
    /// request's bucket requirements); remember this record.
    Send(Vec<tb::Transfer>, LeaseRecord, Vec<Bucket>, OwedChecks),
    /// Answer at once.
    Answer(ReserveOutcome),
    /// A denial that sends nothing, for a lease this server does not know: the lease may
    /// have been granted or denied on another server, which comes first
    /// (docs/decisions.md, "Reserve precedence", rows 3 and 4), so the cluster is asked.
    Standing(Denial),
}

impl Shared {
    pub(super) async fn reserve_lease(&self, request: &ReserveRequest) -> Result<ReserveOutcome, LimiterError> {
        let now = self.clock.now_unix_ms();
        let plan = match self.plan_reserve(request, now) {
            // Another server may have just defined the key: read the log once.
            Err(LimiterError::UnknownKey(_)) => {
                self.refresh_definitions().await?;
                self.plan_reserve(request, now)
            }
            other => other,
        };
        let (chain, record, buckets, owed) = match plan? {
            Plan::Answer(outcome) => return Ok(outcome),
            Plan::Standing(denial) => return self.standing_or_earlier(request, denial).await,
            Plan::Send(chain, record, buckets, owed) => (chain, record, buckets, owed),
        };
        let lease = request.lease_id();
        self.ensure_lease_marker_accounts().await?;
        let known = self.leases.get(lease);
        // Remembered before sending: if the outcome is unknown, Complete must still void
        // by id (pessimistic accounting, docs/tigerbeetle-backend.md, "Timeouts and
        // 503"). Refused, with nothing sent, past the owner's share of the cache.
        self.leases.admit(lease, request.owner(), record.clone(), now)?;
        let failures = match self.submit_with_refills(chain, &buckets).await {
            Ok(failures) => failures,
            Err(e) => {
                if e == PoolError::Busy {
                    // Nothing was sent: forget what this attempt added.
                    match known {
                        Some(previous) => self.leases.insert(lease, previous),
                        None => self.leases.remove(lease),
                    }
                }
                return Err(unavailable(&e, "reserve"));
            }
        };
        let failures = on_requirements(failures, request.requirements().len(), &owed);
        self.reserve_result(request, record, &failures, now, &buckets).await
    }

    /// Sends `chain` after the refills due on `buckets`, in one work item when
    /// they fit (TigerBeetle applies a request's transfers in order, and the
    /// submitter keeps each item's order within a batch, so the refills come
    /// first), else the refills on their own first. Returns the chain's
    /// failures, indexed within the chain.
    async fn submit_with_refills(
        &self,
        chain: Vec<tb::Transfer>,
        buckets: &[Bucket],
    ) -> Result<Vec<Failure>, PoolError> {
        if buckets.is_empty() {
            return self.submitter.submit(chain).await;
        }
        let refills = self.due_refills(buckets).await;
        if refills.transfers.len() + chain.len() > self.submitter.batch_events_max() {
            self.post_refills(&refills).await;
            return self.submitter.submit(chain).await;
        }
        let count = refills.transfers.len();
        let mut item = refills.transfers.clone();
        item.extend(chain);
        let failures = self.submitter.submit(item).await?;
        let (refill_failures, chain_failures): (Vec<Failure>, Vec<Failure>) =
            failures.into_iter().partition(|f| f.index < count);
        refills.settle(&self.refills, &refill_failures);
        Ok(chain_failures
            .into_iter()
            .map(|f| Failure {
                index: f.index - count,
                ..f
            })
            .collect())
    }

    /// Checks the request against the definitions: unknown keys are errors; a
    /// lease TigerBeetle denied stays denied; a lease already granted is granted again; an amount above capacity or a
    /// decreasing limit are denials that send nothing, so they do not burn the
    /// lease id (TigerBeetle never saw it); otherwise the chain.
    fn plan_reserve(&self, request: &ReserveRequest, now: u64) -> Result<Plan, LimiterError> {
        let lease = request.lease_id();
        // Planned under the view's read lock, so the states are borrowed, not
        // copied (their strings would be several allocations per requirement).
        let view = self.definitions.read().expect("definitions lock");
        let definitions = request
            .requirements()
            .iter()
            .map(|r| match view.get(&r.key) {
                Some(versioned) => Ok(&versioned.state),
                None => Err(LimiterError::UnknownKey(r.key.clone())),
            })
            .collect::<Result<Vec<&LimitState>, LimiterError>>()?;
        if self.denied.contains(lease) {
            return Ok(Plan::Answer(ReserveOutcome::Denied(Denial::LeaseAlreadyFailed)));
        }
        if let Some(record) = self.leases.get(lease).filter(|r| r.confirmed) {
            return self.replay(request, &record).map(Plan::Answer);
        }
        let requirements = definitions
            .iter()
            .copied()
            .zip(request.requirements())
            .map(|(s, r)| (s, r.amount));
        if let Some(denial) = decision::standing_denial(requirements, self.decrease_retry_ms, self.window_margin_ms) {
            return Ok(Plan::Standing(denial));
        }
        // A retry of an attempt whose outcome is unknown sends the very same
        // chain, its first reservation time included.
        let reserved_at_unix_ms = self.leases.get(lease).map_or(now, |r| r.reserved_at_unix_ms);
        let margin_ms = self.window_margin_ms;
        let (chain, owed) = reserve_chain(request, &definitions, reserved_at_unix_ms, margin_ms);
        let buckets = definitions
            .iter()
            .filter_map(|s| buckets::bucket_of(s, margin_ms))
            .collect();
        let held = request
            .requirements()
            .iter()
            .zip(definitions.iter().copied())
            .enumerate()
            .map(|(i, (r, s))| HeldRequirement {
                key: r.key.clone(),
                amount: r.amount,
                kind: s.definition().kind(),
                timeout_seconds: u64::from(lease_timeout_seconds(
                    s,
                    margin_ms,
                    request.hold_ms(),
                    reserved_at_unix_ms,
                )),
                reservation_id: ids::reservation_id(lease, i),
            })
            .collect();
        let record = LeaseRecord {
            reserved_at_unix_ms,
            reserved_at_cluster_ns: None,
            held,
            fingerprint: fingerprint(request.requirements().iter().map(|r| (&r.key, r.amount))),
            confirmed: false,
            completed: false,
        };
        Ok(Plan::Send(chain, record, buckets, owed))
    }

    /// The answer to a lease that was granted before: granted again with its
    /// original time if it asks for the same (in any order), a conflict otherwise.
    fn replay(&self, request: &ReserveRequest, record: &LeaseRecord) -> Result<ReserveOutcome, LimiterError> {
        let asked = fingerprint(request.requirements().iter().map(|r| (&r.key, r.amount)));
        if asked != record.fingerprint {
            return Err(decision::lease_reused(request.lease_id()));
        }
        Ok(ReserveOutcome::Allowed {
            reserved_at_unix_ms: record.reserved_at_unix_ms,
        })
    }

    /// Turns TigerBeetle's answer to the chain into the outcome
    /// (docs/tigerbeetle-backend.md, "Result codes").
    async fn reserve_result(
        &self,
        request: &ReserveRequest,
        mut record: LeaseRecord,
        failures: &[ChainFailure],
        now: u64,
        buckets: &[Bucket],
    ) -> Result<ReserveOutcome, LimiterError> {
        let lease = request.lease_id();
        let keys = || request.requirements().iter().map(|r| &r.key);
        if failures.is_empty() {
            record.confirmed = true;
            let reserved_at_unix_ms = record.reserved_at_unix_ms;
            self.leases.update(lease, record);
            self.retry.on_allowed(keys(), now);
            return Ok(ReserveOutcome::Allowed { reserved_at_unix_ms });
        }
        // A reservation id that failed before: the lease was denied, by some
        // server (ids derive from the lease and the index alone).
        if failures.iter().any(|f| matches!(f.kind(), Kind::IdAlreadyFailed)) {
            self.leases.remove(lease);
            self.denied.insert(lease);
            return Ok(ReserveOutcome::Denied(Denial::LeaseAlreadyFailed));
        }
        if let Some(failure) = failures.iter().find(|f| matches!(f.kind(), Kind::ExceedsCredits)) {
            self.leases.remove(lease);
            self.denied.insert(lease);
            // The chain position of the refused transfer: an owed check comes
            // after every reservation, so the first reservation's id is not burnt.
            let position = if failure.owed { usize::MAX } else { failure.index };
            self.mark_denied(lease, position).await;
            // The reservations are in request order.
            let requirement = &request.requirements()[failure.index];
            let key = &requirement.key;
            // A key with a calendar period: "never" when what completed calls
            // settled leaves no room (docs/decisions.md, "Reserve precedence",
            // row 7), else "not now" below, with the backoff of a key freed by
            // Completes.
            if failure.owed && self.state_of(key).is_some_and(|s| s.definition().period().is_some()) {
                // It owes until its period ends: no retry can succeed before.
                return Ok(ReserveOutcome::Denied(decision::period_exhausted(key.clone())));
            }
            if self.period_is_spent(key, requirement.amount).await {
                return Ok(ReserveOutcome::Denied(decision::period_exhausted(key.clone())));
            }
            let bucket = buckets.iter().find(|b| &b.key == key);
            let retry_after_ms = match bucket {
                Some(bucket) => self.bucket_hint(bucket, requirement.amount).await,
                None => None,
            };
            // Limits are never removed, so a key just sent is still defined.
            let definition = self
                .state_of(key)
                .expect("a reserved key is defined")
                .definition()
                .clone();
            let retry_after_ms = retry_after_ms.unwrap_or_else(|| self.retry.on_denied([&definition], now));
            return Ok(ReserveOutcome::Denied(Denial::InsufficientCapacity {
                key: key.clone(),
                retry_after_ms,
            }));
        }
        // The chain, or a transfer at one of its ids, exists: a retry whose
        // first answer was lost (here or on another server; its time or its
        // timeouts may differ), the same lease id with other requirements or
        // in another order, or a lease denied elsewhere (its denied marker at
        // the first id). Which one is read back from the cluster.
        let existing = |kind| {
            matches!(
                kind,
                Kind::Exists
                    | Kind::LinkedEventFailed
                    | Kind::ExistsWithDifferentUserData64
                    | Kind::ExistsWithDifferentTimeout
            ) || is_different_existing(kind)
        };
        if failures.iter().all(|f| existing(f.kind())) {
            return self.reserve_existing(request).await;
        }
        self.leases.remove(lease);
        let codes: Vec<String> = failures.iter().map(|f| format!("{}:{:?}", f.index, f.kind())).collect();
        tracing::error!(lease = %lease, codes = ?codes, "unexpected TigerBeetle results for a reserve chain");
        Err(LimiterError::Backend(format!(
            "reserve chain failed: {}",
            codes.join(",")
        )))
    }

    /// Whether `amount` more can never fit on `key` in this period
    /// ([`decision::period_is_spent`] over the key's settled account). False for a
    /// key without a period, and when the settled account cannot be read: the
    /// denial then stays "not now", which a retry corrects, rather than a "never"
    /// that might be wrong. One lookup, on the denial path of period keys only.
    async fn period_is_spent(&self, key: &crate::model::key::LimitKey, amount: u64) -> bool {
        let Some(state) = self.state_of(key).filter(|s| s.definition().period().is_some()) else {
            return false;
        };
        match self.settled_units(key).await {
            Ok(settled) => decision::period_is_spent(state.definition().capacity(), settled, amount),
            Err(error) => {
                tracing::warn!(key = %key, %error, "the settled units of a period key could not be read");
                false
            }
        }
    }

    /// The answer to a request with a standing denial from a lease this server
    /// does not know: a grant of the lease on another server is replayed, a
    /// denial of it stays final, and only a lease the cluster never saw gets
    /// the standing denial. One read, on denial paths only.
    async fn standing_or_earlier(
        &self,
        request: &ReserveRequest,
        denial: Denial,
    ) -> Result<ReserveOutcome, LimiterError> {
        let lease = request.lease_id();
        let found = self.cluster_lease(lease).await?;
        if found.denied {
            self.denied.insert(lease);
            return Ok(ReserveOutcome::Denied(Denial::LeaseAlreadyFailed));
        }
        let Some(record) = found.record() else {
            return Ok(ReserveOutcome::Denied(denial));
        };
        let outcome = self.replay(request, &record)?;
        self.leases.update(lease, record);
        Ok(outcome)
    }

    /// Creates the lease-marker accounts once per process: every definition
    /// creates them too, but a cluster whose limits were defined by an older
    /// version has none.
    pub(super) async fn ensure_lease_marker_accounts(&self) -> Result<(), LimiterError> {
        if self.lease_accounts_ready.load(std::sync::atomic::Ordering::Acquire) {
            return Ok(());
        }
        self.create_accounts_checked(ids::lease_marker_accounts(), "lease markers")
            .await?;
        self.lease_accounts_ready
            .store(true, std::sync::atomic::Ordering::Release);
        Ok(())
    }

    /// Writes the denied marker of `lease` (the reservation at `failed` was
    /// refused), so that every server answers `lease_already_failed` to it
    /// whatever keys it names: at the lease's first reservation id, which
    /// every later chain of the lease opens with, or, when the first
    /// reservation is the one refused (its id is burnt: every later chain
    /// fails there already), at its completion id, where a lookup finds it.
    /// Best effort: when it cannot be written, this server still remembers
    /// the denial, and TigerBeetle the failed reservation's id.
    async fn mark_denied(&self, lease: LeaseId, failed: usize) {
        let id = match failed {
            0 => ids::completion_id(lease),
            _ => ids::lease_marker_id(lease),
        };
        let marker = ids::denied_marker(lease, id);
        match self.submitter.submit(vec![marker]).await {
            Ok(failures) => match failures.first().map(|f| f.kind()) {
                // Written before, or a grant of the same lease id won the race
                // (a caller that changed its requirements): nothing to add.
                None | Some(Kind::Exists) => {}
                Some(kind) if is_different_existing(kind) => {}
                Some(kind) => tracing::warn!(%lease, code = ?kind, "the denied marker was not written"),
            },
            Err(e) => tracing::warn!(%lease, error = %e, "the denied marker was not written"),
        }
    }

    /// The chain, or part of it, exists already: a retry of a lease whose first
    /// answer was lost, here or on another server. Denied for good if the
    /// lease was denied; granted with the original time if the lease reserved
    /// exactly these requirements (read back from the cluster), a conflict
    /// otherwise.
    async fn reserve_existing(&self, request: &ReserveRequest) -> Result<ReserveOutcome, LimiterError> {
        let lease = request.lease_id();
        let found = self.cluster_lease(lease).await?;
        if found.denied {
            self.leases.remove(lease);
            self.denied.insert(lease);
            return Ok(ReserveOutcome::Denied(Denial::LeaseAlreadyFailed));
        }
        match found.record().map(|record| (self.replay(request, &record), record)) {
            Some((Ok(outcome), record)) => {
                self.leases.update(lease, record);
                Ok(outcome)
            }
            Some((Err(conflict), _)) => {
                self.leases.remove(lease);
                Err(conflict)
            }
            None => {
                self.leases.remove(lease);
                Err(decision::lease_reused(lease))
            }
        }
    }
}

/// The linked chain of one lease: per requirement a pending transfer resource →
/// operator, timing out with the window plus margin (rolling) or hold timeout
/// (concurrency), or a posted take resource → taken (bucket). Every transfer carries the lease in `user_data_128`,
/// so any server finds the lease's transfers, and the reservation time in
/// `user_data_64`, so any server answers a replay with it.
fn reserve_chain(
    request: &ReserveRequest,
    states: &[&LimitState],
    reserved_at_unix_ms: u64,
    default_margin_ms: u64,
) -> (Vec<tb::Transfer>, OwedChecks) {
    let holds = request.requirements().iter().zip(states).map(|(r, s)| {
        let timeout = lease_timeout_seconds(s, default_margin_ms, request.hold_ms(), reserved_at_unix_ms);
        (&r.key, r.amount, timeout)
    });
    let chain = lease_chain(request.lease_id(), reserved_at_unix_ms, holds);
    let mut chain: Vec<tb::Transfer> = (chain.into_iter().zip(request.requirements()).zip(states))
        .map(|((reservation, r), s)| match s.definition().kind() {
            LimitKind::Bucket => buckets::as_take(reservation, &r.key),
            _ => reservation,
        })
        .collect();
    // An owing limit refuses: its owed account's check, after every
    // reservation, so the first transfer stays the lease's marker.
    let owed: OwedChecks = (states.iter().enumerate())
        .filter(|(_, s)| s.definition().overage().refuses_while_owing())
        .map(|(i, _)| i)
        .collect();
    for &i in &owed {
        chain.extend(ids::owed_check(request.lease_id(), i, &request.requirements()[i].key));
    }
    // Linked all but the last: the chain is all or nothing.
    let last = chain.len() - 1;
    for (i, transfer) in chain.iter_mut().enumerate() {
        let flags = transfer.flags();
        let flags = if i < last {
            flags | tb::transfer::Flags::LINKED
        } else {
            flags - tb::transfer::Flags::LINKED
        };
        *transfer = transfer.with_flags(flags);
    }
    (chain, owed)
}

/// A failure of a reserve chain, on the requirement it concerns.
pub(super) struct ChainFailure {
    /// The requirement's index in the request.
    pub index: usize,
    /// TigerBeetle's result.
    pub kind: Kind,
    /// True when the requirement's owed check failed, not its reservation.
    pub owed: bool,
}

impl ChainFailure {
    fn kind(&self) -> Kind {
        self.kind
    }
}

/// `failures`, indexed within a chain of `requirements` reservations followed
/// by the owed checks `owed`, as failures of requirements.
fn on_requirements(failures: Vec<Failure>, requirements: usize, owed: &[usize]) -> Vec<ChainFailure> {
    (failures.into_iter())
        .map(|f| match f.index.checked_sub(requirements) {
            None => ChainFailure {
                index: f.index,
                kind: f.kind(),
                owed: false,
            },
            Some(check) => ChainFailure {
                index: owed[check / 2],
                kind: f.kind(),
                owed: true,
            },
        })
        .collect()
}
