//! What a job's handle resolves to: the tokens it used, or why it did not run
//! to the end.

use crate::base::id::LeaseId;
use crate::model::error::LimiterError;
use crate::model::key::LimitKey;

use super::job::ExecuteError;

/// A job whose call ran and returned its token count.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobDone {
    /// The job's id, as submitted.
    pub job_id: String,
    /// The lease the call ran under.
    pub lease_id: LeaseId,
    /// The tokens the call used, as its execute returned them.
    pub actual_tokens: u64,
    /// Reserve calls made for the job, the granted one included.
    pub reserve_attempts: u32,
    /// Set when every Complete attempt failed: the lease's concurrency is then held
    /// until its timeout and its tokens stay reserved at the upper bound.
    pub complete_error: Option<LimiterError>,
}

/// Why a job did not run to the end.
#[derive(Debug, thiserror::Error)]
pub enum JobError {
    /// The job needs more than a limit's whole capacity, so it can never run.
    #[error("exceeds_capacity:{key}")]
    ExceedsCapacity {
        /// The limit that is too small.
        key: LimitKey,
    },
    /// The limiter refused the job (unknown key, bad request, conflict), or stayed
    /// unavailable through every retry.
    #[error("limiter: {0}")]
    Limiter(LimiterError),
    /// The call ran and failed. Complete was called with 0 tokens.
    #[error("execute failed: {0}")]
    Execute(ExecuteError),
    /// The call panicked. Complete was called without actuals: the tokens stay
    /// reserved at the upper bound, since what the call used is unknown.
    #[error("execute panicked")]
    Panicked,
    /// The call was still running at the shutdown deadline and was stopped.
    /// Complete was called without actuals, as for a panic.
    #[error("aborted at the shutdown deadline")]
    Aborted,
    /// The scheduler shut down before the call started.
    #[error("not run: the scheduler shut down first")]
    NotRun,
    /// The scheduler lost the job without an answer: a bug, never expected.
    #[error("lost: the scheduler dropped the job without an answer")]
    Lost,
}

/// What a job's handle resolves to.
pub type JobResult = Result<JobDone, JobError>;
