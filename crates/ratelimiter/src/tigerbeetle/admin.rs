//! Provisioning (docs/tigerbeetle-backend.md, "Capacity changes"): accounts, capacity
//! changes, pending decreases, reports and health. This is the admin path: it reads
//! balances, and it runs one change at a time.
//!
//! Capacity is the resource account's posted balance (credits − debits); units
//! in use are its pending debits. Every change is computed from the balance read
//! just before it, so applying a state is idempotent and correct after a
//! restart against the same cluster, or against a fresh one.

use std::time::Duration;

use crate::decision;
use crate::{DefinitionError, LimitDefinition, LimitKey, LimitReport, LimitState, LimitStatus, LimiterError, Overage};
use tigerbeetle_unofficial as tb;

use super::backend::{unavailable, TigerBeetleBackend, HEALTH_TIMEOUT_MS, LIMITS_MAX};
use super::definition_log::RecordKind;
use super::ids;
use super::pool::PoolError;

use tb::error::CreateAccountErrorKind as AccountKind;
use tb::error::CreateTransferErrorKind as Kind;

/// Accounts looked up per request on the admin path: small enough for the
/// request size of a `--development` cluster.
pub const LOOKUP_CHUNK_ACCOUNTS: usize = 128;
/// How often a funding transfer is recomputed when another server moved the same
/// balance at the same moment, before giving up.
pub const FUND_ATTEMPTS_MAX: u32 = 4;
/// The most attempts of one decrease: each failed attempt is a race lost to a
/// reservation between the balance read and the transfer, rare at the
/// decrease task's pace; past this the key stays decreasing and it is logged.
pub const DECREASE_ATTEMPTS_MAX: u64 = 64;

/// The posted and pending debits and credits of one account.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Balance {
    credits_posted: u128,
    debits_posted: u128,
    debits_pending: u128,
}

impl Balance {
    fn of(account: &tb::Account) -> Self {
        Self {
            credits_posted: account.credits_posted(),
            debits_posted: account.debits_posted(),
            debits_pending: account.debits_pending(),
        }
    }

    /// The capacity a resource account holds: its posted net credit.
    fn capacity(&self) -> u128 {
        self.credits_posted.saturating_sub(self.debits_posted)
    }

    /// What a new reservation or a defund could take now.
    fn available(&self) -> u128 {
        self.capacity().saturating_sub(self.debits_pending)
    }
}

impl TigerBeetleBackend {
    /// Defines a limit for the whole fleet: its accounts first, then a record
    /// of the definition as requested in the cluster's log, then the account
    /// funded to the capacity of the state the log now holds
    /// (docs/tigerbeetle-backend.md, "Shared definitions").
    pub(super) async fn apply_limit_state(&self, state: &LimitState) -> Result<(), LimiterError> {
        let _admin = self.admin.lock().await;
        let definition = state.definition();
        let key = definition.key();
        let current = self.versioned(key);
        match &current {
            Some(existing) if existing.state.definition().kind() != definition.kind() => {
                return Err(DefinitionError::KindChange {
                    key: key.clone(),
                    existing: existing.state.definition().kind(),
                    requested: definition.kind(),
                }
                .into());
            }
            Some(_) => {}
            None if self.definitions.read().expect("definitions lock").len() >= LIMITS_MAX => {
                return Err(decision::limits_full(LIMITS_MAX));
            }
            None => {}
        }
        self.create_accounts(definition).await?;
        let requested = match state.status() {
            LimitStatus::Active => definition.clone(),
            LimitStatus::Decreasing => definition.with_capacity(state.pending_decrease_to())?,
        };
        let previous_version = current.map_or(0, |c| c.version);
        self.write_record(&LimitState::active(requested), RecordKind::Put, previous_version)
            .await?;
        let latest = self.state_of(key).ok_or_else(|| {
            LimiterError::Conflict(format!("limit {key}: a concurrent definition of another kind won"))
        })?;
        self.fund_for(&latest).await
    }

