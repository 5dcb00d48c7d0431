//! Complete (docs/tigerbeetle-backend.md, "Complete"; docs/decisions.md, "Complete"):
//! void concurrency holds, shrink rolling reservations to the actual usage for the rest
//! of their window, refund a bucket's unused units, and reserve (or take, or record as
//! debt) usage beyond the reservation.
//!
//! A Complete is one linked chain, all or nothing, opened by the lease's
//! completion record (an id derived from the lease alone, a digest of the
//! actuals): the first Complete of a lease decides its reconciliation on every
//! server, and a later one, a retry or other actuals on any server, meets the
//! record and changes nothing. Voids of reservations that expired, were voided
//! before or never existed (an unknown reserve outcome) count as released: they
//! are dropped from the chain, which is sent again.

use crate::base::id::LeaseId;
use crate::model::decision::{self, OverageFallback, Reconcile};
use crate::model::definition::LimitKind;
use crate::model::error::LimiterError;
use crate::model::key::LimitKey;
use crate::model::wire::CompleteRequest;
use tigerbeetle_unofficial as tb;

use super::buckets;
use super::chain::is_different_existing;
use super::ids;
use super::lease_cache::{HeldRequirement, LeaseRecord};
use super::shared::{unavailable, Shared};
use super::submitter::Failure;

use tb::error::CreateTransferErrorKind as Kind;

/// Why a transfer of a Complete was sent, to read its result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Purpose {
    /// The lease's completion record, which opens the chain.
    Record,
    /// Releases the reservation of `record.held[usize]`.
    Void(usize),
    /// Re-reserves the actual amount of `record.held[usize]` after a void.
    Shrink(usize),
    /// Records on a period key's settled account what `record.held[usize]` holds
    /// after the Complete, until the hold ends ([`settled_transfer`]).
    Settled(usize),
    /// Gives a bucket the units its lease took and did not use.
    Refund,
    /// Reserves usage beyond the reservation; `usize` is the held requirement.
    Overage(usize),
    /// Records usage beyond the reservation as debt; `usize` is the held
    /// requirement, `u64` the units.
    Debt(usize, u64),
    /// Makes the `overage: owe` limit of `record.held[usize]` refuse until the
    /// hold's window or period ends ([`ids::owed_lock_transfer_id`]).
    OwedLock(usize),
}

/// The most rounds of one Complete: each round after the first drops or
/// replaces one transfer that cannot be written (a reservation that expired,
/// an overage that does not fit), so a chain of at most 1 + 2 × 32 transfers
/// settles within as many rounds.
const COMPLETE_ROUNDS_MAX: usize = 2 * 32 + 2;

/// Nanoseconds in a millisecond: the cluster's stamps are ns.
const NANOS_PER_MS: u64 = 1_000_000;

/// What one round of a Complete's chain came to.
enum Round {
    /// The chain was written: this Complete decided the lease.
    Written,
    /// The lease's Complete was decided before (this one's retry, or another
    /// Complete of the lease on any server): nothing changed.
    Decided,
    /// Send again, with the chain adjusted.
    Again,
}

/// A Complete's transfers, why each is sent, and the overage units dropped.
struct CompleteChain {
    transfers: Vec<tb::Transfer>,
    purposes: Vec<Purpose>,
    dropped_units: u64,
}

impl Shared {
    pub(super) async fn complete_lease(&self, request: &CompleteRequest) -> Result<(), LimiterError> {
        let lease = request.lease_id();
        let Some(record) = self.lease_record(lease).await? else {
            // Never granted, or completed already: nothing to reconcile.
            return Ok(());
        };
        if record.completed {
            return Ok(());
        }
        check_actuals(lease, request, &record)?;
        self.check_actual_amounts(request).await?;
        self.ensure_lease_marker_accounts().await?;
        let mut record = self.without_missing_takes(record).await?;
        let elapsed_ms = self.elapsed_ms(&record).await;
        let mut chain = self.complete_chain(lease, request, &record, elapsed_ms);
        let mut settled = None;
        for _ in 0..COMPLETE_ROUNDS_MAX {
            let failures = self
                .submitter
                .submit(linked(&chain.transfers))
                .await
                .map_err(|e| unavailable(&e, "complete"))?;
            match self.complete_round(lease, &record, &mut chain, &failures)? {
                Round::Again => {}
                round => {
                    settled = Some(round);
                    break;
                }
            }
        }
        match settled {
            Some(Round::Written) => self.count_overages(&chain),
            Some(_) => {}
            None => {
                tracing::error!(lease = %lease, rounds = COMPLETE_ROUNDS_MAX, "complete did not settle");
                return Err(LimiterError::Backend("complete did not settle".to_owned()));
            }
        }
        record.completed = true;
        record.held = Vec::new();
        self.leases.update(lease, record);
        Ok(())
    }

