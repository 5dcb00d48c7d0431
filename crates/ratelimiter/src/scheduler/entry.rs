//! A submitted job as the scheduler holds it: the job, its validated
//! requirements, and the state of its current reserve attempt.

use tokio::sync::oneshot;

use crate::base::id::LeaseId;
use crate::model::key::{KeyError, LimitKey};
use crate::model::wire::{Actual, CompleteRequest, Requirement, ReserveRequest, JOB_ID_BYTES_MAX};
use crate::provider::llm::{build_llm_actuals, build_llm_requirements};
use crate::provider::profile::{ProfileCall, ProfileRules};

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
    /// The index of the job's work class in the scheduler's configuration.
    pub class: usize,
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
    pub fn check(spec: &JobSpec, rules: Option<&ProfileRules>) -> Result<Vec<Requirement>, SubmitErrorKind> {
        check(spec, rules).map_err(SubmitErrorKind::InvalidJob)
    }

    /// The entry and handle of `job`, whose `requirements` came from [`Entry::check`]
    /// and whose class is the configuration's class number `class`.
    pub fn new(job: Job, requirements: Vec<Requirement>, class: usize) -> (Entry, JobHandle) {
        let (spec, execute) = job.into_parts();
        let (responder, receiver) = oneshot::channel();
        let handle = JobHandle::new(spec.job_id.clone(), receiver);
        let entry = Entry {
            seq: 0,
            spec,
            class,
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
pub(super) fn complete_request(
    spec: &JobSpec,
    rules: Option<&ProfileRules>,
    lease_id: LeaseId,
    actual_tokens: Option<u64>,
) -> CompleteRequest {
    let actuals = match actual_tokens {
        Some(tokens) => actuals(spec, rules, tokens).expect("keys were validated at submit"),
        None => Vec::new(),
    };
    CompleteRequest::new(lease_id, Some(spec.job_id.clone()), actuals).expect("actuals were validated at submit")
}

/// The call as a provider profile sizes it.
fn profile_call(spec: &JobSpec) -> ProfileCall<'_> {
    ProfileCall {
        prompt: &spec.prompt,
        prompt_tokens: spec.prompt_tokens,
        cache_read_tokens: 0,
        max_output_tokens: spec.max_output_tokens,
        best_of: 1,
    }
}

/// What `spec` reserves: by its profile's rules when it has one (plus the
/// tenant's daily budget when asked for), else the LLM helper's requirements.
fn requirements(spec: &JobSpec, rules: Option<&ProfileRules>) -> Result<Vec<Requirement>, KeyError> {
    let call = spec.llm_call();
    let helper = build_llm_requirements(&call)?;
    let Some(rules) = rules else {
        return Ok(helper);
    };
    let daily = LimitKey::tenant_daily_tokens(&spec.tenant_id).ok();
    let mut requirements = rules.requirements(&profile_call(spec));
    requirements.extend(helper.into_iter().filter(|r| Some(&r.key) == daily.as_ref()));
    Ok(requirements)
}

/// What `spec` completes with after using `tokens`.
fn actuals(spec: &JobSpec, rules: Option<&ProfileRules>, tokens: u64) -> Result<Vec<Actual>, KeyError> {
    let call = spec.llm_call();
    let helper = build_llm_actuals(&call, tokens)?;
    let Some(rules) = rules else {
        return Ok(helper);
    };
    let daily = LimitKey::tenant_daily_tokens(&spec.tenant_id).ok();
    let mut actuals = rules.actuals_from_total(&profile_call(spec), tokens);
    actuals.extend(helper.into_iter().filter(|a| Some(&a.key) == daily.as_ref()));
    Ok(actuals)
}

/// Checks that `spec` makes a valid reserve and complete, and returns its requirements.
fn check(spec: &JobSpec, rules: Option<&ProfileRules>) -> Result<Vec<Requirement>, String> {
    if spec.job_id.is_empty() || spec.job_id.len() > JOB_ID_BYTES_MAX {
        return Err(format!(
            "job_id must be 1..={JOB_ID_BYTES_MAX} bytes, got {}",
            spec.job_id.len()
        ));
    }
    let requirements = requirements(spec, rules).map_err(|e| e.to_string())?;
    let actuals = actuals(spec, rules, 0).map_err(|e| e.to_string())?;
    let probe = LeaseId::from_u128(1);
    ReserveRequest::new(probe, Some(spec.job_id.clone()), requirements.clone()).map_err(|e| e.to_string())?;
    CompleteRequest::new(probe, Some(spec.job_id.clone()), actuals).map_err(|e| e.to_string())?;
    Ok(requirements)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::profile::{llm_profile, Published};

    fn spec(want_daily_budget: bool) -> JobSpec {
        JobSpec {
            job_id: "j".to_owned(),
            tenant_id: "t".to_owned(),
            provider: "anthropic".to_owned(),
            model: "claude".to_owned(),
            prompt: "x".repeat(400),
            max_output_tokens: 300,
            prompt_tokens: Some(100),
            want_daily_budget,
            class: None,
        }
    }

    fn pairs<T>(items: &[T], f: impl Fn(&T) -> (&str, u64)) -> Vec<(String, u64)> {
        items.iter().map(f).map(|(k, a)| (k.to_owned(), a)).collect()
    }

    #[test]
    fn a_job_with_a_profile_reserves_and_completes_by_its_rules() {
        let profile = llm_profile(
            "anthropic",
            "claude",
            &Published {
                rpm: Some(50),
                input_tpm: Some(30_000),
                output_tpm: Some(8_000),
                ..Published::default()
            },
        )
        .unwrap();
        let rules = Some(&profile.rules);
        let reserved = check(&spec(true), rules).unwrap();
        assert_eq!(
            pairs(&reserved, |r| (r.key.as_str(), r.amount)),
            pairs(
                &[
                    ("global:llm:anthropic:claude:rpm", 1),
                    ("global:llm:anthropic:claude:itpm", 100),
                    ("global:llm:anthropic:claude:otpm", 300),
                    ("tenant:t:llm:daily_tokens", 400),
                ],
                |&(k, a)| (k, a)
            )
        );
        let request = complete_request(&spec(true), rules, LeaseId::from_u128(7), Some(160));
        assert_eq!(
            pairs(request.actuals(), |a| (a.key.as_str(), a.actual_amount)),
            pairs(
                &[
                    ("global:llm:anthropic:claude:itpm", 100),
                    ("global:llm:anthropic:claude:otpm", 60),
                    ("tenant:t:llm:daily_tokens", 160),
                ],
                |&(k, a)| (k, a)
            )
        );
        // Without rules the LLM helper's keys are reserved, as before.
        let helper = check(&spec(false), None).unwrap();
        assert_eq!(helper[1].key.as_str(), "global:llm:anthropic:claude:tpm");
    }
}
