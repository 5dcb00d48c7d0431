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
    /// What the log line says.
    pub log: CallLog,
    /// When the call arrived.
    pub started: Instant,
    /// The pool and the deployment the lease is on: its local load window learns
    /// when the call ends.
    pub deployment: Option<(Arc<crate::pool::Pool>, usize)>,
    /// The call went on to another deployment of its pool, which charges the
    /// tenant: the tenant's keys of this lease are given back whole.
    pub tenant_released: bool,
    /// Completed already (by [`CallLease::finish`]).
    done: bool,
}

impl CallLease {
    /// A guard that has not completed yet.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        limiter: Arc<dyn Limiter>,
        lease_id: Option<LeaseId>,
        model_keys: Arc<ModelKeys>,
        tenant_keys: Option<Arc<TenantKeys>>,
        queue: Arc<ModelQueue>,
        counters: Arc<CallCounters>,
        count_cache_reads: bool,
        log: CallLog,
        started: Instant,
    ) -> Self {
        Self {
            limiter,
            lease_id,
            model_keys,
            tenant_keys,
            queue,
            counters,
            settle: Settle::KeepReserved,
            count_cache_reads,
            log,
            started,
            deployment: None,
            tenant_released: false,
            done: false,
        }
    }

    /// Completes now and waits for the backend's answer: a call failing over
    /// frees this lease's holds (the tenant's above all) before it reserves the
    /// next deployment.
    pub async fn finish(mut self) {
        if let Some(complete) = self.completion() {
            complete.await;
        }
    }
}

impl Drop for CallLease {
    fn drop(&mut self) {
        let Some(complete) = self.completion() else {
            return;
        };
        let Some(pending) = run_if_ready(complete) else {
            return;
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(pending);
            }
            Err(_) => {
                tracing::warn!("gateway: no runtime to complete on; the holds end by window or timeout")
            }
        }
    }
}

impl CallLease {
    /// Logs the call and returns its Complete, once: `None` the second time, or
    /// when there is no lease to complete.
    fn completion(&mut self) -> Option<impl Future<Output = ()> + Send + 'static> {
        if std::mem::replace(&mut self.done, true) {
            return None;
        }
        if let Some((pool, index)) = &self.deployment {
            pool.deployments[*index].load.ended();
        }
        let used = match self.settle {
            Settle::Usage(usage) if self.count_cache_reads => Some(Usage {
                input_tokens: usage.input_tokens.saturating_add(usage.cache_read_tokens),
                ..usage
            }),
            Settle::Usage(usage) => Some(usage),
            Settle::Refused => Some(Usage::default()),
            Settle::KeepReserved => None,
        };
        if let (Settle::Usage(_), Some(usage)) = (self.settle, used) {
            self.counters.tokens_used.fetch_add(usage.total(), Ordering::Relaxed);
        }
        let log = &self.log;
        tracing::info!(
            lease_id = %self.lease_id.map(|l| l.to_string()).unwrap_or_default(),
            endpoint = log.endpoint, model = %log.model, tenant = %log.tenant, status = log.status,
            stream = log.stream, reserved_input = log.reserved.0, reserved_output = log.reserved.1,
            used_input = used.map(|u| u.input_tokens), used_output = used.map(|u| u.output_tokens),
            cache_read = used.map(|u| u.cache_read_tokens), settle = ?self.settle,
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
            actuals.extend([&keys.daily_tokens, &keys.rpm].into_iter().flatten().map(|key| Actual {
                key: key.clone(),
                actual_amount: 0,
            }));
        }
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
