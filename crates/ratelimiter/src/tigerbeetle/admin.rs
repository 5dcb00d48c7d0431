//! Provisioning (docs/tigerbeetle-backend.md, "Capacity changes"): accounts, capacity
//! changes, pending decreases, reports and health. This is the admin path: it reads
//! balances, and it runs one change at a time.
//!
//! Capacity is the resource account's posted balance (credits − debits); units
//! in use are its pending debits. A bucket's funded total is its burst, held by
//! its resource account (the level) and its taken account together
//! (docs/tigerbeetle-backend.md, "Buckets"). Every change is computed from the balance read
//! just before it, so applying a state is idempotent and correct after a
//! restart against the same cluster, or against a fresh one.

use std::time::Duration;

use crate::model::decision;
use crate::model::definition::{DefinitionError, LimitDefinition, LimitKind, LimitReport, LimitState, LimitStatus};
use crate::model::error::LimiterError;
use crate::model::key::LimitKey;
use tigerbeetle_unofficial as tb;

use super::buckets;
use super::definition_log::{self, RecordKind, Versioned};
use super::definitions::Claimed;
use super::ids;
use super::pool::PoolError;
use super::shared::{unavailable, Shared, HEALTH_TIMEOUT_MS, LIMITS_MAX};

use tb::error::CreateAccountErrorKind as AccountKind;
use tb::error::CreateTransferErrorKind as Kind;

/// Accounts looked up per request on the admin path: small enough for the
/// request size of a `--development` cluster.
pub const LOOKUP_CHUNK_ACCOUNTS: usize = 128;
/// How often a definition is written again when another record of its key
/// came first (the writer reads the log and computes anew each time), before
/// the PUT answers `409` (retry): each lost attempt is another writer's win,
/// so the fleet as a whole always progresses.
pub const WRITE_ATTEMPTS_MAX: u32 = 16;
/// The most attempts of one decrease: each failed attempt is a race lost to a
/// reservation between the balance read and the transfer, rare at the
/// decrease task's pace; past this the key stays decreasing and it is logged.
pub const DECREASE_ATTEMPTS_MAX: u64 = 64;

/// The posted and pending debits and credits of one account, and, for a
/// bucket's resource account, what its taken account holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Balance {
    credits_posted: u128,
    debits_posted: u128,
    debits_pending: u128,
    /// The net credit of the key's taken account (a bucket's units taken and
    /// not yet refilled; 0 for other kinds, which have none).
    taken: u128,
}

impl Balance {
    fn of(account: &tb::Account) -> Self {
        Self {
            credits_posted: account.credits_posted(),
            debits_posted: account.debits_posted(),
            debits_pending: account.debits_pending(),
            taken: 0,
        }
    }

    /// The net credit of an account (a taken account's units).
    fn net(&self) -> u128 {
        self.credits_posted.saturating_sub(self.debits_posted)
    }

    /// The capacity a resource account holds: its posted net credit, plus
    /// for a bucket what its taken account holds (R + T is the burst).
    fn capacity(&self) -> u128 {
        self.net() + self.taken
    }

    /// Units held by pending reservations (rolling and concurrency holds).
    pub(super) fn pending(&self) -> u128 {
        self.debits_pending
    }

    /// What a new reservation or a defund could take now: for a bucket, its level.
    pub(super) fn available(&self) -> u128 {
        self.net().saturating_sub(self.debits_pending)
    }

    /// Units in use: pending reservations, and a bucket's units taken and not
    /// yet refilled (its burst less its level).
    fn in_use(&self) -> u128 {
        self.debits_pending + self.taken
    }
}

