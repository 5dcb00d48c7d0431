//! The fleet's claims of budget alerts ([`crate::alert_claims`],
//! docs/gateway.md, "Budgets and spend"): each crossing (budget, span start,
//! fraction) is one once-record ([`super::once_log`]) on a ledger of its own,
//! whose id is a hash of the three. The server whose create makes it alerts;
//! every other finds `exists` and skips the alert.

use std::sync::Arc;

use async_trait::async_trait;

use crate::base::id::id128;
use crate::limiting::alert_claims::{AlertClaims, Crossing};
use crate::model::error::LimiterError;

use super::backend::TigerBeetleBackend;
use super::once_log::{Claimed, OnceLedger, OnceLog};

/// The ledger of the alert claims, apart from every other log (the handed ids use 12).
pub const LEDGER_ALERT_CLAIMS: u32 = 13;
/// The code of every alert claim's transfer.
pub const CODE_ALERT_CLAIM: u16 = 41;
/// The account code of the ledger's two accounts.
pub const ACCOUNT_CODE_ALERT_CLAIMS: u16 = 14;
/// The alert claims' ledger as once-records.
pub const ALERT_CLAIMS_LEDGER: OnceLedger = OnceLedger {
    ledger: LEDGER_ALERT_CLAIMS,
    code: CODE_ALERT_CLAIM,
    account_code: ACCOUNT_CODE_ALERT_CLAIMS,
    name: "alert_claims",
};

/// The id of the claim of `crossing`.
pub fn alert_claim_id(crossing: &Crossing<'_>) -> u128 {
    id128(&format!("xfer:{}", crossing.identity()))
}

/// The alert claims in the cluster of a [`TigerBeetleBackend`].
#[derive(Debug)]
pub struct TigerBeetleAlertClaims {
    log: OnceLog,
}

impl TigerBeetleAlertClaims {
    /// The claims in `backend`'s cluster; its accounts are made on the first claim.
    pub fn new(backend: Arc<TigerBeetleBackend>) -> Self {
        Self {
            log: OnceLog::new(backend, ALERT_CLAIMS_LEDGER),
        }
    }
}

#[async_trait]
impl AlertClaims for TigerBeetleAlertClaims {
    async fn claim(&self, crossing: &Crossing<'_>) -> Result<bool, LimiterError> {
        // `user_data_128` names the budget (a hash), for an operator reading the ledger.
        let budget = id128(&format!("budget:{}", crossing.budget));
        let claimed = self.log.claim(alert_claim_id(crossing), budget).await?;
        Ok(claimed == Claimed::First)
    }
}
