//! One admitted call's lease, completed exactly once, when the call ends however
//! it ends (docs/gateway.md, "Reconciling"): the guard's `Drop` is the only place
//! that completes, so an answer sent, a stream finished, an upstream failure and
//! a client that disconnects mid-stream all complete once and only once.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Instant;

use ratelimiter::{Actual, CompleteRequest, Denial, LeaseId, Limiter, LimiterError, ReserveOutcome, ReserveRequest};

use crate::calibration::Calibrator;
use crate::classes::Classes;
use crate::limits::{actuals, ModelKeys, TenantKeys};
use crate::metrics::CallCounters;
use crate::queue::ModelQueue;
use crate::usage::Usage;

/// How the call's tokens are reconciled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settle {
    /// The provider's usage: every token limit reconciled to it.
    Usage(Usage),
    /// The provider refused the call before doing any work (a 4xx, a 429, or no
    /// connection): tokens back to 0; the request stays counted on rpm.
    Refused,
    /// Unknown (a client gone mid-stream, an upstream failure or timeout after
    /// the request was sent): the whole reservation is kept until its window ends,
    /// never less than the provider can have counted.
    KeepReserved,
}

/// What the call's log line says besides the lease.
#[derive(Debug, Clone)]
pub struct CallLog {
    /// The endpoint's label.
    pub endpoint: &'static str,
    /// The model.
    pub model: Arc<str>,
    /// The tenant, or `_none`.
    pub tenant: Arc<str>,
    /// Tokens reserved for input and output.
    pub reserved: (u64, u64),
    /// The status the client got.
    pub status: u16,
    /// Whether the answer was streamed.
    pub stream: bool,
}

/// The guard of one granted lease (or of a call with no limits to reserve).
pub struct CallLease {
    /// The limiter the lease was granted on.
    pub limiter: Arc<dyn Limiter>,
    /// `None`: the call reserved nothing (no limit applies).
    pub lease_id: Option<LeaseId>,
    /// The model's keys, shared with the model's entry.
    pub model_keys: Arc<ModelKeys>,
    /// The tenant's keys, shared with the tenant's entry.
    pub tenant_keys: Option<Arc<TenantKeys>>,
    /// The model's queue, woken when the lease ends.
    pub queue: Arc<ModelQueue>,
    /// The (model, tenant) counters.
    pub counters: Arc<CallCounters>,
    /// How the lease completes; `KeepReserved` until the call says better.
    pub settle: Settle,
    /// Whether cache reads count on the input limit (the model's `count_cache_reads`).
    pub count_cache_reads: bool,
    /// The model's calibrator and the call's byte count, for a calibrated
    /// model's all-text prompt: fed the provider's count when the usage comes.
    pub calibration: Option<(Arc<Calibrator>, u64)>,
    /// The gateway's classes and the call's class: its ceilings are reconciled
    /// with the model's keys (crate::classes).
    pub ceilings: (Arc<Classes>, usize),
    /// What the log line says.
    pub log: CallLog,
    /// When the call arrived.
    pub started: Instant,
    /// Whether the call was already ended by [`CallLease::finish`]; `false` at start.
    pub finished: bool,
    /// The pool deployment the lease is on, with the breaker's pass it holds:
    /// its local load window learns when the call ends, and a probe whose
    /// outcome was never recorded (the client left first) is given back.
    pub deployment: Option<OnDeployment>,
    /// The call went on to another deployment of its pool, which charges the
    /// tenant: the tenant's keys of this lease are given back whole.
    pub tenant_released: bool,
}

/// A lease's place in its model's pool.
pub struct OnDeployment {
    /// The pool.
    pub pool: Arc<crate::pool::Pool>,
    /// The deployment's index in it.
    pub index: usize,
    /// The breaker's pass the call went with.
    pub pass: crate::breaker::Pass,
    /// Whether the call's outcome was recorded on the breaker.
    pub recorded: bool,
}

impl OnDeployment {
    /// Records the sent call's outcome on the deployment's breaker, once.
    pub fn record(&mut self, success: bool) {
        if !std::mem::replace(&mut self.recorded, true) {
            self.pool.record(self.index, self.pass, success);
        }
    }
}

