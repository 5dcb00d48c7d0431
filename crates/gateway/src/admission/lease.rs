//! One admitted call's lease, completed exactly once, when the call ends however
//! it ends (docs/gateway.md, "Reconciling").
//!
//! The three guards of a reservation hand it over here, each owning it in turn
//! so that it is never lost: [`crate::limits::Reserved`] from the backend's grant
//! to the pool's, [`Grant`] (with the breaker's pass and the deployment's load)
//! until the call takes it, and [`CallLease`] from [`CallLease::granted`] to the
//! complete. The call tells its lease what happened, one method per event
//! (answered, refused, failed, failed over, settled, finished); the lease alone
//! decides the breaker's outcome (recorded once, else its probe given back), the
//! reconciliation and the log line, and its `Drop` completes whatever the
//! handler did not (a client gone mid-stream).

use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use axum::http::StatusCode;
use ratelimiter::{Actual, CompleteRequest, LeaseId, Limiter};

use super::completed::Completed;
use super::context::CallContext;
use super::queue::ModelQueue;
use super::spend::CallSpend;
use crate::counting::calibration::Calibrator;
use crate::limits::budgets::{worst_case, GATEWAY_BUDGET_PREFIX, MODEL_BUDGET_PREFIX};
use crate::limits::{
    actuals, billed_of, call_budgets, caller_budget_releases, run_if_ready, spawn_if_pending, Classes, ModelKeys,
    TenantKeys,
};
use crate::observe::budget_alerts::AlertScope;
use crate::observe::budget_watch::{BudgetWatch, WatchedBudget};
use crate::observe::key_usage::KeyCall;
use crate::observe::metrics::CallCounters;
use crate::observe::trace::{Served, TryTrace};
use crate::routing::{Grant, Pass, Pool};
use crate::wire::response_facts::ResponseFacts;
use crate::wire::usage::Usage;

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
struct CallLog {
    /// The endpoint's label.
    endpoint: &'static str,
    /// The model.
    model: Arc<str>,
    /// The tenant, or `_none`.
    tenant: Arc<str>,
    /// The status the client got.
    status: u16,
    /// Whether the answer was streamed.
    stream: bool,
}

/// The guard of one granted lease (or of a call with no limits to reserve).
/// Its state is boxed: the lease moves with its call from admission through
/// each try into the answer's reader, and a pointer moves where the state
/// (near a kilobyte) would be copied, in every future that holds it.
pub struct CallLease {
    state: Box<LeaseState>,
}

impl std::ops::Deref for CallLease {
    type Target = LeaseState;

    fn deref(&self) -> &LeaseState {
        &self.state
    }
}

impl std::ops::DerefMut for CallLease {
    fn deref_mut(&mut self) -> &mut LeaseState {
        &mut self.state
    }
}

