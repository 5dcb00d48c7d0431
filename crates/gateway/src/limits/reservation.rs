//! The guard of a reservation until its call owns it: a lease granted is
//! released unused whenever the handler ends before taking it, so nothing is
//! ever lost however a call ends (docs/gateway.md, "Reconciling").

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use ratelimiter::{Actual, CompleteRequest, Denial, LeaseId, Limiter, LimiterError, ReserveOutcome, ReserveRequest};

/// Told when a reservation is released, so that calls waiting for capacity try
/// again at once (a model's queue).
pub trait CapacityFreed: Send + Sync {
    /// Capacity was just freed on this server.
    fn capacity_freed(&self);
}

/// A lease granted but not yet handed to its call: released (every rolling limit
/// back to 0, its slots freed) when dropped, so a lease is never lost however
/// the handler ends before it is taken: a client gone while queued, a waiter
/// timed out as the grant arrived, a handler dropped while its reserve was in
/// flight. [`Reserved::take`] hands the lease over to the call's [`CallLease`].
pub struct Reserved {
    limiter: Arc<dyn Limiter>,
    request: Option<ReserveRequest>,
    queue: Option<Arc<dyn CapacityFreed>>,
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
    pub fn new(limiter: Arc<dyn Limiter>, request: ReserveRequest, queue: Option<Arc<dyn CapacityFreed>>) -> Self {
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
            release_unused(&limiter, request.lease_id(), &request).await;
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
    queue: Option<Arc<dyn CapacityFreed>>,
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
pub fn spawn_if_pending<F: Future<Output = ()> + Send + 'static>(pending: Option<Pin<Box<F>>>, what: &str) {
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

/// The key a denial names, if any.
pub fn denial_key(denial: &Denial) -> Option<&str> {
    match denial {
        Denial::InsufficientCapacity { key, .. }
        | Denial::LimitDecreasing { key, .. }
        | Denial::ExceedsCapacity { key } => Some(key.as_str()),
        Denial::LeaseAlreadyFailed => None,
    }
}

/// Completes a lease whose call never reached the upstream: every rolling limit to 0.
pub async fn release_unused(limiter: &Arc<dyn Limiter>, lease_id: LeaseId, request: &ReserveRequest) {
    let actuals = request
        .requirements()
        .iter()
        .filter(|r| !r.key.as_str().ends_with(":concurrency"))
        .map(|r| Actual {
            key: r.key.clone(),
            actual_amount: 0,
        })
        .collect();
    if let Ok(complete) = CompleteRequest::new(lease_id, None, actuals) {
        if let Err(e) = limiter.complete(&complete).await {
            tracing::warn!(%lease_id, error = %e, "gateway: releasing an unused lease failed; its holds end by window or timeout");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};

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