    /// Each actual at most [`decision::ACTUAL_CAPACITY_MULTIPLE_MAX`] times its
    /// key's capacity, as on the memory backend: else a 400 before any transfer,
    /// so a key's debt and the overage counters never run towards 2^64.
    async fn check_actual_amounts(&self, request: &CompleteRequest) -> Result<(), LimiterError> {
        for actual in request.actuals() {
            if let Some(state) = self.state_of_fresh(&actual.key).await? {
                let capacity = state.definition().capacity();
                decision::check_actual_amount(&actual.key, actual.actual_amount, capacity)?;
            }
        }
        Ok(())
    }

    /// `record` without the bucket requirements whose take is not in the
    /// cluster, for a lease whose Reserve outcome is unknown: a refund is
    /// a transfer of its own, not a void that fails when its reservation is
    /// missing, and a refund without its take would hand out other leases'
    /// units. One lookup, on that rare path only.
    async fn without_missing_takes(&self, mut record: LeaseRecord) -> Result<LeaseRecord, LimiterError> {
        let takes: Vec<u128> = (record.held.iter())
            .filter(|h| h.kind == LimitKind::Bucket)
            .map(|h| h.reservation_id)
            .collect();
        if record.confirmed || takes.is_empty() {
            return Ok(record);
        }
        let found = (self.lookups.lookup(takes, self.timeout).await).map_err(|e| unavailable(&e, "complete"))?;
        record.held.retain(|h| {
            h.kind != LimitKind::Bucket
                || found.iter().any(|t| {
                    t.id() == h.reservation_id
                        && t.debit_account_id() == ids::resource_account_id(&h.key)
                        && t.credit_account_id() == ids::taken_account_id(&h.key)
                })
        });
        Ok(record)
    }

    /// What Complete needs of `lease`: from this server's cache, or read back
    /// from the cluster when another server reserved it or this one forgot it.
    /// `None` when the cluster holds no reservation of the lease.
    async fn lease_record(&self, lease: LeaseId) -> Result<Option<LeaseRecord>, LimiterError> {
        if let Some(record) = self.leases.get(lease) {
            self.completes_from_cache
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            return Ok(Some(record));
        }
        let found = self.cluster_lease(lease).await?;
        self.completes_from_cluster
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(found.record())
    }

    /// How much of the lease's window has passed, in ms, never more than
    /// truly passed (docs/tigerbeetle-backend.md, "Clocks"): on this
    /// process's clock, which no wall-clock step moves, for a lease it
    /// reserved; on the cluster's, whose stamps time the holds, for a lease
    /// reserved by another process (another server, or this one before a
    /// restart). Without the cluster's time, none: the rest of the window is
    /// then the whole window (idle, never over-admitting).
    async fn elapsed_ms(&self, record: &LeaseRecord) -> u64 {
        let Some(reserved_ns) = record.reserved_at_cluster_ns else {
            return self.clock.now_unix_ms().saturating_sub(record.reserved_at_unix_ms);
        };
        match self.cluster_now_ns().await {
            Some(now_ns) => now_ns.saturating_sub(reserved_ns) / NANOS_PER_MS,
            None => 0,
        }
    }

