//! Provisioning (spec §9.3, decisions §6): accounts, capacity changes, pending
//! decreases, reports and health. This is the admin path: it reads balances,
//! and it runs one change at a time.
//!
//! Capacity is the resource account's posted balance (credits − debits); units
//! in use are its pending debits. Every change is computed from the balance read
//! just before it, so applying a state is idempotent and correct after a
//! restart against the same cluster, or against a fresh one.

use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::decision;
use crate::{DefinitionError, LimitDefinition, LimitKey, LimitReport, LimitState, LimitStatus, LimiterError, Overage};
use tigerbeetle_unofficial as tb;

use super::backend::{unavailable, TigerBeetleBackend, HEALTH_TIMEOUT_MS, LIMITS_MAX};
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
    pub(super) async fn apply_limit_state(&self, state: &LimitState) -> Result<(), LimiterError> {
        let _admin = self.admin.lock().await;
        let definition = state.definition();
        let key = definition.key();
        if let Some(existing) = self.state_of(key) {
            if existing.definition().kind() != definition.kind() {
                return Err(DefinitionError::KindChange {
                    key: key.clone(),
                    existing: existing.definition().kind(),
                    requested: definition.kind(),
                }
                .into());
            }
        } else if self.limits.read().expect("limits lock poisoned").len() >= LIMITS_MAX {
            return Err(decision::limits_full(LIMITS_MAX));
        }
        self.create_accounts(definition).await?;
        let balance = self.resource_balance(key).await?;
        let wanted = match state.status() {
            LimitStatus::Active => definition.capacity(),
            // A decrease never funds beyond its target; the periodic task moves
            // whatever lies above it once usage allows.
            LimitStatus::Decreasing => state.pending_decrease_to(),
        };
        let capacity = u128::from(wanted);
        if balance.capacity() < capacity {
            self.fund(key, balance, capacity).await?;
        } else if state.status() == LimitStatus::Active && balance.capacity() > capacity {
            // Only reachable when the cluster holds more than an active state
            // says (another writer): take it back now or refuse.
            if !self.defund(key, balance, capacity).await? {
                return Err(LimiterError::Conflict(format!(
                    "limit {key}: usage is above capacity {wanted}; lower it through a decrease"
                )));
            }
        }
        self.limits
            .write()
            .expect("limits lock poisoned")
            .insert(key.clone(), state.clone());
        Ok(())
    }

    /// Creates the operator, resource and (for `overage: debt`) debt accounts;
    /// existing ones are fine.
    async fn create_accounts(&self, definition: &LimitDefinition) -> Result<(), LimiterError> {
        let mut accounts = vec![ids::operator_account(), ids::resource_account(definition.key())];
        if definition.overage() == Overage::Debt {
            accounts.push(ids::debt_account(definition.key()));
        }
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
            .map_err(|e| unavailable(&e, "create accounts"))?;
        match result.into_iter().find(|kind| !matches!(kind, AccountKind::Exists)) {
            None => Ok(()),
            Some(kind) => {
                tracing::error!(key = %definition.key(), code = ?kind, "creating accounts failed");
                Err(LimiterError::Backend(format!("create accounts: {kind:?}")))
            }
        }
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

    /// Moves `balance.capacity() - target` back to the operator if usage allows;
    /// false when it does not (yet).
    async fn defund(&self, key: &LimitKey, balance: Balance, target: u128) -> Result<bool, LimiterError> {
        let delta = balance.capacity() - target;
        if balance.available() < delta {
            return Ok(false);
        }
        let attempt = self.defund_attempts.fetch_add(1, Ordering::Relaxed);
        let id = ids::defund_transfer_id(key, balance.credits_posted, balance.debits_posted, attempt);
        let transfer = tb::Transfer::new(id)
            .with_debit_account_id(ids::resource_account_id(key))
            .with_credit_account_id(ids::operator_account_id())
            .with_amount(delta)
            .with_ledger(ids::LEDGER_LIMITS)
            .with_code(ids::CODE_DEFUND);
        match self.admin_transfer(transfer).await? {
            None => Ok(true),
            // Usage grew between the read and the transfer.
            Some(Kind::ExceedsCredits) => Ok(false),
            Some(kind) => {
                tracing::error!(key = %key, code = ?kind, "defunding failed");
                Err(LimiterError::Backend(format!("defund transfer: {kind:?}")))
            }
        }
    }

    pub(super) async fn apply_decreases(&self) -> Result<Vec<LimitState>, LimiterError> {
        let _admin = self.admin.lock().await;
        let decreasing: Vec<LimitState> = self
            .limits
            .read()
            .expect("limits lock poisoned")
            .values()
            .filter(|s| s.status() == LimitStatus::Decreasing)
            .cloned()
            .collect();
        let mut applied = Vec::new();
        for chunk in decreasing.chunks(LOOKUP_CHUNK_ACCOUNTS) {
            let keys: Vec<&LimitKey> = chunk.iter().map(|s| s.definition().key()).collect();
            let balances = self
                .balances(keys.iter().map(|k| ids::resource_account_id(k)).collect())
                .await?;
            for (state, balance) in chunk.iter().zip(balances) {
                let key = state.definition().key();
                let balance = balance.unwrap_or_default();
                let target = u128::from(state.pending_decrease_to());
                if balance.capacity() < target {
                    // A cluster formatted anew: fund the target, which applies the decrease.
                    self.fund(key, balance, target).await?;
                }
                let done = balance.capacity() <= target || self.defund(key, balance, target).await?;
                if done {
                    let next = state.with_decrease_applied();
                    tracing::info!(key = %key, capacity = next.definition().capacity(), "decrease applied");
                    self.limits
                        .write()
                        .expect("limits lock poisoned")
                        .insert(key.clone(), next.clone());
                    applied.push(next);
                }
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

    pub(super) async fn check_health(&self) -> Result<(), LimiterError> {
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