    /// Funds the resource account up to what `state` needs: its capacity when
    /// active, its target when decreasing (the periodic task moves what lies
    /// above the target once usage allows). Never takes capacity away: only a
    /// decrease, carried out once, does.
    async fn fund_for(&self, state: &LimitState) -> Result<(), LimiterError> {
        let key = state.definition().key();
        let wanted = match state.status() {
            LimitStatus::Active => state.definition().capacity(),
            LimitStatus::Decreasing => state.pending_decrease_to(),
        };
        let balance = self.resource_balance(key).await?;
        if balance.capacity() < u128::from(wanted) {
            self.fund(key, balance, u128::from(wanted)).await?;
        } else if state.status() == LimitStatus::Active && balance.capacity() > u128::from(wanted) {
            // More than an active state says: a cluster written by an older
            // version or by hand. Reported, not corrected behind the operator's back.
            tracing::warn!(%key, capacity = wanted, funded = %balance.capacity(),
                "the resource account holds more than the limit's capacity; define a lower capacity to decrease it");
        }
        Ok(())
    }

    /// Creates accounts; existing ones are fine.
    pub(super) async fn create_accounts_checked(
        &self,
        accounts: Vec<tb::Account>,
        what: &'static str,
    ) -> Result<(), LimiterError> {
        let slot = self.admin_slot().await?;
        let result = self
            .pool
            .run(slot, self.timeout, move |client| async move {
                match client.create_accounts(accounts).await {
                    Ok(()) => Ok(Vec::new()),
                    Err(tb::error::CreateAccountsError::Send(e)) => Err(e),
                    Err(tb::error::CreateAccountsError::Api(api)) => {
                        Ok(api.as_slice().iter().map(|f| f.kind()).collect::<Vec<_>>())
                    }
                    Err(other) => unreachable!("unknown create_accounts error {other:?}"),
                }
            })
            .await
            .map_err(|e| unavailable(&e, what))?;
        match result.into_iter().find(|kind| !matches!(kind, AccountKind::Exists)) {
            None => Ok(()),
            Some(kind) => {
                tracing::error!(what, code = ?kind, "creating accounts failed");
                Err(LimiterError::Backend(format!("create accounts ({what}): {kind:?}")))
            }
        }
    }

    /// Creates the operator, resource and (for `overage: debt`) debt accounts,
    /// and the definition log's accounts; existing ones are fine.
    async fn create_accounts(&self, definition: &LimitDefinition) -> Result<(), LimiterError> {
        let mut accounts = vec![ids::operator_account(), ids::resource_account(definition.key())];
        if definition.overage() == Overage::Debt {
            accounts.push(ids::debt_account(definition.key()));
        }
        accounts.extend(super::definition_log::log_accounts());
        accounts.extend(ids::lease_marker_accounts());
        self.create_accounts_checked(accounts, "limit").await
    }

    /// Raises the resource account of `key` from `balance` to `wanted`,
    /// re-reading when another writer moved it concurrently.
    async fn fund(&self, key: &LimitKey, mut balance: Balance, wanted: u128) -> Result<(), LimiterError> {
        for _ in 0..FUND_ATTEMPTS_MAX {
            if balance.capacity() >= wanted {
                return Ok(());
            }
            let transfer = tb::Transfer::new(ids::fund_transfer_id(
                key,
                balance.credits_posted,
                balance.debits_posted,
            ))
            .with_debit_account_id(ids::operator_account_id())
            .with_credit_account_id(ids::resource_account_id(key))
            .with_amount(wanted - balance.capacity())
            .with_ledger(ids::LEDGER_LIMITS)
            .with_code(ids::CODE_FUND);
            match self.admin_transfer(transfer).await? {
                None | Some(Kind::Exists) => return Ok(()),
                Some(Kind::ExistsWithDifferentAmount) => balance = self.resource_balance(key).await?,
                Some(kind) => {
                    tracing::error!(key = %key, code = ?kind, "funding failed");
                    return Err(LimiterError::Backend(format!("fund transfer: {kind:?}")));
                }
            }
        }
        Err(LimiterError::Conflict(format!(
            "limit {key}: capacity changed concurrently, retry"
        )))
    }