    /// The chain of one Complete: its completion record (a digest of the
    /// actuals), then the transfers of the shared reconcile plan, with the
    /// overages that cannot be reserved (their window is over) recorded as
    /// debt or dropped.
    fn complete_chain(
        &self,
        lease: LeaseId,
        request: &CompleteRequest,
        record: &LeaseRecord,
        elapsed_ms: u64,
    ) -> CompleteChain {
        let digest = ids::actuals_digest(request.actuals().iter().map(|a| (&a.key, a.actual_amount)));
        let (mut transfers, mut purposes, unreservable) = complete_transfers(lease, request, record, elapsed_ms);
        for (i, transfer) in self.settled_transfers(lease, request, record, elapsed_ms) {
            transfers.push(transfer);
            purposes.push(Purpose::Settled(i));
        }
        transfers.insert(0, ids::completion_record(lease, digest));
        purposes.insert(0, Purpose::Record);
        let mut chain = CompleteChain {
            transfers,
            purposes,
            dropped_units: 0,
        };
        for i in unreservable {
            let units = overage_units(request, &record.held[i]);
            self.overage_to_debt(lease, record, &mut chain, None, i, units);
        }
        chain
    }

    /// Reads one round's answer: the chain was written, the lease was
    /// decided before, or one transfer that cannot be written is dropped or
    /// replaced for the next round (the chain is all or nothing, so nothing
    /// of this round was written).
    fn complete_round(
        &self,
        lease: LeaseId,
        record: &LeaseRecord,
        chain: &mut CompleteChain,
        failures: &[Failure],
    ) -> Result<Round, LimiterError> {
        if failures.is_empty() {
            return Ok(Round::Written);
        }
        // A failed chain names the transfer that failed it; the others read
        // `linked_event_failed`.
        let Some(failure) = failures.iter().find(|f| !matches!(f.kind(), Kind::LinkedEventFailed)) else {
            tracing::error!(lease = %lease, "a complete chain failed without a cause");
            return Err(LimiterError::Backend(
                "complete chain failed without a cause".to_owned(),
            ));
        };
        let (index, kind) = (failure.index, failure.kind());
        let released = matches!(
            kind,
            Kind::PendingTransferExpired | Kind::PendingTransferAlreadyVoided | Kind::PendingTransferNotFound
        );
        match chain.purposes[index] {
            // This Complete's own record (a retry whose first answer was
            // lost), or another Complete's, with other actuals or another
            // chain (other flags): decided.
            Purpose::Record if matches!(kind, Kind::Exists) || is_different_existing(kind) => Ok(Round::Decided),
            // Written by an earlier version's Complete of the lease, which
            // wrote no record: decided too.
            Purpose::Void(_)
            | Purpose::Shrink(_)
            | Purpose::Settled(_)
            | Purpose::Refund
            | Purpose::Overage(_)
            | Purpose::Debt(..)
            | Purpose::OwedLock(_)
                if matches!(kind, Kind::Exists) || written_elsewhere(kind) =>
            {
                Ok(Round::Decided)
            }
            // The reservation is gone (its hold ended): nothing of it stays
            // held, so nothing of it is settled either.
            Purpose::Void(i) if released => {
                chain.remove(index);
                chain.remove_settled(i);
                Ok(Round::Again)
            }
            // The shrunk reservation is not needed for safety: what it
            // re-reserves was just freed, so it only fails when the void did
            // not free it.
            Purpose::Shrink(i) if matches!(kind, Kind::ExceedsCredits | Kind::IdAlreadyFailed) => {
                tracing::debug!(lease = %lease, code = ?kind, "shrunk reservation not created");
                chain.remove(index);
                chain.remove_settled(i);
                Ok(Round::Again)
            }
            Purpose::Overage(i) if matches!(kind, Kind::ExceedsCredits | Kind::IdAlreadyFailed) => {
                let units = u64::try_from(chain.transfers[index].amount()).expect("an overage fits u64");
                self.overage_to_debt(lease, record, chain, Some(index), i, units);
                // Only the reservation stays held: that much is settled.
                chain.settle_only(i, record.held[i].amount);
                Ok(Round::Again)
            }
            // A period key defined before settled accounts existed: its
            // Complete still reconciles; its denials stay "not now" until it
            // is defined again (which creates the account).
            Purpose::Settled(_) if matches!(kind, Kind::DebitAccountNotFound) => {
                tracing::warn!(lease = %lease, "a period key has no settled account; apply its definition again");
                chain.remove(index);
                Ok(Round::Again)
            }
            // As many locks as the owed account holds are pending: the limit
            // owes already, until the last of them ends.
            Purpose::OwedLock(_) if matches!(kind, Kind::ExceedsCredits | Kind::DebitAccountNotFound) => {
                tracing::warn!(lease = %lease, code = ?kind, "an owing limit could not take another lock");
                chain.remove(index);
                Ok(Round::Again)
            }
            purpose => {
                tracing::error!(lease = %lease, code = ?kind, purpose = ?purpose, held = record.held.len(),
                    "unexpected TigerBeetle result in complete");
                Err(LimiterError::Backend(format!("complete transfer failed: {kind:?}")))
            }
        }
    }

