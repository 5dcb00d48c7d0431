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
use crate::cli::PromptEstimate;
use crate::outcome::{ReplayRequest, RequestOutcome};
use crate::prompt;
use crate::provider::{count_tokens, Accounting};
use crate::provider_client::CallOutcome;
use crate::provider_server::Usage;
use crate::run::{MODEL, PROVIDER};

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

/// Requests as scheduler jobs over a limiter.
pub struct Scheduled {
    caller: Caller,
    /// The provider named in each job: a profile's provider when one is used.
    provider: String,
    estimate: PromptEstimate,
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
    /// A scheduler of `workers` workers over `limiter`, room for `jobs` jobs,
    /// sizing prompts by `estimate`.
    pub fn new(
        caller: Caller,
        limiter: Arc<dyn Limiter>,
        workers: usize,
        jobs: usize,
        estimate: PromptEstimate,
    ) -> Result<Self, String> {
        Self::with_rules(caller, limiter, workers, jobs, estimate, None)
    }

    /// [`Scheduled::new`] whose jobs reserve and complete by a provider profile's
    /// `rules` (`replay --limiter-profile`), named after its provider.
    pub fn with_rules(
        caller: Caller,
        limiter: Arc<dyn Limiter>,
        workers: usize,
        jobs: usize,
        estimate: PromptEstimate,
        rules: Option<ProfileRules>,
    ) -> Result<Self, String> {
        let jobs = jobs.clamp(1, ratelimiter::scheduler::JOBS_LIMIT_MAX);
        let provider = rules.as_ref().map_or(PROVIDER, |r| r.provider().as_str()).to_owned();
        let mut builder = SchedulerConfig::builder(workers)
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
            estimate,
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
        let prompt_tokens = match self.estimate {
            PromptEstimate::Bytes => None,
            PromptEstimate::Counted => Some(count_tokens(&prompt)),
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
