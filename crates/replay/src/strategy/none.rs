//! `none`: no limiter. Each request is sent when it arrives; a 429 is retried
//! after the provider's retry-after, as a plain OpenAI client with retries does.

use std::time::Duration;

use async_trait::async_trait;

use super::{Caller, Strategy};
use crate::outcome::{ReplayRequest, RequestOutcome};
use crate::sim::client::CallOutcome;

/// The most attempts per request, so an overloaded run still ends.
pub const ATTEMPTS_MAX: u32 = 1_000;

/// Fire, and retry on 429 after the hint.
#[derive(Debug, Clone)]
pub struct NoLimiter {
    caller: Caller,
}

impl NoLimiter {
    /// Sends through `caller`.
    pub fn new(caller: Caller) -> Self {
        Self { caller }
    }
}

#[async_trait]
impl Strategy for NoLimiter {
    async fn run(&self, request: ReplayRequest) -> RequestOutcome {
        let mut outcome = self.caller.outcome(&request);
        while outcome.attempts < ATTEMPTS_MAX {
            match self.caller.attempt(&request, &mut outcome).await {
                CallOutcome::Throttled { retry_after_ms } => {
                    tokio::time::sleep(Duration::from_millis(retry_after_ms)).await;
                }
                CallOutcome::Done(_) | CallOutcome::Failed(_) => return outcome,
            }
        }
        self.caller
            .fail(&mut outcome, format!("still throttled after {ATTEMPTS_MAX} attempts"));
        outcome
    }
}