    /// Carries out the decrease of a state of version `version` to `target` if
    /// usage allows: true once the account holds at most the target, whoever
    /// moved it.
    ///
    /// Exactly once across a fleet: attempt `k` of a decrease has the id
    /// `xfer:decrease:<key>:<version>:<k>`, and attempt `k + 1` is only sent
    /// once attempt `k` is known to have failed (`id_already_failed`), which a
    /// failed id stays for ever. So at most one attempt ever posts, and a
    /// server that finds `exists` knows another one carried it out.
    async fn carry_out_decrease(&self, key: &LimitKey, version: u64, target: u128) -> Result<bool, LimiterError> {
        let balance = self.resource_balance(key).await?;
        if balance.capacity() < target {
            // A cluster formatted anew: fund the target, which applies the decrease.
            self.fund(key, balance, target).await?;
            return Ok(true);
        }
        if balance.capacity() == target {
            return Ok(true);
        }
        let delta = balance.capacity() - target;
        if balance.available() < delta {
            return Ok(false);
        }
        for attempt in 0..DECREASE_ATTEMPTS_MAX {
            let transfer = tb::Transfer::new(ids::decrease_transfer_id(key, version, attempt))
                .with_debit_account_id(ids::resource_account_id(key))
                .with_credit_account_id(ids::operator_account_id())
                .with_amount(delta)
                .with_ledger(ids::LEDGER_LIMITS)
                .with_code(ids::CODE_DEFUND);
            match self.admin_transfer(transfer).await? {
                None | Some(Kind::Exists | Kind::ExistsWithDifferentAmount) => return Ok(true),
                Some(Kind::IdAlreadyFailed) => continue,
                // Usage grew between the read and the transfer: not yet.
                Some(Kind::ExceedsCredits) => return Ok(false),
                Some(kind) => {
                    tracing::error!(key = %key, code = ?kind, "decrease transfer failed");
                    return Err(LimiterError::Backend(format!("decrease transfer: {kind:?}")));
                }
            }
        }
        tracing::error!(%key, attempts = DECREASE_ATTEMPTS_MAX, "decrease attempts exhausted; the key stays decreasing");
        Ok(false)
    }

    /// Carries out every pending decrease of the fleet that usage allows, each
    /// exactly once whichever servers run this, and records it in the log.
    pub(super) async fn apply_decreases(&self) -> Result<Vec<LimitState>, LimiterError> {
        // Nothing to do while no key is decreasing as far as this server
        // knows, and nothing is sent: an idle server's check costs the cluster
        // nothing. A decrease started elsewhere reaches this view by the
        // periodic read of the log.
        if !self.any_decreasing() {
            return Ok(Vec::new());
        }
        let _admin = self.admin.lock().await;
        // Act on the fleet's latest states, not on what this server read a
        // refresh ago: a decrease superseded meanwhile is not carried out.
        self.refresh_definitions().await?;
        let decreasing: Vec<_> = self
            .all_states()
            .into_iter()
            .filter(|v| v.state.status() == LimitStatus::Decreasing)
            .collect();
        let mut applied = Vec::new();
        for versioned in decreasing {
            let state = &versioned.state;
            let key = state.definition().key();
            let target = u128::from(state.pending_decrease_to());
            if !self.carry_out_decrease(key, versioned.version, target).await? {
                continue;
            }
            let next = state.with_decrease_applied();
            self.write_record(&next, RecordKind::DecreaseApplied, versioned.version)
                .await?;
            if self.state_of(key).as_ref() == Some(&next) {
                tracing::info!(key = %key, capacity = next.definition().capacity(), "decrease applied");
                applied.push(next);
            }
        }
        Ok(applied)
    }