/// What a [`CallLease`] holds.
pub struct LeaseState {
    /// The limiter the lease was granted on.
    limiter: Arc<dyn Limiter>,
    /// `None`: the call reserved nothing (no limit applies).
    lease_id: Option<LeaseId>,
    /// Tokens reserved for input (the deployment's charge) and output.
    reserved: (u64, u64),
    /// The deployment's keys, shared with the deployment.
    model_keys: Arc<ModelKeys>,
    /// The tenant's keys, shared with the caller.
    tenant_keys: Option<Arc<TenantKeys>>,
    /// The model's queue, woken when the lease ends.
    queue: Arc<ModelQueue>,
    /// The (model, tenant) counters.
    counters: Arc<CallCounters>,
    /// The counter of the directory key the call came with, if any.
    key_call: Option<KeyCall>,
    /// How the lease completes; `KeepReserved` until the call says better.
    settle: Settle,
    /// Whether cache reads count on the input limit (the model's `count_cache_reads`).
    count_cache_reads: bool,
    /// The model's calibrator and the call's byte count, for a calibrated
    /// model's all-text prompt: fed the provider's count when the usage comes.
    calibration: Option<(Arc<Calibrator>, u64)>,
    /// The gateway's classes and the call's class: its ceilings are reconciled
    /// with the model's keys (`limits/classes.rs`).
    ceilings: (Arc<Classes>, usize),
    /// What the log line says.
    log: CallLog,
    /// When the call arrived.
    started: Instant,
    /// Whether the call was already ended by [`CallLease::finish`].
    finished: bool,
    /// The pool deployment the lease is on, with the breaker's pass it holds.
    on: OnDeployment,
    /// The call went on to another deployment of its pool, which charges the
    /// tenant: the tenant's rate keys of this lease are given back whole, its
    /// budgets only when this try did no work.
    tenant_released: bool,
    /// What a call settled to the provider's usage records in the spend ledger.
    spend: Option<CallSpend>,
    /// What the call completed as, once it has ([`CallLease::completed`]).
    completed: Option<Completed>,
    /// Raises the alerts of the call's budgets once they are reconciled.
    budget_watch: Option<Arc<BudgetWatch>>,
    /// The try's CLIENT span, when the server exports traces: ended with the lease.
    trace: Option<TryTrace>,
}

/// A lease's place in its model's pool: its local load window learns when the
/// call ends, and its breaker the call's outcome, once.
struct OnDeployment {
    pool: Arc<Pool>,
    index: usize,
    /// The breaker's pass the call went with.
    pass: Pass,
    /// Whether the call's outcome was decided on the breaker.
    decided: bool,
}

impl OnDeployment {
    /// The breaker's outcome of the call, once: `Some(success)` of a call sent
    /// and answered (or failed); `None` of a call whose outcome was never known
    /// (the client left first), which gives a probe back.
    fn decide(&mut self, outcome: Option<bool>) {
        if std::mem::replace(&mut self.decided, true) {
            return;
        }
        match outcome {
            Some(success) => self.pool.record(self.index, self.pass, success),
            None => self.pool.abandon(self.index, self.pass),
        }
    }
}

impl CallLease {
    /// The guard of `grant`'s lease for the call of `ctx`: the call owns the
    /// lease from now on.
    pub fn granted(grant: Grant, ctx: &CallContext, limiter: &Arc<dyn Limiter>, classes: &Arc<Classes>) -> Self {
        let index = grant.deployment;
        let (reserved, pass) = (grant.reserved, grant.pass);
        let model_keys = grant.keys.clone();
        let model = &ctx.model;
        let deployment = &model.pool.deployments[index];
        let state = LeaseState {
            limiter: limiter.clone(),
            lease_id: grant.take(),
            reserved,
            model_keys,
            tenant_keys: ctx.caller.keys.clone(),
            queue: model.queue.clone(),
            counters: ctx.counters.clone(),
            key_call: ctx.key_call.clone(),
            settle: Settle::KeepReserved,
            count_cache_reads: deployment.config.limits.count_cache_reads,
            calibration: (model.counter.calibrator.clone()).zip(ctx.call.calibration_sample),
            ceilings: (classes.clone(), ctx.class),
            log: CallLog {
                endpoint: ctx.endpoint.label(),
                model: model.name.clone(),
                tenant: ctx.caller.name.clone(),
                status: 0,
                stream: ctx.call.stream,
            },
            started: ctx.started,
            finished: false,
            on: OnDeployment {
                pool: model.pool.clone(),
                index,
                pass,
                decided: false,
            },
            tenant_released: false,
            spend: ctx.spend.clone(),
            completed: None,
            budget_watch: None,
            trace: None,
        };
        CallLease { state: Box::new(state) }
    }

    /// The lease whose completion gives its budgets to `watch` (docs/gateway.md,
    /// "Budgets and spend", alerts).
    pub fn watched_by(mut self, watch: Option<Arc<BudgetWatch>>) -> Self {
        self.budget_watch = watch;
        self
    }