    /// Handles an overage of `units` on `record.held[i]` that could not be
    /// reserved, per the limit's `overage`: a debt transfer in the chain (in
    /// place of the re-reserve at `replace`, if any), or dropped.
    fn overage_to_debt(
        &self,
        lease: LeaseId,
        record: &LeaseRecord,
        chain: &mut CompleteChain,
        replace: Option<usize>,
        i: usize,
        units: u64,
    ) {
        let held = &record.held[i];
        // The re-reserve's timeout is what is left of the hold's window or
        // period; none when the window is over.
        let left_seconds = replace.map(|index| chain.transfers[index].timeout());
        if let Some(index) = replace {
            chain.remove(index);
        }
        let fallback = self.state_of(&held.key).map_or(OverageFallback::Dropped, |s| {
            decision::overage_fallback(s.definition().overage())
        });
        if fallback == OverageFallback::Dropped {
            chain.dropped_units += units;
            return;
        }
        chain.transfers.push(
            tb::Transfer::new(ids::debt_transfer_id(lease, &held.key))
                .with_debit_account_id(ids::debt_account_id(&held.key))
                .with_credit_account_id(ids::operator_account_id())
                .with_amount(u128::from(units))
                .with_ledger(ids::LEDGER_LIMITS)
                .with_code(ids::CODE_DEBT)
                .with_user_data_128(lease.to_u128()),
        );
        chain.purposes.push(Purpose::Debt(i, units));
        let owes = self
            .state_of(&held.key)
            .is_some_and(|s| s.definition().overage().refuses_while_owing());
        if let Some(seconds) = left_seconds.filter(|&s| owes && s > 0) {
            chain.transfers.push(
                tb::Transfer::new(ids::owed_lock_transfer_id(lease, &held.key))
                    .with_debit_account_id(ids::owed_account_id(&held.key))
                    .with_credit_account_id(ids::operator_account_id())
                    .with_amount(1)
                    .with_ledger(ids::LEDGER_LIMITS)
                    .with_code(ids::CODE_OWED_LOCK)
                    .with_flags(tb::transfer::Flags::PENDING)
                    .with_timeout(seconds)
                    .with_user_data_128(lease.to_u128()),
            );
            chain.purposes.push(Purpose::OwedLock(i));
        }
    }

    /// The settled-account records of a Complete (docs/tigerbeetle-backend.md,
    /// "Calendar periods"): for each held requirement on a key with a calendar
    /// period whose hold runs to the period's end, what stays held after the
    /// shared reconcile plan, as a pending transfer on the key's settled account
    /// that ends with the hold (rounded down to whole seconds, so never after it).
    /// Each is indexed by its held requirement.
    fn settled_transfers(
        &self,
        lease: LeaseId,
        request: &CompleteRequest,
        record: &LeaseRecord,
        elapsed_ms: u64,
    ) -> Vec<(usize, tb::Transfer)> {
        let mut settled = Vec::new();
        for (i, held) in record.held.iter().enumerate() {
            let Some(period) = self.state_of(&held.key).and_then(|s| s.definition().period()) else {
                continue;
            };
            let to_period_end_ms = period.end_unix_ms(record.reserved_at_unix_ms) - record.reserved_at_unix_ms;
            if held.timeout_seconds.saturating_mul(1000) < to_period_end_ms {
                // A hold of the reserve's own shorter `hold_ms`: it frees its
                // units before the boundary, so they never count as settled.
                continue;
            }
            let left_seconds = (held.timeout_seconds.saturating_mul(1000)).saturating_sub(elapsed_ms) / 1000;
            let actual = (request.actuals().iter())
                .find(|a| a.key == held.key)
                .map(|a| a.actual_amount);
            let window_over = left_seconds == 0;
            let kept = match decision::reconcile(held.kind, held.amount, actual, window_over) {
                Reconcile::Keep if !window_over => held.amount,
                Reconcile::Shrink { release } => held.amount - release,
                Reconcile::Overage { extra } => held.amount.saturating_add(extra),
                Reconcile::Keep | Reconcile::Release | Reconcile::OverageAfterWindow { .. } => 0,
            };
            if kept > 0 && left_seconds > 0 {
                settled.push((i, settled_transfer(lease, &held.key, kept, left_seconds)));
            }
        }
        settled
    }

