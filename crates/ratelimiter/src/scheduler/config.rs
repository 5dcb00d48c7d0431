//! The scheduler's limits and timings, validated once so the scheduler never
//! runs with a value it cannot honour.

use std::time::Duration;

use crate::provider::profile::ProfileRules;

use super::class::{check_classes, WorkClass, DEFAULT_CLASS};
use super::config_error::ConfigError;

/// The most workers one scheduler runs: each is a task holding at most one call
/// in flight, and providers cap concurrency far below this.
pub const WORKERS_MAX: usize = 4_096;
/// The largest value any job-count limit may take: a queued job holds its prompt,
/// so millions of them are a memory problem, not a queue.
pub const JOBS_LIMIT_MAX: usize = 1_000_000;
/// The most work classes (provider, model) any scheduler may be configured for.
pub const QUEUES_LIMIT_MAX: usize = 65_536;
/// The largest jitter: jitter spreads retries of many clients over a short span;
/// a minute of it would only add idle time.
pub const JITTER_MS_LIMIT_MAX: u64 = 60_000;
/// The most retries of a reserve whose outcome is unknown: beyond this the
/// backend is down, not slow, and the job should fail rather than wait forever.
pub const UNKNOWN_RETRIES_LIMIT_MAX: u32 = 100;
/// The most Complete attempts per lease: beyond this the lease is left to its
/// timeout, which releases it anyway.
pub const COMPLETE_ATTEMPTS_LIMIT_MAX: u32 = 100;
/// The longest timeout for one reserve or complete call.
pub const CALL_TIMEOUT_MS_LIMIT_MAX: u64 = 600_000;
/// The longest fallback wait before retrying a call that gave no hint.
pub const FALLBACK_RETRY_MS_LIMIT_MAX: u64 = 60_000;

/// The scheduler's limits and timings. Built with [`SchedulerConfig::builder`],
/// which validates every field, so a config in hand is always usable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchedulerConfig {
    workers: usize,
    jobs_max: usize,
    queue_jobs_max: usize,
    tenant_jobs_max: usize,
    queues_max: usize,
    jitter_ms_max: u64,
    jitter_seed: Option<u64>,
    unknown_retries_max: u32,
    complete_attempts_max: u32,
    call_timeout_ms: u64,
    fallback_retry_ms: u64,
    /// Provider profiles' rules: a job of their provider and model reserves and
    /// completes by them instead of the LLM helper's (crate::profile).
    profiles: Vec<ProfileRules>,
    /// The work classes, highest first (super::class).
    classes: Vec<WorkClass>,
}

impl SchedulerConfig {
    /// A builder with `workers` workers and every other field at its default.
    pub fn builder(workers: usize) -> SchedulerConfigBuilder {
        SchedulerConfigBuilder {
            config: SchedulerConfig {
                workers,
                jobs_max: 10_000,
                queue_jobs_max: 10_000,
                tenant_jobs_max: 10_000,
                queues_max: 1_024,
                jitter_ms_max: 50,
                jitter_seed: None,
                unknown_retries_max: 5,
                complete_attempts_max: 5,
                call_timeout_ms: 30_000,
                fallback_retry_ms: 250,
                profiles: Vec::new(),
                classes: vec![WorkClass::new(DEFAULT_CLASS, 1).expect("the default class is valid")],
            },
        }
    }

    /// The profile rules of `provider`'s `model`, when one was given.
    pub fn profile_rules(&self, provider: &str, model: &str) -> Option<&ProfileRules> {
        self.profiles.iter().rev().find(|r| r.applies_to(provider, model))
    }

    /// The work classes, highest first; one class named `default` unless set.
    pub fn classes(&self) -> &[WorkClass] {
        &self.classes
    }

    /// The index of the class a job naming `class` runs in: the named one, or the
    /// lowest class for a job that names none, so that work which does not say it is
    /// urgent never takes an urgent class's turns. `None` for an unknown name.
    pub fn class_index(&self, class: Option<&str>) -> Option<usize> {
        match class {
            None => Some(self.classes.len() - 1),
            Some(name) => self.classes.iter().position(|c| c.name() == name),
        }
    }

