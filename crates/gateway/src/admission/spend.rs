//! What a call records in the spend ledger when it completes (docs/gateway.md,
//! "The spend ledger"): who called (tenant, key), what (model, deployment),
//! the provider's usage and its billed cost at the deployment's price, handed
//! to the recorder's queue so the answer never waits for the write.

use std::sync::Arc;

use ratelimiter::clock::Clock;
use ratelimiter::spend::SpendEntry;

use super::completed::Completed;
use crate::observe::spend_recorder::SpendRecorder;

/// The recorder and the clock that dates entries, shared by every call (one
/// `Arc` each call takes, not a clone of each part).
#[derive(Debug)]
pub struct SpendSink {
    /// Where entries go.
    recorder: SpendRecorder,
    /// When a call completed: its day in UTC.
    clock: Arc<dyn Clock>,
    /// The key of a call made without a directory key: one empty name shared by
    /// them all, so that their entries take it without an allocation.
    no_key: Arc<str>,
}

impl SpendSink {
    /// Entries go to `recorder`, dated by `clock`.
    pub fn new(recorder: SpendRecorder, clock: Arc<dyn Clock>) -> Self {
        Self {
            recorder,
            clock,
            no_key: Arc::from(""),
        }
    }
}

/// One call's part of the ledger that its lease does not know: the key.
#[derive(Debug, Clone)]
pub struct CallSpend {
    sink: Arc<SpendSink>,
    /// The directory key's id; empty for a call without one.
    key: Arc<str>,
}

impl CallSpend {
    /// The spend of a call made with the directory key `key` (`None`: a
    /// configured tenant key, or none).
    pub fn new(sink: &Arc<SpendSink>, key: Option<&str>) -> Self {
        Self {
            sink: Arc::clone(sink),
            key: key.map_or_else(|| Arc::clone(&sink.no_key), Arc::from),
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
            // The call's own names, shared: no copy for the queue.
            tenant: Arc::clone(&completed.tenant),
            key: Arc::clone(&self.key),
            model: Arc::clone(&completed.model),
            deployment: Arc::clone(&completed.deployment),
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
