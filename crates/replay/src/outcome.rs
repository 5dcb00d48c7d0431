//! One replayed request: what it asks for and what happened to it. Strategies
//! fill the outcome; the summary and the plot read it.

use serde::{Deserialize, Serialize};

use crate::sim::limits::Accounting;
use crate::trace::TraceRecord;

/// A request as a strategy receives it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplayRequest {
    /// Its position in the trace.
    pub index: usize,
    /// Its sizes.
    pub record: TraceRecord,
    /// When it arrives, Unix ms (the trace offset compressed by the speed-up).
    pub arrival_unix_ms: u64,
    /// The `max_tokens` bound the client sends.
    pub max_tokens: u64,
}

impl ReplayRequest {
    /// The output the simulated model writes: the trace's, capped by the bound.
    pub fn output_tokens(&self) -> u64 {
        self.record.output_tokens.min(self.max_tokens)
    }

    /// The tokens the provider will charge for it under `accounting`.
    pub fn charge(&self, accounting: Accounting) -> u64 {
        accounting.charge(self.record.input_tokens, self.max_tokens, self.output_tokens())
    }
}

/// What happened to one request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestOutcome {
    /// Its position in the trace.
    pub index: usize,
    /// When it arrived, Unix ms.
    pub arrival_unix_ms: u64,
    /// When its last attempt was sent to the provider, Unix ms (0 if never sent).
    pub sent_unix_ms: u64,
    /// When it ended (served or given up), Unix ms.
    pub done_unix_ms: u64,
    /// Calls sent to the provider.
    pub attempts: u32,
    /// Of those, answered 429.
    pub throttled: u32,
    /// True when the provider served it.
    pub completed: bool,
    /// Why it failed, when it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The tokens the provider would charge for it: the demand it offers.
    pub offered_tokens: u64,
    /// Prompt plus output tokens the provider reported serving (0 unless completed).
    pub served_tokens: u64,
    /// Our strategies: when the limiter granted the lease of the attempt that
    /// was served, Unix ms (its `reserved_at_unix_ms`, where its holds start);
    /// 0 when unknown (other strategies, older records).
    #[serde(default)]
    pub granted_unix_ms: u64,
    /// When the provider admitted the served attempt, Unix ms (where its window
    /// for the call starts); 0 when unknown.
    #[serde(default)]
    pub admitted_unix_ms: u64,
}

impl RequestOutcome {
    /// A fresh outcome for `request`, not yet sent.
    pub fn new(request: &ReplayRequest, accounting: Accounting) -> Self {
        Self {
            index: request.index,
            arrival_unix_ms: request.arrival_unix_ms,
            sent_unix_ms: 0,
            done_unix_ms: 0,
            attempts: 0,
            throttled: 0,
            completed: false,
            error: None,
            offered_tokens: request.charge(accounting),
            served_tokens: 0,
            granted_unix_ms: 0,
            admitted_unix_ms: 0,
        }
    }

    /// The time it waited before the attempt that ended it, in ms.
    pub fn queue_delay_ms(&self) -> u64 {
        self.sent_unix_ms.saturating_sub(self.arrival_unix_ms)
    }

    /// From the grant of its served attempt to the provider's admission, ms:
    /// what the window margin must cover. `None` when either is unknown.
    pub fn grant_to_admission_ms(&self) -> Option<u64> {
        if self.granted_unix_ms == 0 || self.admitted_unix_ms == 0 {
            return None;
        }
        Some(self.admitted_unix_ms.saturating_sub(self.granted_unix_ms))
    }

    /// When it stopped waiting: sent for the last time, or gave up unsent.
    pub fn wait_end_unix_ms(&self) -> u64 {
        if self.sent_unix_ms > 0 {
            self.sent_unix_ms
        } else {
            self.done_unix_ms
        }
    }
}
