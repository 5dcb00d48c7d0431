//! A job: one LLM call described by what decides its limits, plus the async
//! function that makes the call.

use std::fmt;
use std::future::Future;
use std::pin::Pin;

use crate::provider::llm::LlmCall;

/// Why an execute failed. Any error type the caller's provider client returns.
pub type ExecuteError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// The future an execute returns: the tokens the call really used, or why it failed.
pub type ExecuteFuture = Pin<Box<dyn Future<Output = Result<u64, ExecuteError>> + Send + 'static>>;

/// The boxed execute function; called at most once, after a reservation is granted.
pub(crate) type ExecuteFn = Box<dyn FnOnce() -> ExecuteFuture + Send + 'static>;

/// What a job is: the fields that decide its limits (docs/client-library.md, "The
/// scheduler"), without the lease id, which the scheduler makes for every attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobSpec {
    /// The logical job's id: stable over every attempt, sent with each reserve
    /// and complete for logs, and used in shutdown reports. 1..=128 bytes.
    pub job_id: String,
    /// The tenant whose daily budget the call spends and whose turn it takes.
    pub tenant_id: String,
    /// The provider, e.g. `openai`; with `model` it names the job's queue.
    pub provider: String,
    /// The model, e.g. `gpt-4o`.
    pub model: String,
    /// The prompt; its length bounds the prompt tokens reserved.
    pub prompt: String,
    /// The `max_tokens` bound sent to the provider.
    pub max_output_tokens: u64,
    /// The prompt's token count by the provider's tokenizer, when known; see
    /// [`LlmCall::prompt_tokens`]. `None` reserves the byte estimate.
    pub prompt_tokens: Option<u64>,
    /// Whether the tenant's daily token budget is reserved too.
    pub want_daily_budget: bool,
    /// The work class the job runs in (docs/client-library.md, "Classes"); `None`
    /// runs it in the lowest class. A name the scheduler was not configured with is
    /// refused at submit.
    pub class: Option<String>,
}

impl JobSpec {
    /// The job as the LLM helper sees it.
    pub fn llm_call(&self) -> LlmCall<'_> {
        LlmCall {
            tenant_id: &self.tenant_id,
            provider: &self.provider,
            model: &self.model,
            prompt: &self.prompt,
            max_output_tokens: self.max_output_tokens,
            prompt_tokens: self.prompt_tokens,
            want_daily_budget: self.want_daily_budget,
        }
    }
}

/// A job ready to submit: its spec and the call to make once capacity is reserved.
pub struct Job {
    spec: JobSpec,
    execute: ExecuteFn,
}

impl Job {
    /// A job that runs `execute` once its reservation is granted. `execute`
    /// returns the tokens the call really used (prompt plus output, as the
    /// provider reports them), which Complete reconciles the reservation to.
    pub fn new<F, Fut>(spec: JobSpec, execute: F) -> Self
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future<Output = Result<u64, ExecuteError>> + Send + 'static,
    {
        Self {
            spec,
            execute: Box::new(move || Box::pin(execute()) as ExecuteFuture),
        }
    }

    /// What the job is.
    pub fn spec(&self) -> &JobSpec {
        &self.spec
    }

    pub(crate) fn into_parts(self) -> (JobSpec, ExecuteFn) {
        (self.spec, self.execute)
    }

    pub(crate) fn from_parts(spec: JobSpec, execute: ExecuteFn) -> Self {
        Self { spec, execute }
    }
}

impl fmt::Debug for Job {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Job").field("spec", &self.spec).finish_non_exhaustive()
    }
}