    /// Counts what a written chain dropped and recorded as debt.
    fn count_overages(&self, chain: &CompleteChain) {
        if chain.dropped_units > 0 {
            tracing::info!(units = chain.dropped_units, "overage dropped (overage: none)");
            self.overage_dropped_units
                .fetch_add(chain.dropped_units, std::sync::atomic::Ordering::Relaxed);
        }
        let debt: u64 = (chain.purposes.iter())
            .map(|p| match p {
                Purpose::Debt(_, units) => *units,
                _ => 0,
            })
            .sum();
        self.overage_debt_units
            .fetch_add(debt, std::sync::atomic::Ordering::Relaxed);
    }
}

impl CompleteChain {
    fn remove(&mut self, index: usize) {
        self.transfers.remove(index);
        self.purposes.remove(index);
    }

    /// Drops the settled-account record of `record.held[held]`, if any.
    fn remove_settled(&mut self, held: usize) {
        if let Some(index) = self.purposes.iter().position(|p| *p == Purpose::Settled(held)) {
            self.remove(index);
        }
    }

    /// Sets the settled-account record of `record.held[held]`, if any, to `units`.
    fn settle_only(&mut self, held: usize, units: u64) {
        if let Some(index) = self.purposes.iter().position(|p| *p == Purpose::Settled(held)) {
            self.transfers[index].set_amount(u128::from(units));
        }
    }
}

/// `transfers` as one linked chain: all or nothing.
fn linked(transfers: &[tb::Transfer]) -> Vec<tb::Transfer> {
    let last = transfers.len() - 1;
    (transfers.iter().enumerate())
        .map(|(i, t)| {
            let mut t = *t;
            let mut flags = t.flags();
            flags.set(tb::transfer::Flags::LINKED, i < last);
            t.set_flags(flags);
            t
        })
        .collect()
}

/// The units by which the actual of `held` exceeds its reservation.
fn overage_units(request: &CompleteRequest, held: &HeldRequirement) -> u64 {
    let actual = (request.actuals().iter())
        .find(|a| a.key == held.key)
        .expect("an overage has an actual");
    actual.actual_amount - held.amount
}

/// Every actual must name a rolling key the lease reserved
/// ([`decision::check_actual`]).
fn check_actuals(lease: LeaseId, request: &CompleteRequest, record: &LeaseRecord) -> Result<(), LimiterError> {
    for actual in request.actuals() {
        let held_kind = record.held.iter().find(|h| h.key == actual.key).map(|h| h.kind);
        decision::check_actual(lease, &actual.key, held_kind)?;
    }
    Ok(())
}

