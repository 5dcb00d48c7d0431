//! One call's context, made once its request is read and carried through every
//! phase after: admission, each try on a deployment, the answer. What the call
//! is (endpoint, parsed request and its count), who sends it (caller, class),
//! to which model, and its counters.

use std::sync::Arc;
use std::time::Instant;

use super::entry::{Caller, ModelEntry};
use super::spend::CallSpend;
use crate::observe::class_metrics::ClassCounters;
use crate::observe::key_usage::KeyCall;
use crate::observe::metrics::CallCounters;
use crate::observe::trace::CallTrace;
use crate::routing::Need;
use crate::wire::call::{Call, Endpoint};

/// The context of one call.
pub struct CallContext {
    /// The endpoint called.
    pub endpoint: Endpoint,
    /// The request, read and counted.
    pub call: Call,
    /// Who calls.
    pub caller: Arc<Caller>,
    /// The call's class (an index into the gateway's classes).
    pub class: usize,
    /// The model called.
    pub model: Arc<ModelEntry>,
    /// The (model, caller) counters.
    pub counters: Arc<CallCounters>,
    /// The (model, class) counters.
    pub class_counters: Arc<ClassCounters>,
    /// The counter of the directory key the call came with, if any.
    pub key_call: Option<KeyCall>,
    /// What the call needs of a deployment, and the deployments it tried.
    pub need: Need,
    /// When the call arrived.
    pub started: Instant,
    /// What the call records in the spend ledger once it completes; `None`
    /// when the server keeps no ledger.
    pub spend: Option<CallSpend>,
    /// The call's SERVER span, when the server exports traces.
    pub trace: Option<CallTrace>,
}

impl CallContext {
    /// Whether no deployment is left for the call to fail over to after this try.
    pub fn is_last_try(&self) -> bool {
        !self.model.pool.can_fail_over(self.need.tried)
    }
}
