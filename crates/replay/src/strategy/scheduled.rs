//! Our scheduler ([`ratelimiter::scheduler`]) in front of the provider, over any
//! [`Limiter`]: the memory backend (`local`) or `ratelimiterd` through the HTTP
//! client (`server`, `server-multi`).
//!
//! Each request is one scheduler job. Should the provider answer 429 anyway (the
//! limiter let one request too many through), the call fails, the scheduler
//! completes its lease with 0 tokens, and the request is submitted again after
//! the provider's retry-after; the 429 is counted, which is what the replay measures.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use ratelimiter::profile::ProfileRules;
use ratelimiter::scheduler::{Job, JobSpec};
use ratelimiter::scheduler::{JobError, Scheduler, SchedulerConfig};
use ratelimiter::Limiter;
use tokio::sync::oneshot;

use super::grants::GrantLog;
use super::{Caller, Strategy};
use crate::names::{MODEL, PROVIDER};
use crate::outcome::{ReplayRequest, RequestOutcome};
use crate::sim::client::CallOutcome;
use crate::sim::limits::{count_tokens, Accounting};
use crate::sim::prompt;
use crate::sim::wire::Usage;

/// Submissions per request, so a run against a misconfigured limiter still ends.
pub const ATTEMPTS_MAX: u32 = 1_000;
/// The tenant every replayed job belongs to: the traces carry no tenants.
pub const TENANT: &str = "replay";

/// The tokens to reconcile a lease to: what the provider counts against its
/// token limit. Under OpenAI's accounting that is the prompt plus `max_tokens`,
/// whatever was generated; reconciling to the generated count would free
/// capacity the provider still counts as used.
pub fn counted_tokens(accounting: Accounting, usage: &Usage, max_tokens: u64) -> u64 {
    match accounting {
        Accounting::Actual => usage.total_tokens,
        Accounting::Openai => usage.prompt_tokens + max_tokens,
    }
}

/// How our scheduler sizes a prompt's reservation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PromptSizing {
    /// The byte estimate of docs/client-library.md, "The LLM helper": one token per byte
    /// (`JobSpec::prompt_tokens` unset).
    Bytes,
    /// The provider's own count, as a client with its tokenizer has it
    /// (`JobSpec::prompt_tokens` set).
    Counted,
}

/// What a [`Scheduled`] strategy is built with.
#[derive(Debug, Clone)]
pub struct ScheduledOptions {
    /// Scheduler workers.
    pub workers: usize,
    /// Room for this many jobs (clamped to the scheduler's bounds).
    pub jobs: usize,
    /// How a prompt's reservation is sized.
    pub prompt_sizing: PromptSizing,
    /// A provider profile's reservation rules (`replay --limiter-profile`): the jobs
    /// reserve and complete by them and are named after its provider.
    pub rules: Option<ProfileRules>,
}

/// Requests as scheduler jobs over a limiter.
pub struct Scheduled {
    caller: Caller,
    /// The provider named in each job: a profile's provider when one is used.
    provider: String,
    prompt_sizing: PromptSizing,
    scheduler: Scheduler,
    grants: Arc<GrantLog>,
}

impl std::fmt::Debug for Scheduled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scheduled")
            .field("caller", &self.caller)
            .finish_non_exhaustive()
    }
}

impl Scheduled {
    /// A scheduler over `limiter` as `options` say.
    pub fn new(caller: Caller, limiter: Arc<dyn Limiter>, options: ScheduledOptions) -> Result<Self, String> {
        let jobs = options.jobs.clamp(1, ratelimiter::scheduler::JOBS_LIMIT_MAX);
        let rules = options.rules;
        let provider = rules.as_ref().map_or(PROVIDER, |r| r.provider().as_str()).to_owned();
        let mut builder = SchedulerConfig::builder(options.workers)
            .jobs_max(jobs)
            .queue_jobs_max(jobs)
            .tenant_jobs_max(jobs);
        if let Some(rules) = rules {
            builder = builder.profile(rules);
        }
        let config = builder.build().map_err(|e| e.to_string())?;
        let grants = Arc::new(GrantLog::new(limiter));
        Ok(Self {
            caller,
            provider,
            prompt_sizing: options.prompt_sizing,
            scheduler: Scheduler::with_config(Arc::clone(&grants) as Arc<dyn Limiter>, config),
            grants,
        })
    }

