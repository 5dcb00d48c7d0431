//! What a call records in the spend ledger when it completes (docs/gateway.md,
//! "The spend ledger"): who called (tenant, key), what (model, deployment),
//! the provider's usage and its billed cost, handed to the recorder's queue so
//! the answer never waits for the write.

use std::sync::Arc;

use ratelimiter::clock::Clock;
use ratelimiter::price::{billed_micro_usd, resolve_price, ModelPrice, Usage as PricedUsage};
use ratelimiter::spend::SpendEntry;

use crate::config::UpstreamKind;
use crate::observe::spend_recorder::SpendRecorder;
use crate::wire::usage::Usage;

/// The recorder and the clock that dates entries, shared by every call.
#[derive(Debug, Clone)]
pub struct SpendSink {
    /// Where entries go.
    pub recorder: SpendRecorder,
    /// When a call completed: its day in UTC.
    pub clock: Arc<dyn Clock>,
}

/// One call's part of the ledger: everything but the usage, known at admission.
#[derive(Debug, Clone)]
pub struct CallSpend {
    sink: SpendSink,
    /// The directory key's id; empty for a call without one.
    key: Arc<str>,
    /// The wire format of the model's deployments: whose list price applies.
    kind: UpstreamKind,
}

impl CallSpend {
    /// The spend of a call made with the directory key `key` (`None`: a
    /// configured tenant key, or none) to a model served in format `kind`.
    pub fn new(sink: SpendSink, key: Option<&str>, kind: UpstreamKind) -> Self {
        Self {
            sink,
            key: Arc::from(key.unwrap_or("")),
            kind,
        }
    }

    /// Records a call of `tenant` to `model`, served by `deployment` (its
    /// upstream, and the model name sent to it), that used `usage` as the
    /// provider reported it. Never waits.
    pub fn record(&self, tenant: &str, model: &str, (deployment, sent_model): (&str, &str), usage: &Usage) {
        let (micro_usd, unpriced) = match price_of(self.kind, sent_model) {
            Some(price) => (billed_micro_usd(&price, &priced(usage)), false),
            None => (0, true),
        };
        self.sink.recorder.record(SpendEntry {
            at_unix_ms: self.sink.clock.now_unix_ms(),
            tenant: tenant.to_owned(),
            key: self.key.to_string(),
            model: model.to_owned(),
            deployment: deployment.to_owned(),
            input_tokens: usage.input_tokens,
            cached_tokens: usage.cache_read_tokens,
            output_tokens: usage.output_tokens,
            micro_usd,
            unpriced,
        });
    }
}

/// The list price of `model` at the provider of `kind`; `None` when the
/// compiled table has none (a self-hosted model): the call is recorded with
/// its tokens, $0 and flagged unpriced, never silently free.
fn price_of(kind: UpstreamKind, model: &str) -> Option<ModelPrice> {
    let provider = match kind {
        UpstreamKind::Anthropic => "anthropic",
        UpstreamKind::Openai | UpstreamKind::OpenaiCompatible => "openai",
    };
    resolve_price(None, None, provider, model).ok().map(|r| r.price)
}

/// The provider's usage split as it is billed: cache reads apart from the rest
/// of the prompt.
fn priced(usage: &Usage) -> PricedUsage {
    PricedUsage {
        input_tokens: usage.input_tokens,
        cache_read_tokens: usage.cache_read_tokens,
        output_tokens: usage.output_tokens,
        ..PricedUsage::default()
    }
}
