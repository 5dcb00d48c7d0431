//! The grant instants of our strategies' leases, so each request's time from
//! the grant to the provider's admission can be measured: the window margin
//! must cover it (BENCHMARKS.md, "Window margin").

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use ratelimiter::{CompleteRequest, Limiter, LimiterError, ReserveOutcome, ReserveRequest};

/// A [`Limiter`] that passes every call on and remembers, by job id, the
/// `reserved_at_unix_ms` of each granted reserve: the backend's grant instant,
/// from which its rolling holds run.
pub struct GrantLog {
    inner: Arc<dyn Limiter>,
    granted: Mutex<HashMap<String, u64>>,
}

impl GrantLog {
    /// Records the grants of `inner`.
    pub fn new(inner: Arc<dyn Limiter>) -> Self {
        Self {
            inner,
            granted: Mutex::new(HashMap::new()),
        }
    }

    /// The grant instant of `job_id`'s lease, forgotten once read; `None` when
    /// no reserve with that job id was granted.
    pub fn take(&self, job_id: &str) -> Option<u64> {
        self.granted.lock().expect("grant log lock").remove(job_id)
    }
}

impl std::fmt::Debug for GrantLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrantLog").finish_non_exhaustive()
    }
}

#[async_trait]
impl Limiter for GrantLog {
    async fn reserve(&self, request: &ReserveRequest) -> Result<ReserveOutcome, LimiterError> {
        let outcome = self.inner.reserve(request).await?;
        if let (ReserveOutcome::Allowed { reserved_at_unix_ms }, Some(job_id)) = (&outcome, request.job_id()) {
            let mut granted = self.granted.lock().expect("grant log lock");
            granted.insert(job_id.to_owned(), *reserved_at_unix_ms);
        }
        Ok(outcome)
    }

    async fn complete(&self, request: &CompleteRequest) -> Result<(), LimiterError> {
        self.inner.complete(request).await
    }
}