    /// The try's CLIENT span, ended when the lease ends.
    pub fn traced(&mut self, trace: TryTrace) {
        self.trace = Some(trace);
    }

    /// The provider answered the try with `status`, for its CLIENT span.
    pub fn trace_answered(&self, status: StatusCode) {
        if let Some(trace) = &self.trace {
            trace.answered(status);
        }
    }

    /// How the try's answer is read for its CLIENT span: `None` untraced,
    /// `Some(false)` for its facts, `Some(true)` for its text too (the
    /// operator opted in to message content).
    pub fn trace_reads(&self) -> Option<bool> {
        self.trace.as_ref().map(TryTrace::captures_content)
    }

    /// What the try's answer said of itself, for its CLIENT span.
    pub fn trace_response(&self, facts: ResponseFacts) {
        if let Some(trace) = &self.trace {
            trace.responded(facts);
        }
    }

    /// The try's stream sent its first bytes, for its CLIENT span.
    pub fn trace_first_chunk(&self) {
        if let Some(trace) = &self.trace {
            trace.first_chunk();
        }
    }

    /// The try failed with `error_type` before an answer, for its CLIENT span.
    pub fn trace_failed(&self, error_type: &str) {
        if let Some(trace) = &self.trace {
            trace.failed(error_type);
        }
    }

    /// What the call completed as; `None` until it has (its answer's end, or
    /// a failover of this try).
    pub fn completed(&self) -> Option<&Completed> {
        self.completed.as_ref()
    }

    /// The index of the deployment in its pool.
    pub fn deployment(&self) -> usize {
        self.on.index
    }

    /// The deployment answered with `status`: a success for its breaker unless a
    /// 5xx; a 4xx (a 429 included) was refused before any work (docs/gateway.md,
    /// "Reconciling"), so its tokens go back.
    pub fn answered(&mut self, status: StatusCode) {
        self.log.status = status.as_u16();
        self.on.decide(Some(!status.is_server_error()));
        if status == StatusCode::TOO_MANY_REQUESTS {
            self.counters.provider_429.fetch_add(1, Ordering::Relaxed);
        }
        if status.is_client_error() {
            self.settle = Settle::Refused;
        }
    }

    /// The provider answered `status` and said the deployment cannot serve for
    /// now (Bedrock's `ModelNotReadyException`, a 429): as
    /// [`CallLease::answered`], and a failure for its breaker.
    pub fn answered_unavailable(&mut self, status: StatusCode) {
        self.on.decide(Some(false));
        self.answered(status);
    }

    /// The deployment did no work for the call (no connection, or the provider
    /// refused the gateway's own key): a failure for its breaker, tokens back;
    /// the client gets `status`.
    pub fn refused(&mut self, status: StatusCode) {
        self.log.status = status.as_u16();
        self.on.decide(Some(false));
        self.settle = Settle::Refused;
    }

    /// The deployment failed after the call was sent (a broken connection, a
    /// timeout): a failure for its breaker; the whole reservation is kept, never
    /// less than the provider can have counted. The client gets `status`.
    pub fn failed(&mut self, status: StatusCode) {
        self.log.status = status.as_u16();
        self.on.decide(Some(false));
    }

    /// The call goes on to another deployment of its pool: this try completes now
    /// with what it was settled to, and the caller's request rates are given back
    /// whole, since the deployment that serves the call charges them; its budgets,
    /// in tokens and in money, keep a sent try's worst case: the provider bills it.
    pub async fn failed_over(mut self) {
        let deployment = &self.on.pool.deployments[self.on.index];
        deployment.state.failed_over.fetch_add(1, Ordering::Relaxed);
        self.tenant_released = true;
        self.finish().await;
    }

