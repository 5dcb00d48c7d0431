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

use ratelimiter::{Actual, CompleteRequest, LeaseId, Limiter};

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
}

impl Drop for CallLease {
    fn drop(&mut self) {
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
        let Some(lease_id) = self.lease_id else {
            return;
        };
        let mut actuals: Vec<Actual> = used.map_or_else(Vec::new, |usage| {
            actuals(&self.model_keys, self.tenant_keys.as_deref(), self.log.reserved, &usage)
        });
        let (classes, class) = &self.ceilings;
        classes.add_ceiling_actuals(*class, &mut actuals);
        let Ok(request) = CompleteRequest::new(lease_id, None, actuals) else {
            tracing::error!(%lease_id, "gateway: a complete request could not be built");
            return;
        };
        let limiter = self.limiter.clone();
        let queue = self.queue.clone();
        let complete = async move {
            if let Err(e) = limiter.complete(&request).await {
                tracing::warn!(%lease_id, error = %e, "gateway: complete failed; the holds end by window or timeout");
            }
            queue.capacity_freed();
        };
        let Some(pending) = run_if_ready(complete) else {
            return;
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(pending);
            }
            Err(_) => {
                tracing::warn!(%lease_id, "gateway: no runtime to complete on; the holds end by window or timeout")
            }
        }
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
