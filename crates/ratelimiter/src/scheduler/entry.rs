//! A submitted job as the scheduler holds it: the job, its validated
//! requirements, and the state of its current reserve attempt.

use tokio::sync::oneshot;

use crate::id::LeaseId;
use crate::llm::{build_llm_actuals, build_llm_requirements};
use crate::wire::{CompleteRequest, Requirement, ReserveRequest, JOB_ID_BYTES_MAX};

use super::error::SubmitErrorKind;
use super::handle::JobHandle;
use super::job::{ExecuteFn, Job, JobSpec};
use super::outcome::JobResult;

/// One accepted job, from `submit` until its handle is answered.
pub(super) struct Entry {
    /// Submit order, unique per scheduler: a tenant's jobs run oldest first.
    pub seq: u64,
    /// What the job is.
    pub spec: JobSpec,
    /// The call, run once a reservation is granted.
    pub execute: ExecuteFn,
    /// What every attempt reserves; built and validated at submit.
    pub requirements: Vec<Requirement>,
    /// Answers the job's handle.
    pub responder: oneshot::Sender<JobResult>,
    /// A lease whose reserve outcome is unknown: the next attempt resends it unchanged,
    /// so a reservation that did land is not made twice (docs/lease-ids.md, "Rules for
    /// callers").
    pub unknown_lease: Option<LeaseId>,
    /// Consecutive attempts with an unknown outcome, reset by any real answer.
    pub unknown_retries: u32,
    /// Reserve calls made so far.
    pub reserve_attempts: u32,
}

impl Entry {
    /// Checks that `spec` makes a valid reserve and complete, and returns what
    /// every attempt reserves.
    pub fn check(spec: &JobSpec) -> Result<Vec<Requirement>, SubmitErrorKind> {
        check(spec).map_err(SubmitErrorKind::InvalidJob)
    }

    /// The entry and handle of `job`, whose `requirements` came from [`Entry::check`].
    pub fn new(job: Job, requirements: Vec<Requirement>) -> (Entry, JobHandle) {
        let (spec, execute) = job.into_parts();
        let (responder, receiver) = oneshot::channel();
        let handle = JobHandle::new(spec.job_id.clone(), receiver);
        let entry = Entry {
            seq: 0,
            spec,
            execute,
            requirements,
            responder,
            unknown_lease: None,
            unknown_retries: 0,
            reserve_attempts: 0,
        };
        (entry, handle)
    }

    /// The reserve request of one attempt under `lease_id`.
    pub fn reserve_request(&self, lease_id: LeaseId) -> ReserveRequest {
        ReserveRequest::new(lease_id, Some(self.spec.job_id.clone()), self.requirements.clone())
            .expect("requirements were validated at submit")
    }
}

/// The complete request for `spec`'s lease: its token limits reconciled to
/// `actual_tokens`, or left at the reserved upper bound when `actual_tokens` is
/// `None` (what the call used is unknown).
pub(super) fn complete_request(spec: &JobSpec, lease_id: LeaseId, actual_tokens: Option<u64>) -> CompleteRequest {
    let actuals = match actual_tokens {
        Some(tokens) => build_llm_actuals(&spec.llm_call(), tokens).expect("keys were validated at submit"),
        None => Vec::new(),
    };
    CompleteRequest::new(lease_id, Some(spec.job_id.clone()), actuals).expect("actuals were validated at submit")
}

/// Checks that `spec` makes a valid reserve and complete, and returns its requirements.
fn check(spec: &JobSpec) -> Result<Vec<Requirement>, String> {
    if spec.job_id.is_empty() || spec.job_id.len() > JOB_ID_BYTES_MAX {
        return Err(format!(
            "job_id must be 1..={JOB_ID_BYTES_MAX} bytes, got {}",
            spec.job_id.len()
        ));
    }
    let call = spec.llm_call();
    let requirements = build_llm_requirements(&call).map_err(|e| e.to_string())?;
    let actuals = build_llm_actuals(&call, 0).map_err(|e| e.to_string())?;
    let probe = LeaseId::from_u128(1);
    ReserveRequest::new(probe, Some(spec.job_id.clone()), requirements.clone()).map_err(|e| e.to_string())?;
    CompleteRequest::new(probe, Some(spec.job_id.clone()), actuals).map_err(|e| e.to_string())?;
    Ok(requirements)
}
