//! Why the scheduler refused a job or a shutdown.

use std::fmt;
use std::sync::Mutex;

use super::job::{ExecuteFn, Job, JobSpec};

/// Why `submit` refused a job.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SubmitErrorKind {
    /// The job's fields cannot make a valid reservation (bad provider, model or
    /// tenant name, job id empty or too long).
    #[error("invalid job: {0}")]
    InvalidJob(String),
    /// The scheduler holds `jobs_max` unfinished jobs.
    #[error("scheduler full: {jobs_max} jobs unfinished")]
    SchedulerFull {
        /// The configured limit.
        jobs_max: usize,
    },
    /// The job's (provider, model) queue holds `queue_jobs_max` unfinished jobs.
    #[error("queue {provider}/{model} full: {queue_jobs_max} jobs unfinished")]
    QueueFull {
        /// The queue's provider.
        provider: String,
        /// The queue's model.
        model: String,
        /// The configured limit.
        queue_jobs_max: usize,
    },
    /// The tenant holds `tenant_jobs_max` unfinished jobs in the job's queue.
    #[error("tenant {tenant_id} full in queue {provider}/{model}: {tenant_jobs_max} jobs unfinished")]
    TenantFull {
        /// The tenant.
        tenant_id: String,
        /// The queue's provider.
        provider: String,
        /// The queue's model.
        model: String,
        /// The configured limit.
        tenant_jobs_max: usize,
    },
    /// The job needs a new (provider, model) queue and `queues_max` exist.
    #[error("too many queues: {queues_max} (provider, model) queues exist")]
    TooManyQueues {
        /// The configured limit.
        queues_max: usize,
    },
    /// The job names a class the scheduler was not configured with.
    #[error("unknown class {class:?}")]
    UnknownClass {
        /// The class the job named.
        class: String,
    },
    /// The scheduler is shutting down and takes no more jobs.
    #[error("scheduler shut down")]
    ShutDown,
}

/// A refused job, handed back so the caller can retry or run it elsewhere.
pub struct SubmitError {
    kind: SubmitErrorKind,
    spec: Box<JobSpec>,
    /// Behind a mutex only so the error is `Sync`, as error types are expected to
    /// be; the call is never reached through a shared reference.
    execute: Mutex<ExecuteFn>,
}

impl SubmitError {
    pub(crate) fn new(kind: SubmitErrorKind, job: Job) -> Self {
        let (spec, execute) = job.into_parts();
        Self {
            kind,
            spec: Box::new(spec),
            execute: Mutex::new(execute),
        }
    }

    /// Why the job was refused.
    pub fn kind(&self) -> &SubmitErrorKind {
        &self.kind
    }

    /// What the refused job is.
    pub fn job_spec(&self) -> &JobSpec {
        &self.spec
    }

    /// The refused job, untouched.
    pub fn into_job(self) -> Job {
        let execute = self
            .execute
            .into_inner()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        Job::from_parts(*self.spec, execute)
    }
}

impl fmt::Debug for SubmitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SubmitError")
            .field("kind", &self.kind)
            .field("job_id", &self.spec.job_id)
            .finish()
    }
}

impl fmt::Display for SubmitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "job {:?} refused: {}", self.spec.job_id, self.kind)
    }
}

impl std::error::Error for SubmitError {}

/// Why `shutdown` did nothing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ShutdownError {
    /// Shutdown already ran (or the scheduler is being dropped); its report was
    /// returned by that call.
    #[error("scheduler already shut down")]
    AlreadyShutDown,
}
