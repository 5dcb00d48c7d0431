//! A fleet's "once" records on the cluster: each record is one amount-0
//! transfer, on a ledger of its own, whose id is a hash of what it records.
//! Creating it is a claim: the first server's create succeeds, every later
//! one (on any server) finds `exists`; asking whether it was made is one
//! `lookup_transfers` of that id. No server keeps a copy and none reads the
//! ledger whole. The stored ids handed to gateway tenants
//! ([`super::handed_id_log`]) and the budget alerts' crossings
//! ([`super::alert_claim_log`]) are two such ledgers.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tigerbeetle_unofficial as tb;

use crate::base::id::id128;
use crate::model::error::LimiterError;

use super::backend::TigerBeetleBackend;
use super::shared::{unavailable, Shared};

/// One ledger of once-records: its number, codes and the name its two
/// accounts' ids are made of (`acct:<name>:debit`, `acct:<name>:credit`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OnceLedger {
    /// The ledger, apart from every other log's.
    pub ledger: u32,
    /// The code of every record's transfer.
    pub code: u16,
    /// The account code of the ledger's two accounts.
    pub account_code: u16,
    /// What its accounts' ids and the logs name it.
    pub name: &'static str,
}

/// Whether a claim was this server's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Claimed {
    /// This create made the record: the first anywhere in the fleet.
    First,
    /// The record already existed: some server (maybe this one) made it before.
    Before,
}

impl OnceLedger {
    fn account_ids(&self) -> [u128; 2] {
        [
            id128(&format!("acct:{}:debit", self.name)),
            id128(&format!("acct:{}:credit", self.name)),
        ]
    }

    /// The ledger's two accounts: unconstrained, since nothing moves an amount.
    pub fn accounts(&self) -> Vec<tb::Account> {
        let [debit, credit] = self.account_ids();
        vec![
            tb::Account::new(debit, self.ledger, self.account_code),
            tb::Account::new(credit, self.ledger, self.account_code),
        ]
    }

    /// The record `id`; its `user_data_128` is for an operator reading the ledger.
    pub fn transfer(&self, id: u128, user_data_128: u128) -> tb::Transfer {
        let [debit, credit] = self.account_ids();
        tb::Transfer::new(id)
            .with_debit_account_id(debit)
            .with_credit_account_id(credit)
            .with_amount(0)
            .with_ledger(self.ledger)
            .with_code(self.code)
            .with_user_data_128(user_data_128)
    }
}

/// The once-records of one [`OnceLedger`] in the cluster of a [`TigerBeetleBackend`].
#[derive(Debug)]
pub struct OnceLog {
    /// What the backend holds: its sessions and timeout.
    backend: Arc<Shared>,
    ledger: OnceLedger,
    accounts_ready: AtomicBool,
}

impl OnceLog {
    /// The records of `ledger` in `backend`'s cluster; its accounts are made on the first claim.
    pub fn new(backend: Arc<TigerBeetleBackend>, ledger: OnceLedger) -> Self {
        Self {
            backend: Arc::clone(&backend.shared),
            ledger,
            accounts_ready: AtomicBool::new(false),
        }
    }

    /// Makes the record `id` unless it exists: whether this create was the first.
    pub async fn claim(&self, id: u128, user_data_128: u128) -> Result<Claimed, LimiterError> {
        let backend = &self.backend;
        let name = self.ledger.name;
        if !self.accounts_ready.load(Ordering::Acquire) {
            backend.create_accounts_checked(self.ledger.accounts(), name).await?;
            self.accounts_ready.store(true, Ordering::Release);
        }
        let transfer = self.ledger.transfer(id, user_data_128);
        let slot = backend.admin_slot().await?;
        let failures = (backend.pool)
            .run(slot, backend.timeout, move |client| {
                super::submitter::create_transfers(client, vec![transfer])
            })
            .await
            .map_err(|e| unavailable(&e, name))?;
        use tb::error::CreateTransferErrorKind as Kind;
        match failures.first().map(|f| f.kind()) {
            None => Ok(Claimed::First),
            Some(Kind::Exists) => Ok(Claimed::Before),
            Some(code) => {
                tracing::error!(?code, ledger = name, "making a once-record failed");
                Err(LimiterError::Backend(format!("making a {name} record: {code:?}")))
            }
        }
    }

    /// Whether the record `id` was made by any server of the fleet.
    pub async fn made(&self, id: u128) -> Result<bool, LimiterError> {
        let backend = &self.backend;
        let slot = backend.admin_slot().await?;
        let found = (backend.pool)
            .run(slot, backend.timeout, move |client| async move {
                client.lookup_transfers(vec![id]).await
            })
            .await
            .map_err(|e| unavailable(&e, self.ledger.name))?;
        Ok(found.iter().any(|t| t.id() == id && t.ledger() == self.ledger.ledger))
    }
}
