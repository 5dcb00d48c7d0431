//! Reserve (spec §9.4, decisions §3 and §8): one linked chain of pending
//! transfers per lease, resource → operator, sent without any read. TigerBeetle
//! applies the chain all or nothing and refuses a transfer that would debit a
//! resource account beyond its credits, so nothing is ever over-admitted.

use crate::decision;
use crate::{Denial, LeaseId, LimitKey, LimitState, LimiterError, ReserveOutcome, ReserveRequest};
use tigerbeetle_unofficial as tb;

use super::backend::{unavailable, TigerBeetleBackend};
use super::ids;
use super::lease_cache::{fingerprint, HeldRequirement, LeaseRecord};
use super::pool::PoolError;
use super::submitter::Failure;

use tb::error::CreateTransferErrorKind as Kind;

/// What the backend decided before sending anything.
enum Plan {
    /// Send this chain; remember this record.
    Send(Vec<tb::Transfer>, LeaseRecord),
    /// Answer at once.
    Answer(ReserveOutcome),
}

impl TigerBeetleBackend {
    pub(super) async fn reserve_lease(&self, request: &ReserveRequest) -> Result<ReserveOutcome, LimiterError> {
        let now = self.clock.now_unix_ms();
        let (chain, record) = match self.plan_reserve(request, now)? {
            Plan::Answer(outcome) => return Ok(outcome),
            Plan::Send(chain, record) => (chain, record),
        };
        let lease = request.lease_id();
        let known = self.leases.get(lease);
        // Remembered before sending: if the outcome is unknown, Complete must
        // still void by id (pessimistic accounting, decisions §8).
        self.leases.insert(lease, record.clone());
        let failures = match self.submitter.submit(chain).await {
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
        self.reserve_result(request, record, &failures, now).await
    }

    /// Checks the request against the definitions: unknown keys are errors; a
    /// lease TigerBeetle denied stays denied; a lease already granted is granted again; an amount above capacity or a
    /// decreasing limit are denials that send nothing, so they do not burn the
    /// lease id (TigerBeetle never saw it); otherwise the chain.
    fn plan_reserve(&self, request: &ReserveRequest, now: u64) -> Result<Plan, LimiterError> {
        let lease = request.lease_id();
        let definitions = self.definitions_of(request)?;
        if self.denied.contains(lease) {
            return Ok(Plan::Answer(ReserveOutcome::Denied(Denial::LeaseAlreadyFailed)));
        }
        if let Some(record) = self.leases.get(lease).filter(|r| r.confirmed) {
            return self.replay(request, &record).map(Plan::Answer);
        }
        let requirements = definitions
            .iter()
            .zip(request.requirements())
            .map(|(s, r)| (s, r.amount));
        if let Some(denial) = decision::standing_denial(requirements, self.decrease_retry_ms) {
            return Ok(Plan::Answer(ReserveOutcome::Denied(denial)));
        }
        let chain = reserve_chain(request, &definitions, self.window_margin_ms);
        let held = request
            .requirements()
            .iter()
            .zip(&definitions)
            .map(|(r, s)| HeldRequirement {
                key: r.key.clone(),
                amount: r.amount,
                kind: s.definition().kind(),
                timeout_seconds: u64::from(timeout_seconds(s, self.window_margin_ms)),
            })
            .collect();
        let record = LeaseRecord {
            reserved_at_unix_ms: now,
            held,
            fingerprint: fingerprint(request.requirements().iter().map(|r| (&r.key, r.amount))),
            confirmed: false,
            completed: false,
        };
        Ok(Plan::Send(chain, record))
    }

    /// The state of every requirement's limit, or the first unknown key.
    fn definitions_of(&self, request: &ReserveRequest) -> Result<Vec<LimitState>, LimiterError> {
        let limits = self.limits.read().expect("limits lock poisoned");
        request
            .requirements()
            .iter()
            .map(|r| match limits.get(&r.key) {
                Some(state) => Ok(state.clone()),
                None => Err(LimiterError::UnknownKey(r.key.clone())),
            })
            .collect()
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

    /// Turns TigerBeetle's answer to the chain into the outcome (decisions §8).
    async fn reserve_result(
        &self,
        request: &ReserveRequest,
        mut record: LeaseRecord,
        failures: &[Failure],
        now: u64,
    ) -> Result<ReserveOutcome, LimiterError> {
        let lease = request.lease_id();
        let keys = || request.requirements().iter().map(|r| &r.key);
        if failures.is_empty() {
            record.confirmed = true;
            self.leases.update(lease, record);
            self.retry.on_allowed(keys(), now);
            return Ok(ReserveOutcome::Allowed {
                reserved_at_unix_ms: now,
            });
        }
        if failures.iter().any(|f| matches!(f.kind(), Kind::IdAlreadyFailed)) {
            self.leases.remove(lease);
            self.denied.insert(lease);
            return Ok(ReserveOutcome::Denied(Denial::LeaseAlreadyFailed));
        }
        if let Some(failure) = failures.iter().find(|f| matches!(f.kind(), Kind::ExceedsCredits)) {
            self.leases.remove(lease);
            self.denied.insert(lease);
            let key = &request.requirements()[failure.index].key;
            // Limits are never removed, so a key just sent is still defined.
            let definition = self
                .state_of(key)
                .expect("a reserved key is defined")
                .definition()
                .clone();
            let retry_after_ms = self.retry.on_denied([&definition], now);
            return Ok(ReserveOutcome::Denied(Denial::InsufficientCapacity {
                key: key.clone(),
                retry_after_ms,
            }));
        }
        if failures
            .iter()
            .all(|f| matches!(f.kind(), Kind::Exists | Kind::LinkedEventFailed))
        {
            return self.reserve_existing(request, record).await;
        }
        if let Some(f) = failures.iter().find(|f| is_different_existing(f.kind())) {
            tracing::warn!(lease = %lease, code = ?f.kind(), "lease id reused with other requirements");
            return Err(decision::lease_reused(lease));
        }
        self.leases.remove(lease);
        let codes: Vec<String> = failures.iter().map(|f| format!("{}:{:?}", f.index, f.kind())).collect();
        tracing::error!(lease = %lease, codes = ?codes, "unexpected TigerBeetle results for a reserve chain");
        Err(LimiterError::Backend(format!(
            "reserve chain failed: {}",
            codes.join(",")
        )))
    }

    /// The chain, or part of it, exists already: a retry of a lease whose first
    /// answer was lost. Granted if every transfer of the chain exists (with the
    /// original time, which the first transfer carries), a conflict otherwise.
    async fn reserve_existing(
        &self,
        request: &ReserveRequest,
        mut record: LeaseRecord,
    ) -> Result<ReserveOutcome, LimiterError> {
        let lease = request.lease_id();
        let ids: Vec<u128> = request
            .requirements()
            .iter()
            .map(|r| ids::reserve_transfer_id(lease, &r.key))
            .collect();
        let first = ids[0];
        let expected = ids.len();
        let slot = self.admin_slot().await?;
        let found = self
            .pool
            .run(slot, self.timeout, move |client| async move {
                client.lookup_transfers(ids).await
            })
            .await
            .map_err(|e| unavailable(&e, "reserve lookup"))?;
        if found.len() != expected {
            self.leases.remove(lease);
            return Err(decision::lease_reused(lease));
        }
        if let Some(original) = found.iter().find(|t| t.id() == first) {
            let since_epoch = original
                .timestamp()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default();
            record.reserved_at_unix_ms = u64::try_from(since_epoch.as_millis()).unwrap_or(u64::MAX);
        }
        record.confirmed = true;
        let reserved_at_unix_ms = record.reserved_at_unix_ms;
        self.leases.update(lease, record);
        Ok(ReserveOutcome::Allowed { reserved_at_unix_ms })
    }
}

/// Result codes that mean "a transfer with this id exists with other fields".
fn is_different_existing(kind: Kind) -> bool {
    matches!(
        kind,
        Kind::ExistsWithDifferentFlags
            | Kind::ExistsWithDifferentPendingId
            | Kind::ExistsWithDifferentTimeout
            | Kind::ExistsWithDifferentDebitAccountId
            | Kind::ExistsWithDifferentCreditAccountId
            | Kind::ExistsWithDifferentAmount
            | Kind::ExistsWithDifferentUserData128
            | Kind::ExistsWithDifferentUserData64
            | Kind::ExistsWithDifferentUserData32
            | Kind::ExistsWithDifferentLedger
            | Kind::ExistsWithDifferentCode
    )
}

/// A reservation's TigerBeetle timeout, in whole seconds: the window plus its
/// margin (`default_margin_ms` when the definition gives none) rounded up, or the
/// hold timeout. Rounded up because a timeout runs from the cluster's timestamp,
/// a moment after our grant, and must never end before window plus margin.
pub(super) fn timeout_seconds(state: &LimitState, default_margin_ms: u64) -> u32 {
    let hold_ms = state.definition().hold_with_margin_ms(default_margin_ms);
    u32::try_from(hold_ms.div_ceil(1000)).expect("windows, margins and timeouts are validated to fit u32")
}

/// The linked chain of pending transfers of one lease: resource → operator per
/// requirement, timing out with the window plus margin (rolling) or hold timeout
/// (concurrency). Every transfer carries the lease in `user_data_128` for audits;
/// nothing in it depends on the time, so a retry sends the very same chain.
fn reserve_chain(request: &ReserveRequest, states: &[LimitState], default_margin_ms: u64) -> Vec<tb::Transfer> {
    let holds = request
        .requirements()
        .iter()
        .zip(states)
        .map(|(r, s)| (&r.key, r.amount, timeout_seconds(s, default_margin_ms)));
    lease_chain(request.lease_id(), holds)
}

/// The chain that reserves `holds` (key, amount, timeout in seconds) for
/// `lease`, exactly as the backend sends it: benchmarks send it straight with
/// the client library to compare against the backend.
pub fn lease_chain<'a>(
    lease: LeaseId,
    holds: impl ExactSizeIterator<Item = (&'a LimitKey, u64, u32)>,
) -> Vec<tb::Transfer> {
    assert!(holds.len() >= 1, "a lease holds at least one requirement");
    let last = holds.len() - 1;
    holds
        .enumerate()
        .map(|(i, (key, amount, timeout_seconds))| {
            let mut flags = tb::transfer::Flags::PENDING;
            if i < last {
                flags |= tb::transfer::Flags::LINKED;
            }
            tb::Transfer::new(ids::reserve_transfer_id(lease, key))
                .with_debit_account_id(ids::resource_account_id(key))
                .with_credit_account_id(ids::operator_account_id())
                .with_amount(u128::from(amount))
                .with_ledger(ids::LEDGER_LIMITS)
                .with_code(ids::CODE_LIMIT)
                .with_flags(flags)
                .with_timeout(timeout_seconds)
                .with_user_data_128(lease.to_u128())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::LimitDefinition;

    fn state(definition: LimitDefinition) -> LimitState {
        LimitState::active(definition)
    }

    #[test]
    fn timeouts_round_window_plus_margin_up_to_whole_seconds() {
        let key = LimitKey::new("k").unwrap();
        let rolling = LimitDefinition::rolling(key.clone(), 1, 10).unwrap();
        assert_eq!(timeout_seconds(&state(rolling.clone()), 0), 10, "no margin: the window");
        assert_eq!(
            timeout_seconds(&state(rolling.clone()), 50),
            11,
            "never shorter than window + margin"
        );
        assert_eq!(timeout_seconds(&state(rolling.clone()), 1000), 11);
        assert_eq!(timeout_seconds(&state(rolling.clone()), 1001), 12);
        let own = rolling.with_window_margin_ms(Some(0)).unwrap();
        assert_eq!(timeout_seconds(&state(own), 50), 10, "the definition's margin wins");
        let concurrency = LimitDefinition::concurrency(key, 1, 30).unwrap();
        assert_eq!(timeout_seconds(&state(concurrency), 50), 30, "timeouts take no margin");
    }
}