    /// The provider reported the call's usage: every token limit is reconciled to it.
    pub fn settled(&mut self, usage: Usage) {
        self.settle = Settle::Usage(usage);
    }

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
        self.on.pool.deployments[self.on.index].load.ended();
        // A call that never got its outcome decided gives a probe back.
        self.on.decide(None);
        if let (Settle::Usage(usage), Some((calibrator, bytes))) = (self.settle, &self.calibration) {
            // The provider's count of the whole prompt, cached parts included.
            calibrator.observe(*bytes, usage.input_tokens.saturating_add(usage.cache_read_tokens));
        }
        let used = self.used();
        if let (Settle::Usage(_), Some(usage)) = (self.settle, used) {
            self.counters.tokens_used.fetch_add(usage.billed(), Ordering::Relaxed);
            if let Some(key) = &self.key_call {
                key.used(usage.billed());
            }
        }
        self.completed = Some(self.completion(used));
        self.log_line(used);
        self.end_trace(used);
        if let (Settle::Usage(_), Some(spend), Some(completed)) = (self.settle, &self.spend, &self.completed) {
            // Queued, never awaited: the answer does not wait for the ledger.
            spend.record(completed);
        }
        let request = self.complete_request(used)?;
        let limiter = self.limiter.clone();
        let queue = self.queue.clone();
        let watched = self.watched_budgets();
        Some(async move {
            if let Err(e) = limiter.complete(&request).await {
                let lease_id = request.lease_id();
                tracing::warn!(%lease_id, error = %e, "gateway: complete failed; the holds end by window or timeout");
            }
            queue.capacity_freed();
            if let Some((watch, budgets)) = watched {
                watch.after_reconcile(budgets);
            }
        })
    }

    /// The watch and the call's budgets with `alert_at`, if any: each as the
    /// call was charged on it, whose it is named by its owner's prefix.
    fn watched_budgets(&self) -> Option<(Arc<BudgetWatch>, Vec<WatchedBudget>)> {
        let watch = self.budget_watch.as_ref()?;
        let owner = |key: &str| {
            if key.starts_with(MODEL_BUDGET_PREFIX) {
                AlertScope {
                    tenant: None,
                    model: Some(self.log.model.to_string()),
                }
            } else if key.starts_with(GATEWAY_BUDGET_PREFIX) {
                AlertScope::default()
            } else {
                AlertScope {
                    tenant: Some(self.log.tenant.to_string()),
                    model: None,
                }
            }
        };
        let budgets: Vec<_> = call_budgets(&self.model_keys, self.tenant_keys.as_deref())
            .filter(|budget| !budget.alert_at.is_empty())
            .map(|budget| WatchedBudget {
                key: budget.key.clone(),
                scope: owner(budget.key.as_str()),
                span: budget.span,
                alert_at: budget.alert_at.clone(),
            })
            .collect();
        (!budgets.is_empty()).then(|| (Arc::clone(watch), budgets))
    }

    /// What the limits are reconciled to; `None`: the reservation is kept.
    fn used(&self) -> Option<Usage> {
        match self.settle {
            // The reads move to the input side; counted once on the budget.
            Settle::Usage(usage) if self.count_cache_reads => Some(Usage {
                input_tokens: usage.input_tokens.saturating_add(usage.cache_read_tokens),
                cache_read_tokens: 0,
                // Still priced as cache reads by a budget in money.
                cached_input_tokens: usage.cached_input_tokens.saturating_add(usage.cache_read_tokens),
                ..usage
            }),
            Settle::Usage(usage) => Some(usage),
            Settle::Refused => Some(Usage::default()),
            Settle::KeepReserved => None,
        }
    }

    /// What the call completed as, with `used` its reconciled usage.
    fn completion(&self, used: Option<Usage>) -> Completed {
        let deployment = &self.on.pool.deployments[self.on.index];
        Completed {
            tenant: self.log.tenant.clone(),
            model: self.log.model.clone(),
            deployment: deployment.label.clone(),
            deployment_model: deployment.config.name.clone(),
            usage: used,
            billed_micro_usd: used.and_then(|usage| billed_of(&self.model_keys, &usage)),
        }
    }

    /// The try's CLIENT span ends with the provider's usage, and the call's
    /// SERVER span learns what this try reserved and was reconciled to.
    fn end_trace(&self, used: Option<Usage>) {
        let Some(trace) = &self.trace else {
            return;
        };
        let usage = match self.settle {
            Settle::Usage(usage) => Some(usage),
            _ => None,
        };
        let served = Served {
            deployment: self.on.pool.deployments[self.on.index].label.clone(),
            reserved_tokens: self.reserved.0.saturating_add(self.reserved.1),
            used_tokens: used.map(|u| u.input_tokens.saturating_add(u.output_tokens)),
            reserved_micro_usd: worst_case(self.model_keys.price.as_ref(), self.reserved),
            billed_micro_usd: self.completed.as_ref().and_then(|c| c.billed_micro_usd),
        };
        trace.ended(usage, served);
    }

    /// The call's one log line.
    fn log_line(&self, used: Option<Usage>) {
        let (log, reserved) = (&self.log, self.reserved);
        tracing::info!(
            lease_id = %self.lease_id.map(|l| l.to_string()).unwrap_or_default(),
            endpoint = log.endpoint, model = %log.model, tenant = %log.tenant, status = log.status,
            stream = log.stream, reserved_input = reserved.0, reserved_output = reserved.1,
            used_input = used.map(|u| u.input_tokens), used_output = used.map(|u| u.output_tokens),
            cache_read = match self.settle { Settle::Usage(u) => Some(u.cache_read_tokens), _ => None },
            settle = ?self.settle,
            billed_micro_usd = self.completed.as_ref().and_then(|c| c.billed_micro_usd),
            elapsed_ms = self.started.elapsed().as_millis() as u64,
            "gateway call"
        );
    }

    /// The lease's complete: the model's keys, the tenant's (or, after a
    /// failover, the caller's rate keys back to 0 and its budgets back to 0 when
    /// the try did no work) and the class's ceilings.
    fn complete_request(&self, used: Option<Usage>) -> Option<CompleteRequest> {
        let lease_id = self.lease_id?;
        let tenant = if self.tenant_released {
            None
        } else {
            self.tenant_keys.as_deref()
        };
        let mut actuals: Vec<Actual> = used.map_or_else(Vec::new, |usage| {
            actuals(&self.model_keys, tenant, self.reserved, &usage)
        });
        if let (true, Some(keys)) = (self.tenant_released, &self.tenant_keys) {
            // The caller's request rates (its tenant's and its key's own), back
            // to 0: the deployment that serves the call counts the request.
            let own_rpm = keys.key.as_ref().and_then(|k| k.rpm.as_ref());
            let rates = keys.rpm.iter().chain(own_rpm);
            // An attempt sent is an attempt charged: a try whose bill is unknown
            // (`used` is `None`: a 5xx, a timeout, a connection lost after
            // sending) keeps its worst case on the caller's budgets, in tokens
            // (`daily_tokens`) and in money, as on the model's and the gateway's,
            // since the provider did the work and bills it; only a try that did
            // none (refused, never sent) frees them.
            let budgets = keys.budgets().filter(|_| used.is_some());
            actuals.extend(rates.chain(budgets).map(|key| Actual {
                key: key.clone(),
                actual_amount: 0,
            }));
            if used.is_some() {
                actuals.extend(caller_budget_releases(&self.model_keys, keys, self.reserved));
            }
        }
        let (classes, class) = &self.ceilings;
        classes.add_ceiling_actuals(*class, &mut actuals);
        match CompleteRequest::new(lease_id, None, actuals) {
            Ok(request) => Some(request),
            Err(_) => {
                tracing::error!(%lease_id, "gateway: a complete request could not be built");
                None
            }
        }
    }
}

impl Drop for CallLease {
    fn drop(&mut self) {
        if let Some(complete) = self.end() {
            spawn_if_pending(run_if_ready(complete), "a call's complete");
        }
    }
}