    /// One submission of `request`: the job's result, and the outcome as the
    /// call left it (unchanged when the call never ran).
    async fn submit(
        &self,
        request: &ReplayRequest,
        outcome: RequestOutcome,
    ) -> (Result<(), String>, RequestOutcome, Option<CallOutcome>) {
        let prompt = prompt::synthesize(request.record.input_tokens);
        let prompt_tokens = match self.prompt_sizing {
            PromptSizing::Bytes => None,
            PromptSizing::Counted => Some(count_tokens(&prompt)),
        };
        let spec = JobSpec {
            job_id: format!("r{}-a{}", request.index, outcome.attempts),
            tenant_id: TENANT.to_owned(),
            provider: self.provider.clone(),
            model: MODEL.to_owned(),
            prompt,
            max_output_tokens: request.max_tokens,
            prompt_tokens,
            want_daily_budget: false,
            class: None,
        };
        let (report, reported) = oneshot::channel();
        let (caller, call_request, mut call_outcome) = (self.caller.clone(), *request, outcome.clone());
        let (grants, job_id) = (Arc::clone(&self.grants), spec.job_id.clone());
        let job = Job::new(spec, move || async move {
            call_outcome.granted_unix_ms = grants.take(&job_id).unwrap_or(0);
            let answer = caller.attempt(&call_request, &mut call_outcome).await;
            let tokens = match &answer {
                CallOutcome::Done(served) => Ok(counted_tokens(
                    caller.accounting(),
                    &served.usage,
                    call_request.max_tokens,
                )),
                CallOutcome::Throttled { retry_after_ms } => {
                    Err(format!("provider 429, retry after {retry_after_ms} ms"))
                }
                CallOutcome::Failed(message) => Err(message.clone()),
            };
            let _ = report.send((call_outcome, answer));
            tokens.map_err(Into::into)
        });
        let handle = match self.scheduler.submit(job) {
            Ok(handle) => handle,
            Err(refused) => {
                return (
                    Err(format!("scheduler refused the job: {}", refused.kind())),
                    outcome,
                    None,
                )
            }
        };
        let result = handle.await;
        let (outcome, answer) = match reported.await {
            Ok((outcome, answer)) => (outcome, Some(answer)),
            Err(_) => (outcome, None),
        };
        match result {
            Ok(_) => (Ok(()), outcome, answer),
            Err(JobError::Execute(_)) => (Ok(()), outcome, answer),
            Err(other) => (Err(format!("scheduler: {other}")), outcome, answer),
        }
    }
}

#[async_trait]
impl Strategy for Scheduled {
    async fn run(&self, request: ReplayRequest) -> RequestOutcome {
        let mut outcome = self.caller.outcome(&request);
        while outcome.attempts < ATTEMPTS_MAX {
            let (result, next, answer) = self.submit(&request, outcome).await;
            outcome = next;
            if let Err(message) = result {
                self.caller.fail(&mut outcome, message);
                return outcome;
            }
            match answer {
                Some(CallOutcome::Throttled { retry_after_ms }) => {
                    tokio::time::sleep(Duration::from_millis(retry_after_ms)).await;
                }
                Some(CallOutcome::Done(_) | CallOutcome::Failed(_)) => return outcome,
                None => {
                    self.caller
                        .fail(&mut outcome, "the job ended without calling the provider".to_owned());
                    return outcome;
                }
            }
        }
        self.caller
            .fail(&mut outcome, format!("still throttled after {ATTEMPTS_MAX} attempts"));
        outcome
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leases_reconcile_to_what_the_provider_counts() {
        let usage = Usage {
            prompt_tokens: 100,
            completion_tokens: 7,
            total_tokens: 107,
        };
        assert_eq!(counted_tokens(Accounting::Actual, &usage, 50), 107);
        assert_eq!(counted_tokens(Accounting::Openai, &usage, 50), 150);
    }
}
