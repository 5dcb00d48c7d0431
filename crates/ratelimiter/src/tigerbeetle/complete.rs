//! Complete (docs/tigerbeetle-backend.md, "Complete"; docs/decisions.md, "Complete"):
//! void concurrency holds, shrink rolling reservations to the actual usage for the rest
//! of their window, and reserve (or record as debt) usage beyond the reservation.
//!
//! Every transfer has a deterministic id, so a retried Complete finds `exists`
//! and changes nothing. Voids of reservations that expired, were voided before
//! or never existed (an unknown reserve outcome) count as released.

use crate::decision::{self, OverageFallback, Reconcile};
use crate::{CompleteRequest, LeaseId, LimiterError};
use tigerbeetle_unofficial as tb;

use super::backend::{unavailable, TigerBeetleBackend};
use super::ids;
use super::lease_cache::{HeldRequirement, LeaseRecord};
use super::submitter::Failure;

use tb::error::CreateTransferErrorKind as Kind;

/// Why a transfer of a Complete was sent, to read its result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Purpose {
    /// Releases a reservation.
    Void,
    /// Re-reserves the actual amount after a void.
    Shrink,
    /// Reserves usage beyond the reservation; `usize` is the held requirement.
    Overage(usize),
}

impl TigerBeetleBackend {
    pub(super) async fn complete_lease(&self, request: &CompleteRequest) -> Result<(), LimiterError> {
        let lease = request.lease_id();
        let Some(mut record) = self.lease_record(lease).await? else {
            // Never granted, or completed already: nothing to reconcile.
            return Ok(());
        };
        if record.completed {
            return Ok(());
        }
        check_actuals(lease, request, &record)?;
        let now = self.clock.now_unix_ms();
        let (transfers, purposes, mut overages) = complete_transfers(lease, request, &record, now);
        if !transfers.is_empty() {
            let failures = self
                .submitter
                .submit(transfers)
                .await
                .map_err(|e| unavailable(&e, "complete"))?;
            overages.extend(complete_failures(lease, &record, &purposes, &failures)?);
        }
        self.record_overages(lease, &record, request, &overages).await?;
        record.completed = true;
        record.held = Vec::new();
        self.leases.update(lease, record);
        Ok(())
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

    /// Records as debt, or drops and counts, the overage that could not be
    /// reserved (`overages` indexes `record.held`).
    async fn record_overages(
        &self,
        lease: LeaseId,
        record: &LeaseRecord,
        request: &CompleteRequest,
        overages: &[usize],
    ) -> Result<(), LimiterError> {
        let mut debts = Vec::new();
        let mut debt_units = Vec::new();
        for held in overages.iter().map(|i| &record.held[*i]) {
            let actual = request
                .actuals()
                .iter()
                .find(|a| a.key == held.key)
                .expect("overage has an actual");
            let diff = actual.actual_amount - held.amount;
            let fallback = self.state_of(&held.key).map_or(OverageFallback::Dropped, |s| {
                decision::overage_fallback(s.definition().overage())
            });
            if fallback == OverageFallback::Dropped {
                tracing::info!(lease = %lease, key = %held.key, units = diff, "overage dropped (overage: none)");
                self.overage_dropped_units
                    .fetch_add(diff, std::sync::atomic::Ordering::Relaxed);
                continue;
            }
            debt_units.push(diff);
            debts.push(
                tb::Transfer::new(ids::debt_transfer_id(lease, &held.key))
                    .with_debit_account_id(ids::debt_account_id(&held.key))
                    .with_credit_account_id(ids::operator_account_id())
                    .with_amount(u128::from(diff))
                    .with_ledger(ids::LEDGER_LIMITS)
                    .with_code(ids::CODE_DEBT)
                    .with_user_data_128(lease.to_u128()),
            );
        }
        if debts.is_empty() {
            return Ok(());
        }
        let failures = self
            .submitter
            .submit(debts)
            .await
            .map_err(|e| unavailable(&e, "debt"))?;
        match failures
            .iter()
            .find(|f| !matches!(f.kind(), Kind::Exists) && !written_elsewhere(f.kind()))
        {
            None => {
                // A debt that exists already was recorded, and counted, by an
                // earlier attempt of this Complete, or by another Complete of the
                // lease on another server.
                let recorded: u64 = (debt_units.iter().enumerate())
                    .filter(|(i, _)| !failures.iter().any(|f| f.index == *i))
                    .map(|(_, units)| units)
                    .sum();
                self.overage_debt_units
                    .fetch_add(recorded, std::sync::atomic::Ordering::Relaxed);
                Ok(())
            }
            Some(f) => {
                tracing::error!(lease = %lease, code = ?f.kind(), "recording debt failed");
                Err(LimiterError::Backend(format!("debt transfer failed: {:?}", f.kind())))
            }
        }
    }
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
/// reserved because their window is over (indexes into `record.held`). Not
/// linked: each transfer stands alone, so an expired reservation does not
/// block the rest.
fn complete_transfers(
    lease: LeaseId,
    request: &CompleteRequest,
    record: &LeaseRecord,
    now: u64,
) -> (Vec<tb::Transfer>, Vec<Purpose>, Vec<usize>) {
    let elapsed_seconds = now.saturating_sub(record.reserved_at_unix_ms) / 1000;
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
        match decision::reconcile(held.kind, held.amount, actual, window_over) {
            Reconcile::Keep => {}
            Reconcile::Release => {
                transfers.push(void(lease, held));
                purposes.push(Purpose::Void);
            }
            Reconcile::Shrink { release } => {
                transfers.push(void(lease, held));
                purposes.push(Purpose::Void);
                if release < held.amount {
                    transfers.push(rereserve(lease, held, held.amount - release, remaining));
                    purposes.push(Purpose::Shrink);
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

/// Reads the results of a Complete's transfers; returns the overages that could
/// not be reserved (indexes into `record.held`).
fn complete_failures(
    lease: LeaseId,
    record: &LeaseRecord,
    purposes: &[Purpose],
    failures: &[Failure],
) -> Result<Vec<usize>, LimiterError> {
    let mut overages = Vec::new();
    for failure in failures {
        let purpose = purposes[failure.index];
        let kind = failure.kind();
        let released = matches!(
            kind,
            Kind::Exists
                | Kind::PendingTransferExpired
                | Kind::PendingTransferAlreadyVoided
                | Kind::PendingTransferNotFound
        );
        match purpose {
            Purpose::Void if released => {}
            // The shrunk reservation is not needed for safety: what it re-reserves
            // was just freed. It can only fail when the void did not free it, or
            // when another Complete of the lease (on another server, whose own
            // cache still had the lease open) wrote its own first.
            Purpose::Shrink
                if matches!(kind, Kind::Exists | Kind::ExceedsCredits | Kind::IdAlreadyFailed)
                    || written_elsewhere(kind) =>
            {
                tracing::debug!(lease = %lease, code = ?kind, "shrunk reservation not created");
            }
            Purpose::Overage(_) if matches!(kind, Kind::Exists) || written_elsewhere(kind) => {}
            Purpose::Overage(i) if matches!(kind, Kind::ExceedsCredits | Kind::IdAlreadyFailed) => overages.push(i),
            _ => {
                tracing::error!(lease = %lease, code = ?kind, purpose = ?purpose, held = record.held.len(),
                    "unexpected TigerBeetle result in complete");
                return Err(LimiterError::Backend(format!("complete transfer failed: {kind:?}")));
            }
        }
    }
    Ok(overages)
}

/// True for a transfer of this lease's Complete that exists with another
/// amount or timeout: another Complete of the same lease, with other actuals,
/// got there first (a caller that completed twice through two servers). The
/// first one's reconciliation stands; this one changes nothing more.
fn written_elsewhere(kind: Kind) -> bool {
    matches!(kind, Kind::ExistsWithDifferentAmount | Kind::ExistsWithDifferentTimeout)
}

/// Voids the reservation of `held` by its deterministic id.
fn void(lease: LeaseId, held: &HeldRequirement) -> tb::Transfer {
    tb::Transfer::new(ids::void_transfer_id(lease, &held.key))
        .with_pending_id(ids::reserve_transfer_id(lease, &held.key))
        .with_flags(tb::transfer::Flags::VOID_PENDING_TRANSFER)
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
