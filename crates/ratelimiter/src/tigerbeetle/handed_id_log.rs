//! The fleet's record of stored ids handed to gateway tenants
//! ([`crate::handed_ids`], docs/gateway.md, "Stored responses"): each (tenant,
//! kind, id) is one amount-0 transfer on a ledger of its own, whose id is a
//! hash of the three ([`handed_transfer_id`]). Recording it twice finds
//! `exists`; asking whether it was handed is one `lookup_transfers` of that id,
//! so no server keeps a copy and none reads the ledger whole.
//!
//! A tenant learns nothing from another's record: the transfer's id depends on
//! the tenant's name, so a lookup for tenant B of A's id looks up another
//! transfer, which does not exist. A server of an older version never queries
//! this ledger.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use tigerbeetle_unofficial as tb;

use crate::handed_ids::{HandedIdStore, StoredKind, HANDED_ID_BYTES_MAX};
use crate::{id128, LimiterError};

use super::backend::{unavailable, TigerBeetleBackend};

/// The ledger of the handed ids, apart from every other log (the limits use
/// 1 and 3, the logs 2 and 4 to 7).
pub const LEDGER_HANDED_IDS: u32 = 12;
/// The code of every handed-id transfer.
pub const CODE_HANDED_ID: u16 = 40;
/// The account code of the ledger's two accounts.
pub const ACCOUNT_CODE_HANDED_IDS: u16 = 13;

fn accounts_ids() -> [u128; 2] {
    [id128("acct:handed_ids:debit"), id128("acct:handed_ids:credit")]
}

/// The ledger's two accounts: unconstrained, since nothing moves an amount.
pub fn handed_id_accounts() -> Vec<tb::Account> {
    let [debit, credit] = accounts_ids();
    vec![
        tb::Account::new(debit, LEDGER_HANDED_IDS, ACCOUNT_CODE_HANDED_IDS),
        tb::Account::new(credit, LEDGER_HANDED_IDS, ACCOUNT_CODE_HANDED_IDS),
    ]
}

/// The id of the record that `id` of `kind` was handed to `tenant`. The
/// tenant's length comes first, so no tenant and id can be read as another
/// tenant's.
pub fn handed_transfer_id(tenant: &str, kind: StoredKind, id: &str) -> u128 {
    id128(&format!("xfer:handed:{kind}:{}:{tenant}:{id}", tenant.len()))
}

/// The record that `id` of `kind` was handed to `tenant`; its `user_data_128`
/// names the tenant (a hash), for an operator reading the ledger.
pub fn handed_transfer(tenant: &str, kind: StoredKind, id: &str) -> tb::Transfer {
    let [debit, credit] = accounts_ids();
    tb::Transfer::new(handed_transfer_id(tenant, kind, id))
        .with_debit_account_id(debit)
        .with_credit_account_id(credit)
        .with_amount(0)
        .with_ledger(LEDGER_HANDED_IDS)
        .with_code(CODE_HANDED_ID)
        .with_user_data_128(id128(&format!("tenant:{tenant}")))
}

/// The handed ids in the cluster of a [`TigerBeetleBackend`].
#[derive(Debug)]
pub struct TigerBeetleHandedIds {
    backend: Arc<TigerBeetleBackend>,
    accounts_ready: AtomicBool,
}

impl TigerBeetleHandedIds {
    /// The record in `backend`'s cluster; its accounts are made on the first write.
    pub fn new(backend: Arc<TigerBeetleBackend>) -> Self {
        Self {
            backend,
            accounts_ready: AtomicBool::new(false),
        }
    }
}

#[async_trait]
impl HandedIdStore for TigerBeetleHandedIds {
    async fn record(&self, tenant: &str, kind: StoredKind, id: &str) -> Result<(), LimiterError> {
        assert!(id.len() <= HANDED_ID_BYTES_MAX, "the gateway hands no longer id");
        let backend = &self.backend;
        if !self.accounts_ready.load(Ordering::Acquire) {
            backend
                .create_accounts_checked(handed_id_accounts(), "handed ids")
                .await?;
            self.accounts_ready.store(true, Ordering::Release);
        }
        let transfer = handed_transfer(tenant, kind, id);
        let slot = backend.admin_slot().await?;
        let failures = (backend.pool)
            .run(slot, backend.timeout, move |client| {
                super::submitter::create_transfers(client, vec![transfer])
            })
            .await
            .map_err(|e| unavailable(&e, "record a handed id"))?;
        use tb::error::CreateTransferErrorKind as Kind;
        match failures.first().map(|f| f.kind()) {
            None | Some(Kind::Exists) => Ok(()),
            Some(code) => {
                tracing::error!(?code, %kind, "recording a handed id failed");
                Err(LimiterError::Backend(format!("recording a handed {kind} id: {code:?}")))
            }
        }
    }

    async fn handed(&self, tenant: &str, kind: StoredKind, id: &str) -> Result<bool, LimiterError> {
        if id.len() > HANDED_ID_BYTES_MAX {
            return Ok(false); // never recorded
        }
        let wanted = handed_transfer_id(tenant, kind, id);
        let backend = &self.backend;
        let slot = backend.admin_slot().await?;
        let found = (backend.pool)
            .run(slot, backend.timeout, move |client| async move {
                client.lookup_transfers(vec![wanted]).await
            })
            .await
            .map_err(|e| unavailable(&e, "look up a handed id"))?;
        Ok(found
            .iter()
            .any(|t| t.id() == wanted && t.ledger() == LEDGER_HANDED_IDS))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_tenant_kind_and_id_is_its_own_record() {
        let a = handed_transfer_id("acme", StoredKind::Response, "resp_1");
        assert_eq!(a, handed_transfer_id("acme", StoredKind::Response, "resp_1"));
        assert_ne!(a, handed_transfer_id("beta", StoredKind::Response, "resp_1"));
        assert_ne!(a, handed_transfer_id("acme", StoredKind::Conversation, "resp_1"));
        assert_ne!(a, handed_transfer_id("acme", StoredKind::Response, "resp_2"));
        // The tenant's length keeps `a:b` + `c` apart from `a` + `b:c`.
        assert_ne!(
            handed_transfer_id("a:b", StoredKind::Response, "c"),
            handed_transfer_id("a", StoredKind::Response, "b:c")
        );
        let transfer = handed_transfer("acme", StoredKind::Response, "resp_1");
        assert_eq!((transfer.ledger(), transfer.amount()), (LEDGER_HANDED_IDS, 0));
    }
}
