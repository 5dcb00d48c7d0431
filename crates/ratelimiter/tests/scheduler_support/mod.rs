//! Helpers for the scheduler tests: a limiter decorator that records every call,
//! a limiter answering from a script, its answers, a configuration, and job builders.

#![allow(dead_code)]

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use ratelimiter::scheduler::{ExecuteError, Job, JobSpec, SchedulerConfig};
use ratelimiter::{CompleteRequest, Denial, LeaseId, LimitKey, Limiter, LimiterError, ReserveOutcome, ReserveRequest};
use tokio::time::Instant;

/// One call seen by a [`Recorder`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Call {
    /// A reserve, with what it asked and when.
    Reserve {
        lease_id: LeaseId,
        job_id: String,
        keys: Vec<String>,
        at: Instant,
        allowed: bool,
    },
    /// A complete, with its actuals as (key, amount) and when.
    Complete {
        lease_id: LeaseId,
        job_id: String,
        actuals: Vec<(String, u64)>,
        at: Instant,
    },
}

/// Forwards to `inner` and records every call.
pub struct Recorder {
    inner: Arc<dyn Limiter>,
    calls: Mutex<Vec<Call>>,
}

impl Recorder {
    pub fn new(inner: Arc<dyn Limiter>) -> Arc<Self> {
        Arc::new(Self {
            inner,
            calls: Mutex::new(Vec::new()),
        })
    }

    pub fn calls(&self) -> Vec<Call> {
        self.calls.lock().unwrap().clone()
    }

    /// Reserves of `job_id` as (lease id, time, allowed).
    pub fn reserves_of(&self, job_id: &str) -> Vec<(LeaseId, Instant, bool)> {
        self.calls()
            .into_iter()
            .filter_map(|c| match c {
                Call::Reserve {
                    lease_id,
                    job_id: j,
                    at,
                    allowed,
                    ..
                } if j == job_id => Some((lease_id, at, allowed)),
                _ => None,
            })
            .collect()
    }

    /// Completes of `job_id` as (lease id, actuals).
    pub fn completes_of(&self, job_id: &str) -> Vec<(LeaseId, Vec<(String, u64)>)> {
        self.calls()
            .into_iter()
            .filter_map(|c| match c {
                Call::Complete {
                    lease_id,
                    job_id: j,
                    actuals,
                    ..
                } if j == job_id => Some((lease_id, actuals)),
                _ => None,
            })
            .collect()
    }

    pub fn reserve_count(&self) -> usize {
        self.calls()
            .iter()
            .filter(|c| matches!(c, Call::Reserve { .. }))
            .count()
    }
}

#[async_trait]
impl Limiter for Recorder {
    async fn reserve(&self, request: &ReserveRequest) -> Result<ReserveOutcome, LimiterError> {
        let at = Instant::now();
        let result = self.inner.reserve(request).await;
        self.calls.lock().unwrap().push(Call::Reserve {
            lease_id: request.lease_id(),
            job_id: request.job_id().unwrap_or_default().to_owned(),
            keys: request.requirements().iter().map(|r| r.key.to_string()).collect(),
            at,
            allowed: matches!(result, Ok(ReserveOutcome::Allowed { .. })),
        });
        result
    }

    async fn complete(&self, request: &CompleteRequest) -> Result<(), LimiterError> {
        self.calls.lock().unwrap().push(Call::Complete {
            lease_id: request.lease_id(),
            job_id: request.job_id().unwrap_or_default().to_owned(),
            actuals: request
                .actuals()
                .iter()
                .map(|a| (a.key.to_string(), a.actual_amount))
                .collect(),
            at: Instant::now(),
        });
        self.inner.complete(request).await
    }
}

type ReserveScript = Box<dyn Fn(&ReserveRequest) -> Option<Result<ReserveOutcome, LimiterError>> + Send + Sync>;

/// Answers reserves from a queue of answers (then from `fallback`, allowed by
/// default) and completes from another queue (then `Ok`).
pub struct Scripted {
    reserves: Mutex<VecDeque<Result<ReserveOutcome, LimiterError>>>,
    completes: Mutex<VecDeque<Result<(), LimiterError>>>,
    fallback: Option<ReserveScript>,
}