impl CallLease {
    /// Ends the call now and waits for its complete: an answer whose end the
    /// client sees only after this has freed its capacity (a client's next call
    /// finds it free, on TigerBeetle too). `Drop` then does nothing more.
    /// A complete that has to wait runs on a task of its own, so a handler
    /// dropped during the wait (a client gone) cannot drop the complete with it.
    pub async fn finish(&mut self) {
        if let Some(pending) = self.end().and_then(run_if_ready) {
            if let Err(e) = tokio::spawn(pending).await {
                tracing::warn!(error = %e, "gateway: a complete task failed; the holds end by window or timeout");
            }
        }
    }

    /// Logs the call and returns its complete, once (`None` after the first time,
    /// or when there is no lease to complete).
    fn end(&mut self) -> Option<impl Future<Output = ()> + Send + 'static> {
        if std::mem::replace(&mut self.finished, true) {
            return None;
        }
        if let Some(on) = &mut self.deployment {
            on.pool.deployments[on.index].load.ended();
            // A call that never got its outcome recorded gives a probe back.
            if !std::mem::replace(&mut on.recorded, true) {
                on.pool.abandon(on.index, on.pass);
            }
        }
        if let (Settle::Usage(usage), Some((calibrator, bytes))) = (self.settle, &self.calibration) {
            // The provider's count of the whole prompt, cached parts included.
            calibrator.observe(*bytes, usage.input_tokens.saturating_add(usage.cache_read_tokens));
        }
        let used = match self.settle {
            // The reads move to the input side; counted once on the budget.
            Settle::Usage(usage) if self.count_cache_reads => Some(Usage {
                input_tokens: usage.input_tokens.saturating_add(usage.cache_read_tokens),
                cache_read_tokens: 0,
                ..usage
            }),
            Settle::Usage(usage) => Some(usage),
            Settle::Refused => Some(Usage::default()),
            Settle::KeepReserved => None,
        };
        if let (Settle::Usage(_), Some(usage)) = (self.settle, used) {
            self.counters.tokens_used.fetch_add(usage.billed(), Ordering::Relaxed);
        }
        let log = &self.log;
        tracing::info!(
            lease_id = %self.lease_id.map(|l| l.to_string()).unwrap_or_default(),
            endpoint = log.endpoint, model = %log.model, tenant = %log.tenant, status = log.status,
            stream = log.stream, reserved_input = log.reserved.0, reserved_output = log.reserved.1,
            used_input = used.map(|u| u.input_tokens), used_output = used.map(|u| u.output_tokens),
            cache_read = match self.settle { Settle::Usage(u) => Some(u.cache_read_tokens), _ => None },
            settle = ?self.settle,
            elapsed_ms = self.started.elapsed().as_millis() as u64,
            "gateway call"
        );
        let lease_id = self.lease_id?;
        let tenant = if self.tenant_released {
            None
        } else {
            self.tenant_keys.as_deref()
        };
        let mut actuals: Vec<Actual> = used.map_or_else(Vec::new, |usage| {
            actuals(&self.model_keys, tenant, self.log.reserved, &usage)
        });
        if let (true, Some(keys)) = (self.tenant_released, &self.tenant_keys) {
            // Every tenant key this lease holds, back to 0: the deployment that
            // serves the call charges the tenant.
            let held = [&keys.daily_tokens, &keys.rpm].into_iter().flatten();
            actuals.extend(held.map(|key| Actual {
                key: key.clone(),
                actual_amount: 0,
            }));
        }
        let (classes, class) = &self.ceilings;
        classes.add_ceiling_actuals(*class, &mut actuals);
        let Ok(request) = CompleteRequest::new(lease_id, None, actuals) else {
            tracing::error!(%lease_id, "gateway: a complete request could not be built");
            return None;
        };
        let limiter = self.limiter.clone();
        let queue = self.queue.clone();
        Some(async move {
            if let Err(e) = limiter.complete(&request).await {
                tracing::warn!(%lease_id, error = %e, "gateway: complete failed; the holds end by window or timeout");
            }
            queue.capacity_freed();
        })
    }
}

impl Drop for CallLease {
    fn drop(&mut self) {
        if let Some(complete) = self.end() {
            spawn_if_pending(run_if_ready(complete), "a call's complete");
        }
    }
}

/// A lease granted but not yet handed to its call: released (every rolling limit
/// back to 0, its slots freed) when dropped, so a lease is never lost however
/// the handler ends before it is taken: a client gone while queued, a waiter
/// timed out as the grant arrived, a handler dropped while its reserve was in
/// flight. [`Reserved::take`] hands the lease over to the call's [`CallLease`].
pub struct Reserved {
    limiter: Arc<dyn Limiter>,
    request: Option<ReserveRequest>,
    queue: Option<Arc<ModelQueue>>,
}