    /// Tasks that reserve, execute and complete jobs; at most this many calls are in flight.
    pub fn workers(&self) -> usize {
        self.workers
    }
    /// Jobs accepted and not yet finished, over all queues; `submit` refuses more.
    pub fn jobs_max(&self) -> usize {
        self.jobs_max
    }
    /// Jobs accepted and not yet finished in one (provider, model) queue, so one
    /// flooded provider cannot take the room every other provider needs.
    pub fn queue_jobs_max(&self) -> usize {
        self.queue_jobs_max
    }
    /// Jobs accepted and not yet finished for one tenant in one queue, so one
    /// tenant's burst cannot take the room other tenants need.
    pub fn tenant_jobs_max(&self) -> usize {
        self.tenant_jobs_max
    }
    /// Distinct (provider, model) queues held at once.
    pub fn queues_max(&self) -> usize {
        self.queues_max
    }
    /// The largest random delay added to a retry hint, so clients denied together
    /// do not all retry at the same instant.
    pub fn jitter_ms_max(&self) -> u64 {
        self.jitter_ms_max
    }
    /// The seed of the jitter's random source; `None` seeds from the OS. Fixed in
    /// tests so runs repeat exactly.
    pub fn jitter_seed(&self) -> Option<u64> {
        self.jitter_seed
    }
    /// Retries of a reserve whose outcome is unknown (backend unavailable or timed
    /// out), each with the same lease id, before the job fails.
    pub fn unknown_retries_max(&self) -> u32 {
        self.unknown_retries_max
    }
    /// Complete attempts per lease before the lease is left to its timeout.
    pub fn complete_attempts_max(&self) -> u32 {
        self.complete_attempts_max
    }
    /// How long one reserve or complete call may take before its outcome counts as unknown.
    pub fn call_timeout(&self) -> Duration {
        Duration::from_millis(self.call_timeout_ms)
    }
    /// The wait before retrying a call whose failure carried no retry hint, in ms.
    pub fn fallback_retry_ms(&self) -> u64 {
        self.fallback_retry_ms
    }
}

/// Sets [`SchedulerConfig`] fields one at a time; [`build`](Self::build) validates them.
#[derive(Debug, Clone)]
pub struct SchedulerConfigBuilder {
    config: SchedulerConfig,
}

impl SchedulerConfigBuilder {
    /// Jobs of `rules`' provider and model reserve and complete by them
    /// ([`crate::profile::llm_profile`]); a later entry for the same model replaces it.
    pub fn profile(mut self, rules: ProfileRules) -> Self {
        (self.config.profiles).retain(|r| !r.applies_to(rules.key_provider(), rules.model()));
        self.config.profiles.push(rules);
        self
    }

    /// The work classes, highest first (docs/client-library.md, "Classes"): when jobs
    /// of several classes wait for one model, freed capacity goes to them in
    /// proportion to their shares. See [`SchedulerConfig::classes`].
    pub fn classes(mut self, classes: Vec<WorkClass>) -> Self {
        self.config.classes = classes;
        self
    }

    /// See [`SchedulerConfig::jobs_max`].
    pub fn jobs_max(mut self, value: usize) -> Self {
        self.config.jobs_max = value;
        self
    }
    /// See [`SchedulerConfig::queue_jobs_max`].
    pub fn queue_jobs_max(mut self, value: usize) -> Self {
        self.config.queue_jobs_max = value;
        self
    }
    /// See [`SchedulerConfig::tenant_jobs_max`].
    pub fn tenant_jobs_max(mut self, value: usize) -> Self {
        self.config.tenant_jobs_max = value;
        self
    }
    /// See [`SchedulerConfig::queues_max`].
    pub fn queues_max(mut self, value: usize) -> Self {
        self.config.queues_max = value;
        self
    }
    /// See [`SchedulerConfig::jitter_ms_max`].
    pub fn jitter_ms_max(mut self, value: u64) -> Self {
        self.config.jitter_ms_max = value;
        self
    }
    /// See [`SchedulerConfig::jitter_seed`].
    pub fn jitter_seed(mut self, seed: u64) -> Self {
        self.config.jitter_seed = Some(seed);
        self
    }
    /// See [`SchedulerConfig::unknown_retries_max`].
    pub fn unknown_retries_max(mut self, value: u32) -> Self {
        self.config.unknown_retries_max = value;
        self
    }
    /// See [`SchedulerConfig::complete_attempts_max`].
    pub fn complete_attempts_max(mut self, value: u32) -> Self {
        self.config.complete_attempts_max = value;
        self
    }
    /// See [`SchedulerConfig::call_timeout`]; in ms.
    pub fn call_timeout_ms(mut self, value: u64) -> Self {
        self.config.call_timeout_ms = value;
        self
    }
    /// See [`SchedulerConfig::fallback_retry_ms`].
    pub fn fallback_retry_ms(mut self, value: u64) -> Self {
        self.config.fallback_retry_ms = value;
        self
    }

