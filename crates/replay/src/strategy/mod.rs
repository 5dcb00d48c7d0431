//! Strategies: how a client decides when to send each request to the provider.
//!
//! Every strategy calls the provider through [`Caller`], which stamps the
//! outcome, so the strategies differ only in their decisions.

use std::sync::Arc;

use async_trait::async_trait;
use ratelimiter::Clock;

use crate::outcome::{ReplayRequest, RequestOutcome};
use crate::sim::client::{CallOutcome, ProviderClient};
use crate::sim::limits::Accounting;
use crate::sim::prompt;

pub mod grants;
pub mod none;
pub mod scheduled;
pub mod server_multi;
pub mod token_bucket;

/// The strategies `replay --strategy` offers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum StrategyKind {
    /// Fire at arrival, retry each 429 after the provider's retry-after.
    None,
    /// A client-side requests and tokens bucket, like the OpenAI cookbook's parallel processor.
    TokenBucket,
    /// Our scheduler over the in-process memory backend.
    Local,
    /// Our scheduler over `ratelimiterd` through the library's HTTP client.
    Server,
    /// Several client processes, each with our scheduler, sharing one `ratelimiterd`.
    ServerMulti,
}

/// A way of sending requests to the provider.
#[async_trait]
pub trait Strategy: Send + Sync {
    /// Takes `request` (which has just arrived) through to an outcome.
    async fn run(&self, request: ReplayRequest) -> RequestOutcome;
}

/// Calls the provider on a strategy's behalf and stamps the outcome.
#[derive(Debug, Clone)]
pub struct Caller {
    client: ProviderClient,
    clock: Arc<dyn Clock>,
    accounting: Accounting,
}

impl Caller {
    /// A caller through `client`, reading time from `clock`.
    pub fn new(client: ProviderClient, clock: Arc<dyn Clock>, accounting: Accounting) -> Self {
        Self {
            client,
            clock,
            accounting,
        }
    }

    /// The clock outcomes are stamped with.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    /// How the provider charges tokens.
    pub fn accounting(&self) -> Accounting {
        self.accounting
    }

    /// A fresh outcome for `request`.
    pub fn outcome(&self, request: &ReplayRequest) -> RequestOutcome {
        RequestOutcome::new(request, self.accounting)
    }

    /// Sends one attempt of `request`, recording it in `outcome`; on a final
    /// answer (served or failed) the outcome is marked done.
    pub async fn attempt(&self, request: &ReplayRequest, outcome: &mut RequestOutcome) -> CallOutcome {
        outcome.attempts += 1;
        outcome.sent_unix_ms = self.clock.now_unix_ms();
        let text = prompt::synthesize(request.record.input_tokens);
        let answer = self
            .client
            .call(text, request.max_tokens, request.record.output_tokens)
            .await;
        match &answer {
            CallOutcome::Done(served) => {
                outcome.completed = true;
                outcome.served_tokens = served.usage.total_tokens;
                outcome.admitted_unix_ms = served.admitted_unix_ms.unwrap_or(0);
                outcome.done_unix_ms = self.clock.now_unix_ms();
            }
            CallOutcome::Throttled { .. } => outcome.throttled += 1,
            CallOutcome::Failed(message) => self.fail(outcome, message.clone()),
        }
        answer
    }

    /// Marks `outcome` as given up for `reason`.
    pub fn fail(&self, outcome: &mut RequestOutcome, reason: String) {
        outcome.completed = false;
        outcome.error = Some(reason);
        outcome.done_unix_ms = self.clock.now_unix_ms();
    }
}
