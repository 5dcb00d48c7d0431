//! The caller's side of a submitted job: a future of its result.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::sync::oneshot;

use super::outcome::{JobError, JobResult};

/// Resolves to the job's result once it ran, failed or was dropped by shutdown.
/// Dropping the handle does not cancel the job.
#[derive(Debug)]
pub struct JobHandle {
    job_id: String,
    receiver: oneshot::Receiver<JobResult>,
}

impl JobHandle {
    pub(crate) fn new(job_id: String, receiver: oneshot::Receiver<JobResult>) -> Self {
        Self { job_id, receiver }
    }

    /// The job's id, as submitted.
    pub fn job_id(&self) -> &str {
        &self.job_id
    }
}

impl Future for JobHandle {
    type Output = JobResult;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.receiver)
            .poll(cx)
            .map(|received| received.unwrap_or(Err(JobError::Lost)))
    }
}