impl Shared {
    /// Defines a limit for the whole fleet: its accounts first, then one
    /// claimed record of the definition as requested, linked with the funding
    /// its state needs (docs/tigerbeetle-backend.md, "Shared definitions").
    /// When another record of the key came first, the server reads the log
    /// again and computes anew, up to [`WRITE_ATTEMPTS_MAX`] times.
    pub(super) async fn apply_limit_state(&self, state: &LimitState) -> Result<(), LimiterError> {
        let _admin = self.admin.lock().await;
        let definition = state.definition();
        let key = definition.key();
        if self.versioned(key).is_none() && self.definitions.read().expect("definitions lock").len() >= LIMITS_MAX {
            return Err(decision::limits_full(LIMITS_MAX));
        }
        self.check_kind(definition)?;
        // A bucket whose burst this backend's default margin leaves empty is
        // refused before anything is written.
        funded_units(state, self.window_margin_ms)?;
        self.create_accounts(definition).await?;
        let requested = LimitState::active(match state.status() {
            LimitStatus::Active => definition.clone(),
            LimitStatus::Decreasing => definition.with_capacity(state.pending_decrease_to())?,
        });
        for _ in 0..WRITE_ATTEMPTS_MAX {
            // The state this record follows must be the fleet's latest.
            self.refresh_definitions().await?;
            self.check_kind(definition)?;
            let current = self.versioned(key);
            let next =
                LimitState::after_definition(current.as_ref().map(|c| &c.state), requested.definition().clone())?;
            let previous_version = current.map_or(0, |c| c.version);
            let record_id = definition_log::encode(&requested, RecordKind::Put, previous_version)[0].id();
            let balance = self.resource_balance(key).await?;
            let moves = funding(key, &next, self.window_margin_ms, balance, previous_version, record_id)?;
            match self
                .write_claimed(&requested, RecordKind::Put, previous_version, moves)
                .await?
            {
                Claimed::Written => return Ok(()),
                // A bucket's shrink lost a race to a take or a refill: read again.
                Claimed::Superseded | Claimed::Refused(Kind::ExceedsCredits) => continue,
                Claimed::Refused(kind) => {
                    tracing::error!(%key, code = ?kind, "funding a definition failed");
                    return Err(LimiterError::Backend(format!("fund transfer: {kind:?}")));
                }
            }
        }
        Err(LimiterError::Conflict(format!(
            "limit {key}: changed concurrently, retry"
        )))
    }