/// The transfers of one Complete and why each is sent, from the shared
/// reconcile plan ([`decision::reconcile`]), plus the overages that cannot be
/// reserved because their window is over (indexes into `record.held`), with
/// `elapsed_ms` of the window passed ([`TigerBeetleBackend::elapsed_ms`]). Not
/// linked: each transfer stands alone, so an expired reservation does not
/// block the rest.
fn complete_transfers(
    lease: LeaseId,
    request: &CompleteRequest,
    record: &LeaseRecord,
    elapsed_ms: u64,
) -> (Vec<tb::Transfer>, Vec<Purpose>, Vec<usize>) {
    let elapsed_seconds = elapsed_ms / 1000;
    let mut transfers = Vec::new();
    let mut purposes = Vec::new();
    let mut unreservable = Vec::new();
    for (i, held) in record.held.iter().enumerate() {
        let actual = request
            .actuals()
            .iter()
            .find(|a| a.key == held.key)
            .map(|a| a.actual_amount);
        let window_over = elapsed_seconds >= held.timeout_seconds;
        // What is left of the window, rounded up to TigerBeetle's whole seconds.
        let remaining = held.timeout_seconds.saturating_sub(elapsed_seconds).max(1);
        let bucket = held.kind == LimitKind::Bucket;
        match decision::reconcile(held.kind, held.amount, actual, window_over) {
            Reconcile::Keep => {}
            // A bucket's unused units go straight back to it; its extra units
            // are taken from it (docs/tigerbeetle-backend.md, "Buckets").
            Reconcile::Shrink { release } if bucket => {
                transfers.push(buckets::refund(lease, &held.key, release));
                purposes.push(Purpose::Refund);
            }
            Reconcile::Overage { extra } if bucket => {
                transfers.push(buckets::overage_take(lease, &held.key, extra));
                purposes.push(Purpose::Overage(i));
            }
            Reconcile::Release => {
                transfers.push(void(lease, held));
                purposes.push(Purpose::Void(i));
            }
            Reconcile::Shrink { release } => {
                transfers.push(void(lease, held));
                purposes.push(Purpose::Void(i));
                if release < held.amount {
                    transfers.push(rereserve(lease, held, held.amount - release, remaining));
                    purposes.push(Purpose::Shrink(i));
                }
            }
            Reconcile::Overage { extra } => {
                transfers.push(rereserve(lease, held, extra, remaining));
                purposes.push(Purpose::Overage(i));
            }
            Reconcile::OverageAfterWindow { .. } => unreservable.push(i),
        }
    }
    (transfers, purposes, unreservable)
}

/// True for a transfer of this lease's Complete that exists with another
/// amount or timeout: a Complete of an earlier version, which wrote no
/// completion record, with other actuals, got there first. Its
/// reconciliation stands; this one changes nothing more.
fn written_elsewhere(kind: Kind) -> bool {
    matches!(kind, Kind::ExistsWithDifferentAmount | Kind::ExistsWithDifferentTimeout)
}

/// Voids the reservation of `held` by its deterministic id.
fn void(lease: LeaseId, held: &HeldRequirement) -> tb::Transfer {
    tb::Transfer::new(ids::void_transfer_id(lease, &held.key))
        .with_pending_id(held.reservation_id)
        .with_flags(tb::transfer::Flags::VOID_PENDING_TRANSFER)
        .with_user_data_128(lease.to_u128())
}

/// The pending record of `units` that `lease` holds on the period key `key` for
/// `seconds` more, on the key's settled account: it limits nothing (the account is
/// unconstrained) and ends, as the hold, by timing out.
fn settled_transfer(lease: LeaseId, key: &LimitKey, units: u64, seconds: u64) -> tb::Transfer {
    let timeout = u32::try_from(seconds).expect("at most a validated period");
    tb::Transfer::new(ids::settled_transfer_id(lease, key))
        .with_debit_account_id(ids::settled_account_id(key))
        .with_credit_account_id(ids::operator_account_id())
        .with_amount(u128::from(units))
        .with_ledger(ids::LEDGER_LIMITS)
        .with_code(ids::CODE_SETTLED)
        .with_flags(tb::transfer::Flags::PENDING)
        .with_timeout(timeout)
        .with_user_data_128(lease.to_u128())
}

/// A pending reservation of `amount` on `held`'s key for `remaining` seconds.
fn rereserve(lease: LeaseId, held: &HeldRequirement, amount: u64, remaining: u64) -> tb::Transfer {
    let timeout = u32::try_from(remaining).expect("remaining is at most a validated window");
    tb::Transfer::new(ids::rereserve_transfer_id(lease, &held.key))
        .with_debit_account_id(ids::resource_account_id(&held.key))
        .with_credit_account_id(ids::operator_account_id())
        .with_amount(u128::from(amount))
        .with_ledger(ids::LEDGER_LIMITS)
        .with_code(ids::CODE_LIMIT)
        .with_flags(tb::transfer::Flags::PENDING)
        .with_timeout(timeout)
        .with_user_data_128(lease.to_u128())
}
