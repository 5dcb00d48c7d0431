//! The fleet's record of stored ids handed to gateway tenants
//! ([`crate::handed_ids`], docs/gateway.md, "Stored responses"): each (tenant,
//! kind, id) is one once-record ([`super::once_log`]) on a ledger of its own,
//! whose id is a hash of the three ([`handed_transfer_id`]). Recording it twice
//! finds `exists`; asking whether it was handed is one lookup of that id, so no
//! server keeps a copy and none reads the ledger whole.
//!
//! A tenant learns nothing from another's record: the transfer's id depends on
//! the tenant's name, so a lookup for tenant B of A's id looks up another
//! transfer, which does not exist. A server of an older version never queries
//! this ledger.

use std::sync::Arc;

use async_trait::async_trait;
use tigerbeetle_unofficial as tb;

use crate::base::id::id128;
use crate::limiting::handed_ids::{HandedIdStore, StoredKind, HANDED_ID_BYTES_MAX};
use crate::model::error::LimiterError;

use super::backend::TigerBeetleBackend;
use super::once_log::{OnceLedger, OnceLog};

/// The ledger of the handed ids, apart from every other log (the limits use
/// 1 and 3, the logs 2 and 4 to 9, the alert claims 13).
pub const LEDGER_HANDED_IDS: u32 = 12;
/// The code of every handed-id transfer.
pub const CODE_HANDED_ID: u16 = 40;
/// The account code of the ledger's two accounts.
pub const ACCOUNT_CODE_HANDED_IDS: u16 = 13;
/// The handed ids' ledger as once-records.
pub const HANDED_IDS_LEDGER: OnceLedger = OnceLedger {
    ledger: LEDGER_HANDED_IDS,
    code: CODE_HANDED_ID,
    account_code: ACCOUNT_CODE_HANDED_IDS,
    name: "handed_ids",
};

/// The ledger's two accounts: unconstrained, since nothing moves an amount.
pub fn handed_id_accounts() -> Vec<tb::Account> {
    HANDED_IDS_LEDGER.accounts()
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
    HANDED_IDS_LEDGER.transfer(handed_transfer_id(tenant, kind, id), tenant_data(tenant))
}

fn tenant_data(tenant: &str) -> u128 {
    id128(&format!("tenant:{tenant}"))
}

/// The handed ids in the cluster of a [`TigerBeetleBackend`].
#[derive(Debug)]
pub struct TigerBeetleHandedIds {
    log: OnceLog,
}

impl TigerBeetleHandedIds {
    /// The record in `backend`'s cluster; its accounts are made on the first write.
    pub fn new(backend: Arc<TigerBeetleBackend>) -> Self {
        Self {
            log: OnceLog::new(backend, HANDED_IDS_LEDGER),
        }
    }
}

#[async_trait]
impl HandedIdStore for TigerBeetleHandedIds {
    async fn record(&self, tenant: &str, kind: StoredKind, id: &str) -> Result<(), LimiterError> {
        assert!(id.len() <= HANDED_ID_BYTES_MAX, "the gateway hands no longer id");
        let record = handed_transfer_id(tenant, kind, id);
        self.log.claim(record, tenant_data(tenant)).await.map(|_| ())
    }

    async fn handed(&self, tenant: &str, kind: StoredKind, id: &str) -> Result<bool, LimiterError> {
        if id.len() > HANDED_ID_BYTES_MAX {
            return Ok(false); // never recorded
        }
        self.log.made(handed_transfer_id(tenant, kind, id)).await
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
        // The ids a cluster already holds: the records of an older server are found.
        assert_eq!(transfer.id(), id128("xfer:handed:response:4:acme:resp_1"));
        assert_eq!(transfer.debit_account_id(), id128("acct:handed_ids:debit"));
        assert_eq!(transfer.credit_account_id(), id128("acct:handed_ids:credit"));
        assert_eq!(transfer.user_data_128(), id128("tenant:acme"));
        let accounts = handed_id_accounts();
        assert_eq!(accounts[0].id(), id128("acct:handed_ids:debit"));
        assert_eq!(
            (accounts[1].ledger(), accounts[1].code()),
            (LEDGER_HANDED_IDS, ACCOUNT_CODE_HANDED_IDS)
        );
    }
}