    /// Checks every field against its range and returns the config.
    pub fn build(self) -> Result<SchedulerConfig, ConfigError> {
        let c = self.config;
        check_range("workers", c.workers as u64, 1, WORKERS_MAX as u64)?;
        check_range("jobs_max", c.jobs_max as u64, 1, JOBS_LIMIT_MAX as u64)?;
        check_range("queue_jobs_max", c.queue_jobs_max as u64, 1, JOBS_LIMIT_MAX as u64)?;
        check_range("tenant_jobs_max", c.tenant_jobs_max as u64, 1, JOBS_LIMIT_MAX as u64)?;
        check_range("queues_max", c.queues_max as u64, 1, QUEUES_LIMIT_MAX as u64)?;
        check_range("jitter_ms_max", c.jitter_ms_max, 0, JITTER_MS_LIMIT_MAX)?;
        check_range(
            "unknown_retries_max",
            u64::from(c.unknown_retries_max),
            0,
            u64::from(UNKNOWN_RETRIES_LIMIT_MAX),
        )?;
        check_range(
            "complete_attempts_max",
            u64::from(c.complete_attempts_max),
            1,
            u64::from(COMPLETE_ATTEMPTS_LIMIT_MAX),
        )?;
        check_range("call_timeout_ms", c.call_timeout_ms, 1, CALL_TIMEOUT_MS_LIMIT_MAX)?;
        check_range("fallback_retry_ms", c.fallback_retry_ms, 1, FALLBACK_RETRY_MS_LIMIT_MAX)?;
        check_classes(&c.classes)?;
        Ok(c)
    }
}

fn check_range(field: &str, value: u64, min: u64, max: u64) -> Result<(), ConfigError> {
    if (min..=max).contains(&value) {
        Ok(())
    } else {
        Err(ConfigError(format!("{field} must be in {min}..={max}, got {value}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid() {
        let config = SchedulerConfig::builder(8).build().unwrap();
        assert_eq!(config.workers(), 8);
        assert_eq!(config.call_timeout(), Duration::from_secs(30));
    }

    #[test]
    fn out_of_range_fields_are_refused_by_name() {
        let cases = [
            (SchedulerConfig::builder(0), "workers"),
            (SchedulerConfig::builder(WORKERS_MAX + 1), "workers"),
            (SchedulerConfig::builder(1).jobs_max(0), "jobs_max"),
            (
                SchedulerConfig::builder(1).queue_jobs_max(JOBS_LIMIT_MAX + 1),
                "queue_jobs_max",
            ),
            (SchedulerConfig::builder(1).tenant_jobs_max(0), "tenant_jobs_max"),
            (SchedulerConfig::builder(1).queues_max(0), "queues_max"),
            (SchedulerConfig::builder(1).jitter_ms_max(60_001), "jitter_ms_max"),
            (
                SchedulerConfig::builder(1).unknown_retries_max(101),
                "unknown_retries_max",
            ),
            (
                SchedulerConfig::builder(1).complete_attempts_max(0),
                "complete_attempts_max",
            ),
            (SchedulerConfig::builder(1).call_timeout_ms(0), "call_timeout_ms"),
            (SchedulerConfig::builder(1).fallback_retry_ms(0), "fallback_retry_ms"),
        ];
        for (builder, field) in cases {
            let error = builder.build().unwrap_err();
            assert!(error.0.starts_with(field), "{error}");
        }
    }
}
