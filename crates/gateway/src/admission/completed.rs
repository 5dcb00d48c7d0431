//! What a call completed as (docs/gateway.md, "The spend ledger"): the lease
//! sets it once, when it completes, and the call's spend records it. Its own
//! module, below both, so that the spend takes it without the lease.

use std::sync::Arc;

use crate::wire::usage::Usage;

/// What a call completed as, for the spend it records: who called which model
/// on which deployment, the usage its limits were reconciled to, and what its
/// budgets in money were charged. Set once, when the lease completes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Completed {
    /// The tenant, or `_none`.
    pub tenant: Arc<str>,
    /// The model as clients call it.
    pub model: Arc<str>,
    /// The deployment's upstream (`x-ratelimit-deployment`).
    pub deployment: Arc<str>,
    /// The model name sent to the deployment.
    pub deployment_model: String,
    /// The provider's usage; `None` when unknown (the reservation was kept).
    pub usage: Option<Usage>,
    /// The call's billed cost in micro-dollars at the deployment's price: 0
    /// for a call the provider refused, `None` when unknown (the reservation
    /// was kept) or the deployment has no price.
    pub billed_micro_usd: Option<u64>,
}
