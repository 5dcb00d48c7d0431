//! What a call records in the spend ledger when it completes (docs/gateway.md,
//! "The spend ledger"): who called (tenant, key), what (model, deployment),
//! the provider's usage and its billed cost at the deployment's price, handed
//! to the recorder's queue so the answer never waits for the write.

use std::sync::Arc;

use ratelimiter::clock::Clock;
use ratelimiter::spend::SpendEntry;

use super::completed::Completed;
use crate::observe::spend_recorder::SpendRecorder;

/// The recorder and the clock that dates entries, shared by every call.
#[derive(Debug, Clone)]
pub struct SpendSink {
    /// Where entries go.
    pub recorder: SpendRecorder,
    /// When a call completed: its day in UTC.
    pub clock: Arc<dyn Clock>,
}

/// One call's part of the ledger that its lease does not know: the key.
#[derive(Debug, Clone)]
pub struct CallSpend {
    sink: SpendSink,
    /// The directory key's id; empty for a call without one.
    key: Arc<str>,
}

impl CallSpend {
    /// The spend of a call made with the directory key `key` (`None`: a
    /// configured tenant key, or none).
    pub fn new(sink: SpendSink, key: Option<&str>) -> Self {
        Self {
            sink,
            key: Arc::from(key.unwrap_or("")),
        }
    }

    /// Records the call that completed as `completed`, when the provider
    /// reported its usage (else there is nothing to record). A deployment
    /// without a price (a self-hosted model, no budget configured) records the
    /// tokens at $0, flagged unpriced. Never waits.
    pub fn record(&self, completed: &Completed) {
        let Some(usage) = completed.usage else {
            return;
        };
        let priced = usage.priced();
        self.sink.recorder.record(SpendEntry {
            at_unix_ms: self.sink.clock.now_unix_ms(),
            tenant: completed.tenant.to_string(),
            key: self.key.to_string(),
            model: completed.model.to_string(),
            deployment: completed.deployment.to_string(),
            // Every prompt token not read from the cache: cache writes included.
            input_tokens: (priced.input_tokens)
                .saturating_add(priced.cache_write_tokens)
                .saturating_add(priced.cache_write_1h_tokens),
            cached_tokens: priced.cache_read_tokens,
            output_tokens: priced.output_tokens,
            micro_usd: completed.billed_micro_usd.unwrap_or(0),
            unpriced: completed.billed_micro_usd.is_none(),
        });
    }
}