impl Scripted {
    pub fn new(
        reserves: Vec<Result<ReserveOutcome, LimiterError>>,
        completes: Vec<Result<(), LimiterError>>,
    ) -> Arc<Self> {
        Arc::new(Self {
            reserves: Mutex::new(reserves.into()),
            completes: Mutex::new(completes.into()),
            fallback: None,
        })
    }

    /// Answers every reserve with `script`, or allowed when it returns `None`.
    pub fn with(
        script: impl Fn(&ReserveRequest) -> Option<Result<ReserveOutcome, LimiterError>> + Send + Sync + 'static,
    ) -> Arc<Self> {
        Arc::new(Self {
            reserves: Mutex::new(VecDeque::new()),
            completes: Mutex::new(VecDeque::new()),
            fallback: Some(Box::new(script)),
        })
    }
}

pub fn allowed() -> Result<ReserveOutcome, LimiterError> {
    Ok(ReserveOutcome::Allowed { reserved_at_unix_ms: 1 })
}

#[async_trait]
impl Limiter for Scripted {
    async fn reserve(&self, request: &ReserveRequest) -> Result<ReserveOutcome, LimiterError> {
        if let Some(answer) = self.reserves.lock().unwrap().pop_front() {
            return answer;
        }
        self.fallback
            .as_ref()
            .and_then(|script| script(request))
            .unwrap_or_else(allowed)
    }

    async fn complete(&self, _request: &CompleteRequest) -> Result<(), LimiterError> {
        self.completes.lock().unwrap().pop_front().unwrap_or(Ok(()))
    }
}

/// A job spec of `tenant` on `provider`/`model` with a 10-byte prompt and 90
/// output tokens: 100 tokens reserved.
pub fn spec(job_id: &str, tenant: &str, provider: &str, model: &str) -> JobSpec {
    JobSpec {
        job_id: job_id.to_owned(),
        tenant_id: tenant.to_owned(),
        provider: provider.to_owned(),
        model: model.to_owned(),
        prompt: "0123456789".to_owned(),
        max_output_tokens: 90,
        prompt_tokens: None,
        want_daily_budget: false,
        class: None,
    }
}

/// A job whose call takes `duration_ms` of tokio time and uses `tokens`.
pub fn sleeping_job(spec: JobSpec, duration_ms: u64, tokens: u64) -> Job {
    Job::new(spec, move || async move {
        tokio::time::sleep(Duration::from_millis(duration_ms)).await;
        Ok::<u64, ExecuteError>(tokens)
    })
}

/// The tokens-per-minute key of the jobs [`openai`] makes.
pub const TPM: &str = "global:llm:openai:gpt-4o:tpm";

/// A scheduler's configuration with `workers` and no jitter, so retry times are exact.
pub fn config(workers: usize) -> ratelimiter::scheduler::SchedulerConfigBuilder {
    SchedulerConfig::builder(workers).jitter_ms_max(0).jitter_seed(7)
}

/// `text` as a key; the tests' keys are valid.
pub fn key(text: &str) -> LimitKey {
    LimitKey::new(text).unwrap()
}

/// A denial on `key_text` for lack of capacity, with its hint.
pub fn not_now(key_text: &str, retry_after_ms: u64) -> Result<ReserveOutcome, LimiterError> {
    Ok(ReserveOutcome::Denied(Denial::InsufficientCapacity {
        key: key(key_text),
        retry_after_ms,
    }))
}

/// A reserve of unknown outcome: the limiter could not be reached.
pub fn unavailable(retry_after_ms: u64) -> Result<ReserveOutcome, LimiterError> {
    Err(LimiterError::Unavailable { retry_after_ms })
}

/// A job spec of `tenant_a` on openai's gpt-4o.
pub fn openai(job_id: &str) -> JobSpec {
    spec(job_id, "tenant_a", "openai", "gpt-4o")
}