    /// Reports `states` with `in_use` and `debt` read from their accounts.
    pub(super) async fn reports_of(&self, states: Vec<LimitState>) -> Result<Vec<LimitReport>, LimiterError> {
        let mut reports = Vec::with_capacity(states.len());
        for chunk in states.chunks(LOOKUP_CHUNK_ACCOUNTS / 2) {
            let mut accounts = Vec::with_capacity(chunk.len() * 2);
            for state in chunk {
                accounts.push(ids::resource_account_id(state.definition().key()));
                accounts.push(ids::debt_account_id(state.definition().key()));
            }
            let balances = self.balances(accounts).await?;
            for (state, pair) in chunk.iter().zip(balances.chunks(2)) {
                let resource = pair[0].unwrap_or_default();
                let debt = pair[1].unwrap_or_default();
                reports.push(LimitReport {
                    state: state.clone(),
                    in_use: saturate(resource.debits_pending),
                    debt: saturate(debt.debits_posted.saturating_sub(debt.credits_posted)),
                });
            }
        }
        Ok(reports)
    }

    /// Answers at once while a session is stalled (a request unanswered for
    /// [`super::pool::STALL_MS`]); otherwise looks up the operator account,
    /// waiting at most [`HEALTH_TIMEOUT_MS`]. Either way the answer is the
    /// truth within 2 s of a change.
    pub(super) async fn check_health(&self) -> Result<(), LimiterError> {
        if self.pool.stalled() {
            tracing::debug!("health: a TigerBeetle session is stalled");
            return Err(LimiterError::Unavailable {
                retry_after_ms: super::backend::UNAVAILABLE_RETRY_MS,
            });
        }
        let timeout = Duration::from_millis(HEALTH_TIMEOUT_MS).min(self.timeout);
        let slot = tokio::time::timeout(timeout, self.pool.slot())
            .await
            .map_err(|_| unavailable(&PoolError::Busy, "health"))?;
        self.pool
            .run(slot, timeout, |client| async move {
                client.lookup_accounts(vec![ids::operator_account_id()]).await
            })
            .await
            .map(|_| ())
            .map_err(|e| unavailable(&e, "health"))
    }

    /// The balance of the resource account of `key`; an account that does not
    /// exist (yet) has none.
    async fn resource_balance(&self, key: &LimitKey) -> Result<Balance, LimiterError> {
        let balances = self.balances(vec![ids::resource_account_id(key)]).await?;
        Ok(balances[0].unwrap_or_default())
    }

    /// The balances of `accounts`, in order; `None` for accounts not found.
    async fn balances(&self, accounts: Vec<u128>) -> Result<Vec<Option<Balance>>, LimiterError> {
        assert!(accounts.len() <= LOOKUP_CHUNK_ACCOUNTS, "lookup larger than a chunk");
        let wanted = accounts.clone();
        let slot = self.admin_slot().await?;
        let found = self
            .pool
            .run(slot, self.timeout, move |client| async move {
                client.lookup_accounts(accounts).await
            })
            .await
            .map_err(|e| unavailable(&e, "lookup accounts"))?;
        Ok(wanted
            .iter()
            .map(|id| found.iter().find(|a| a.id() == *id).map(Balance::of))
            .collect())
    }

    /// Sends one posted admin transfer; `None` when it succeeded.
    async fn admin_transfer(&self, transfer: tb::Transfer) -> Result<Option<Kind>, LimiterError> {
        let slot = self.admin_slot().await?;
        let failures = self
            .pool
            .run(slot, self.timeout, move |client| {
                super::submitter::create_transfers(client, vec![transfer])
            })
            .await
            .map_err(|e| unavailable(&e, "admin transfer"))?;
        Ok(failures.first().map(|f| f.kind()))
    }

    /// A pool slot for the rare paths (admin, the lookup of a retried lease): it
    /// waits (bounded) rather than failing at once, since these calls should not
    /// lose to a burst, and with one session the submitter holds the only slot
    /// whenever a batch is out.
    pub(super) async fn admin_slot(&self) -> Result<super::pool::Slot, LimiterError> {
        tokio::time::timeout(self.timeout, self.pool.slot())
            .await
            .map_err(|_| unavailable(&PoolError::Busy, "admin"))
    }
}

fn saturate(value: u128) -> u64 {
    u64::try_from(value).unwrap_or(u64::MAX)
}