    /// A definition of another kind than the key's state in force is refused.
    fn check_kind(&self, definition: &LimitDefinition) -> Result<(), LimiterError> {
        match self.versioned(definition.key()) {
            Some(existing) if existing.state.definition().kind() != definition.kind() => {
                Err(DefinitionError::KindChange {
                    key: definition.key().clone(),
                    existing: existing.state.definition().kind(),
                    requested: definition.kind(),
                }
                .into())
            }
            _ => Ok(()),
        }
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

    /// Creates the operator, resource, (for `overage: debt` or `owe`) debt, (for
    /// `owe`) owed, (for a bucket) taken and (for a calendar period) settled
    /// accounts, and the definition log's accounts; existing ones are fine. An
    /// owed account is funded once, by a transfer whose id names the key.
    async fn create_accounts(&self, definition: &LimitDefinition) -> Result<(), LimiterError> {
        let mut accounts = vec![ids::operator_account(), ids::resource_account(definition.key())];
        if definition.overage().records_debt() {
            accounts.push(ids::debt_account(definition.key()));
        }
        let owes = definition.overage().refuses_while_owing();
        if owes {
            accounts.push(ids::owed_account(definition.key()));
        }
        if definition.kind() == LimitKind::Bucket {
            accounts.push(ids::taken_account(definition.key()));
        }
        if definition.period().is_some() {
            accounts.push(ids::settled_account(definition.key()));
        }
        accounts.extend(super::definition_log::log_accounts());
        accounts.extend(ids::lease_marker_accounts());
        self.create_accounts_checked(accounts, "limit").await?;
        if owes {
            self.fund_owed_account(definition.key()).await?;
        }
        Ok(())
    }

    /// Funds the owed account of `key` with [`ids::OWED_LOCKS_MAX`], once for
    /// the fleet: the transfer's id names the key, so every later apply, on
    /// any server, finds it `exists`.
    async fn fund_owed_account(&self, key: &LimitKey) -> Result<(), LimiterError> {
        let fund = tb::Transfer::new(ids::owed_fund_transfer_id(key))
            .with_debit_account_id(ids::operator_account_id())
            .with_credit_account_id(ids::owed_account_id(key))
            .with_amount(u128::from(ids::OWED_LOCKS_MAX))
            .with_ledger(ids::LEDGER_LIMITS)
            .with_code(ids::CODE_OWED_FUND);
        let failures = (self.submitter.submit(vec![fund]).await).map_err(|e| unavailable(&e, "fund owed"))?;
        match failures.first().map(|f| f.kind()) {
            None | Some(Kind::Exists) => Ok(()),
            Some(kind) => {
                tracing::error!(%key, code = ?kind, "funding an owed account failed");
                Err(LimiterError::Backend(format!("owed account fund: {kind:?}")))
            }
        }
    }

    /// Carries out the decrease of `versioned` (a decreasing state) if usage
    /// allows: the transfer of what lies above the target and the
    /// `DecreaseApplied` record in one claimed chain, so that a decrease
    /// superseded by a newer record is never carried out. True once the
    /// record is in the log, whoever wrote it.
    ///
    /// Exactly once across a fleet: attempt `k` of a decrease has the id
    /// `xfer:decrease:<key>:<version>:<k>`, and attempt `k + 1` is only sent
    /// once attempt `k` is known to have failed (`id_already_failed`), which a
    /// failed id stays for ever; the claim lets one chain follow the version.
    async fn carry_out_decrease(&self, versioned: &Versioned) -> Result<bool, LimiterError> {
        let (state, version) = (&versioned.state, versioned.version);
        let key = state.definition().key();
        let next = state.with_decrease_applied();
        let target = funded_units(&next, self.window_margin_ms)?;
        // A bucket's level grows only by refills, which only requests post:
        // post the due ones, or an idle bucket would never allow its decrease.
        self.post_due_refills(std::iter::once(state)).await;
        let balance = self.resource_balance(key).await?;
        if balance.capacity() <= target {
            // Already at the target, or a cluster formatted anew below it,
            // which the record's chain funds.
            let record_id = definition_log::encode(&next, RecordKind::DecreaseApplied, version)[0].id();
            let moves = funding(key, &next, self.window_margin_ms, balance, version, record_id)?;
            let written = self.decrease_written(key, &next, version, moves).await?;
            return Ok(written == Some(true));
        }
        let delta = balance.capacity() - target;
        if balance.available() < delta {
            return Ok(false);
        }
        for attempt in 0..DECREASE_ATTEMPTS_MAX {
            let defund = tb::Transfer::new(ids::decrease_transfer_id(key, version, attempt))
                .with_debit_account_id(ids::resource_account_id(key))
                .with_credit_account_id(ids::operator_account_id())
                .with_amount(delta)
                .with_ledger(ids::LEDGER_LIMITS)
                .with_code(ids::CODE_DEFUND);
            if let Some(done) = self.decrease_written(key, &next, version, vec![defund]).await? {
                return Ok(done);
            }
        }
        tracing::error!(%key, attempts = DECREASE_ATTEMPTS_MAX, "decrease attempts exhausted; the key stays decreasing");
        Ok(false)
    }

    /// Writes the `DecreaseApplied` record of `next` with `moves`: `Some(true)`
    /// when it is in the log, `Some(false)` when not now (usage grew between
    /// the read and the transfer, or a newer record superseded the decrease),
    /// `None` when this attempt's id had failed before (try the next one).
    async fn decrease_written(
        &self,
        key: &LimitKey,
        next: &LimitState,
        version: u64,
        moves: Vec<tb::Transfer>,
    ) -> Result<Option<bool>, LimiterError> {
        match self
            .write_claimed(next, RecordKind::DecreaseApplied, version, moves)
            .await?
        {
            Claimed::Written => Ok(Some(true)),
            Claimed::Superseded | Claimed::Refused(Kind::ExceedsCredits) => Ok(Some(false)),
            Claimed::Refused(Kind::IdAlreadyFailed) => Ok(None),
            Claimed::Refused(kind) => {
                tracing::error!(%key, code = ?kind, "decrease transfer failed");
                Err(LimiterError::Backend(format!("decrease transfer: {kind:?}")))
            }
        }
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
        // Act on the fleet's latest states: a decrease superseded meanwhile
        // would only lose its claim, but need not be tried.
        self.refresh_definitions().await?;
        let decreasing: Vec<_> = self
            .all_states()
            .into_iter()
            .filter(|v| v.state.status() == LimitStatus::Decreasing)
            .collect();
        let mut applied = Vec::new();
        for versioned in decreasing {
            if !self.carry_out_decrease(&versioned).await? {
                continue;
            }
            let next = versioned.state.with_decrease_applied();
            let key = next.definition().key();
            if self.state_of(key).as_ref() == Some(&next) {
                tracing::info!(key = %key, capacity = next.definition().capacity(), "decrease applied");
                applied.push(next);
            }
        }
        Ok(applied)
    }

    /// Reports `states` with `in_use`, `debt` and `owing` read from their
    /// accounts; a bucket's `in_use` is read after posting its due refills, so
    /// it is what the bucket lacks of its burst now. An `overage: owe` limit owes
    /// while a lock is pending on its owed account.
    pub(super) async fn reports_of(&self, states: Vec<LimitState>) -> Result<Vec<LimitReport>, LimiterError> {
        self.post_due_refills(states.iter()).await;
        let mut reports = Vec::with_capacity(states.len());
        for chunk in states.chunks(LOOKUP_CHUNK_ACCOUNTS / 4) {
            let mut accounts = Vec::with_capacity(chunk.len() * 4);
            for state in chunk {
                let key = state.definition().key();
                accounts.extend([
                    ids::resource_account_id(key),
                    ids::debt_account_id(key),
                    ids::taken_account_id(key),
                    ids::owed_account_id(key),
                ]);
            }
            let balances = self.balances(accounts).await?;
            for (state, found) in chunk.iter().zip(balances.chunks(4)) {
                let resource = Balance {
                    taken: found[2].unwrap_or_default().net(),
                    ..found[0].unwrap_or_default()
                };
                let debt = found[1].unwrap_or_default();
                let owes = state.definition().overage().refuses_while_owing();
                reports.push(LimitReport {
                    state: state.clone(),
                    in_use: saturate(resource.in_use()),
                    debt: saturate(debt.debits_posted.saturating_sub(debt.credits_posted)),
                    owing: owes && found[3].unwrap_or_default().debits_pending > 0,
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
                retry_after_ms: super::shared::UNAVAILABLE_RETRY_MS,
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

    /// The balance of the resource account of `key`, with what its taken
    /// account holds (a bucket's); an account that does not exist (yet) has none.
    pub(super) async fn resource_balance(&self, key: &LimitKey) -> Result<Balance, LimiterError> {
        let accounts = vec![ids::resource_account_id(key), ids::taken_account_id(key)];
        let balances = self.balances(accounts).await?;
        Ok(Balance {
            taken: balances[1].unwrap_or_default().net(),
            ..balances[0].unwrap_or_default()
        })
    }

    /// The units that completed calls hold until the end of the period of the
    /// period key `key`: its settled account's pending debits (none when the
    /// account does not exist).
    pub(super) async fn settled_units(&self, key: &LimitKey) -> Result<u64, LimiterError> {
        let balances = self.balances(vec![ids::settled_account_id(key)]).await?;
        Ok(saturate(balances[0].unwrap_or_default().debits_pending))
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

/// The units the accounts of `state` hold in all: its capacity when active,
/// its target when decreasing (a decrease never funds beyond it); for a
/// bucket, the burst of that capacity under the backend's default margin
/// `default_margin_ms` (docs/tigerbeetle-backend.md, "Buckets"), an error when
/// that margin leaves it no burst.
fn funded_units(state: &LimitState, default_margin_ms: u64) -> Result<u128, LimiterError> {
    let capacity = match state.status() {
        LimitStatus::Active => state.definition().capacity(),
        LimitStatus::Decreasing => state.pending_decrease_to(),
    };
    if state.definition().kind() != LimitKind::Bucket {
        return Ok(u128::from(capacity));
    }
    let funded = LimitState::active(state.definition().with_capacity(capacity)?);
    Ok(u128::from(buckets::shape_of(&funded, default_margin_ms)?.burst()))
}

/// The funding transfer that brings the resource account of `key` from
/// `balance` to what `state` needs ([`funded_units`]), or none. Its id derives from
/// the record it goes with, so a retried chain sends the very same transfer.
/// An account above an active capacity (written by hand, or by an older
/// version) is reported, not corrected behind the operator's back; an active
/// bucket above its burst (a longer margin or a shorter window, at a capacity
/// that did not fall) gives the difference up at once ([`bucket_shrink`]).
fn funding(
    key: &LimitKey,
    state: &LimitState,
    default_margin_ms: u64,
    balance: Balance,
    version: u64,
    record_id: u128,
) -> Result<Vec<tb::Transfer>, LimiterError> {
    let wanted = funded_units(state, default_margin_ms)?;
    let active = state.status() == LimitStatus::Active;
    if balance.capacity() > wanted && active && state.definition().kind() == LimitKind::Bucket {
        return Ok(bucket_shrink(key, balance, wanted, version, record_id));
    }
    if balance.capacity() > wanted && active {
        tracing::warn!(%key, capacity = %wanted, funded = %balance.capacity(),
            "the resource account holds more than the limit's capacity; define a lower capacity to decrease it");
    }
    if balance.capacity() >= wanted {
        return Ok(Vec::new());
    }
    let id = crate::base::id::id128(&format!("xfer:fund:{key}:{version}:{record_id:032x}"));
    Ok(vec![tb::Transfer::new(id)
        .with_debit_account_id(ids::operator_account_id())
        .with_credit_account_id(ids::resource_account_id(key))
        .with_amount(wanted - balance.capacity())
        .with_ledger(ids::LEDGER_LIMITS)
        .with_code(ids::CODE_FUND)])
}

/// The transfers that bring an active bucket funded above `wanted` (its burst
/// fell while its capacity did not) down to it at once, as the memory backend
/// does: its level gives up the difference first, its taken units the rest,
/// so that the level never exceeds the new burst. Both are plain transfers of
/// amounts read just before: a take or a refill in between makes one exceed
/// its account's balance (T, like R, refuses to go below 0), the chain fails
/// whole and the caller reads again. The amounts are in the ids, so that a
/// retry after such a race sends new ones.
fn bucket_shrink(key: &LimitKey, balance: Balance, wanted: u128, version: u64, record_id: u128) -> Vec<tb::Transfer> {
    let excess = balance.capacity() - wanted;
    let from_level = excess.min(balance.available());
    let from_taken = excess - from_level;
    let moves = [
        (ids::resource_account_id(key), from_level, "level"),
        (ids::taken_account_id(key), from_taken, "taken"),
    ];
    moves
        .into_iter()
        .filter(|(_, amount, _)| *amount > 0)
        .map(|(account, amount, from)| {
            let label = format!("xfer:shrink:{key}:{version}:{record_id:032x}:{from}:{amount}");
            tb::Transfer::new(crate::base::id::id128(&label))
                .with_debit_account_id(account)
                .with_credit_account_id(ids::operator_account_id())
                .with_amount(amount)
                .with_ledger(ids::LEDGER_LIMITS)
                .with_code(ids::CODE_DEFUND)
        })
        .collect()
}

fn saturate(value: u128) -> u64 {
    u64::try_from(value).unwrap_or(u64::MAX)
}