impl std::fmt::Debug for Reserved {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reserved")
            .field("lease_id", &self.request.as_ref().map(|r| r.lease_id()))
            .finish()
    }
}

impl Reserved {
    /// The guard of `request`'s granted lease; `queue` is woken when it is released.
    pub fn new(limiter: Arc<dyn Limiter>, request: ReserveRequest, queue: Option<Arc<ModelQueue>>) -> Self {
        Self {
            limiter,
            request: Some(request),
            queue,
        }
    }

    /// The lease id, for the call that now owns the lease.
    pub fn take(mut self) -> LeaseId {
        self.request.take().expect("taken once").lease_id()
    }
}

impl Drop for Reserved {
    fn drop(&mut self) {
        let Some(request) = self.request.take() else {
            return;
        };
        let limiter = self.limiter.clone();
        let queue = self.queue.clone();
        let release = async move {
            crate::queue::release_unused(&limiter, request.lease_id(), &request).await;
            if let Some(queue) = queue {
                queue.capacity_freed();
            }
        };
        spawn_if_pending(run_if_ready(release), "a lease released unused");
    }
}

/// The answer of [`reserve_guarded`].
#[derive(Debug)]
pub enum Reservation {
    /// Granted: the guard owns the lease.
    Allowed(Reserved),
    /// Refused.
    Denied(Denial),
}

/// Reserves `request` so that the lease cannot be lost if the caller is dropped
/// while the reserve is in flight (a client that leaves during TigerBeetle's
/// round trip): a reserve that must wait runs on a task of its own, and a grant
/// nobody takes any more is dropped there, which releases it. A backend that
/// answers on the first poll (the memory backend) needs no task.
pub async fn reserve_guarded(
    limiter: &Arc<dyn Limiter>,
    request: ReserveRequest,
    queue: Option<Arc<ModelQueue>>,
) -> Result<Reservation, LimiterError> {
    let limiter = limiter.clone();
    let reserve = async move {
        match limiter.reserve(&request).await? {
            ReserveOutcome::Allowed { .. } => Ok(Reservation::Allowed(Reserved::new(limiter, request, queue))),
            ReserveOutcome::Denied(denial) => Ok(Reservation::Denied(denial)),
        }
    };
    let mut reserve = Box::pin(reserve);
    let first = reserve.as_mut().poll(&mut Context::from_waker(Waker::noop()));
    if let Poll::Ready(outcome) = first {
        return outcome;
    }
    tokio::spawn(reserve)
        .await
        .map_err(|e| LimiterError::Backend(format!("the reserve task failed: {e}")))?
}

/// Spawns `pending` on the current runtime, if any is left to run.
fn spawn_if_pending<F: Future<Output = ()> + Send + 'static>(pending: Option<Pin<Box<F>>>, what: &str) {
    let Some(pending) = pending else {
        return;
    };
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) => {
            runtime.spawn(pending);
        }
        Err(_) => tracing::warn!("gateway: no runtime for {what}; the holds end by window or timeout"),
    }
}

/// Polls `future` once: a backend that answers without waiting (the memory
/// backend's complete takes its lock and returns) finishes here, with no task
/// spawned for it; a future that has to wait (TigerBeetle's round trip) is
/// returned, to be spawned, and resumes from where the poll left it.
pub fn run_if_ready<F: Future<Output = ()>>(future: F) -> Option<Pin<Box<F>>> {
    let mut future = Box::pin(future);
    let mut context = Context::from_waker(Waker::noop());
    match future.as_mut().poll(&mut context) {
        Poll::Ready(()) => None,
        Poll::Pending => Some(future),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;

    #[tokio::test]
    async fn a_ready_future_runs_at_once_and_a_waiting_one_is_handed_back() {
        let ran = Arc::new(AtomicBool::new(false));
        let flag = ran.clone();
        assert!(run_if_ready(async move { flag.store(true, Ordering::SeqCst) }).is_none());
        assert!(ran.load(Ordering::SeqCst), "ran in the poll");
        let (send, receive) = tokio::sync::oneshot::channel::<()>();
        let flag = ran.clone();
        let pending = run_if_ready(async move {
            let _ = receive.await;
            flag.store(false, Ordering::SeqCst);
        })
        .expect("waits on the channel");
        let task = tokio::spawn(pending);
        send.send(()).unwrap();
        task.await.unwrap();
        assert!(!ran.load(Ordering::SeqCst), "resumed and finished on its task");
    }
}
