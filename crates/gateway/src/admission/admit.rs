//! Admission (docs/gateway.md, "Waiting"): a call is reserved all or nothing on
//! one deployment of its model's pool, at once when nobody of its class or
//! above waits and a deployment has room, else in the model's fair queue up to
//! `max_wait_ms`; refused, it gets the provider's 429 (or a 400 when it can
//! never fit, a 502 when every deployment is failing).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ratelimiter::{
    Backend, CompleteRequest, Denial, LeaseId, LimitKey, Limiter, LimiterError, Requirement, ReserveRequest,
};

use super::budget::{budget_denied, budget_refusal, budget_report, refusal_headers};
use super::context::CallContext;
use super::entry::{Caller, ModelEntry};
use super::lease::CallLease;
#[cfg(doc)]
use super::queue::ModelQueue;
use super::queue::PUMP_SLEEP_MAX_MS;
use crate::limits::{
    denial_key, is_budget_key, is_own_key, reserve_guarded, CapacityFreed, Classes, Reservation, KEY_LIMIT_PREFIX,
};
use crate::observe::budget_watch::BudgetWatch;
use crate::observe::metrics::GatewayMetrics;
use crate::routing::{Grant, Need, Refusal};
use crate::wire::call::{Call, Endpoint};
use crate::wire::error::{ErrorKind, GatewayError};

/// What admits calls, shared by every call of the gateway.
pub struct Admission {
    limiter: Arc<dyn Limiter>,
    /// The backend itself, for the figures of a 429.
    backend: Arc<dyn Backend>,
    /// The tenants in configuration order, then the caller without a tenant.
    callers: Vec<Arc<Caller>>,
    classes: Arc<Classes>,
    metrics: Arc<GatewayMetrics>,
    /// The budgets with `alert_at`, read after each reconciliation; none without.
    budget_watch: Option<Arc<BudgetWatch>>,
}

impl Admission {
    /// Admission on `limiter` (a view of `backend`) for `callers` (the tenants,
    /// then the caller without one) in `classes`, counted in `metrics`.
    pub fn new(
        (limiter, backend): (Arc<dyn Limiter>, Arc<dyn Backend>),
        callers: Vec<Caller>,
        classes: Arc<Classes>,
        metrics: Arc<GatewayMetrics>,
    ) -> Self {
        assert!(
            callers.last().is_some_and(|c| c.keys.is_none()),
            "the caller without a tenant is last"
        );
        Self {
            limiter,
            backend,
            callers: callers.into_iter().map(Arc::new).collect(),
            classes,
            metrics,
            budget_watch: None,
        }
    }

    /// Raises `watch`'s budget alerts after each call's reconciliation.
    pub fn with_budget_watch(self, watch: Option<Arc<BudgetWatch>>) -> Self {
        Self {
            budget_watch: watch,
            ..self
        }
    }

    /// The caller at `index` (see [`Admission::no_tenant`]).
    pub fn caller(&self, index: usize) -> &Arc<Caller> {
        &self.callers[index]
    }

    /// The index of the caller without a tenant.
    pub fn no_tenant(&self) -> usize {
        self.callers.len() - 1
    }

    /// The tenants, in configuration order.
    pub fn tenants(&self) -> &[Arc<Caller>] {
        &self.callers[..self.no_tenant()]
    }

    /// The gateway's classes.
    pub fn classes(&self) -> &Arc<Classes> {
        &self.classes
    }

    /// The limiter calls reserve on.
    pub fn limiter(&self) -> &Arc<dyn Limiter> {
        &self.limiter
    }

    /// The backend the limiter is a view of.
    pub fn backend(&self) -> &Arc<dyn Backend> {
        &self.backend
    }

    /// The context of a call of `caller` in `class` to `model`, read as `call`.
    pub fn context(
        &self,
        (caller, class): (Arc<Caller>, usize),
        model: Arc<ModelEntry>,
        (endpoint, call): (Endpoint, Call),
        started: Instant,
    ) -> CallContext {
        let need = Need {
            tenant: caller.keys.clone(),
            input_tokens: call.input_tokens,
            prompt_characters: call.prompt_characters,
            output_tokens: call.output_tokens,
            tried: 0,
            class,
            classes: self.classes.clone(),
            owner: Some(caller.lease_owner()),
        };
        CallContext {
            counters: model.counters(&caller, &self.metrics),
            class_counters: model.class_counters(class, &self.classes, &self.metrics),
            key_call: None,
            endpoint,
            call,
            caller,
            class,
            model,
            need,
            started,
            spend: None,
            trace: None,
        }
    }

    /// Admits the call on a deployment it has not tried yet and hands the grant's
    /// lease to the call's guard, with no await between: each try's lease is
    /// owned from grant to complete.
    pub async fn admit(&self, ctx: &mut CallContext) -> Result<CallLease, GatewayError> {
        let grant = match self.grant(ctx).await {
            Ok(grant) => grant,
            Err(error) => {
                if matches!(error.kind, ErrorKind::RateLimited { .. }) {
                    ctx.class_counters.denied.fetch_add(1, Ordering::Relaxed);
                }
                return Err(error);
            }
        };
        if ctx.need.tried == 0 {
            ctx.class_counters.admitted.fetch_add(1, Ordering::Relaxed);
            ctx.counters.admitted.fetch_add(1, Ordering::Relaxed);
            if let Some(key) = &ctx.key_call {
                key.admitted();
            }
            let reserved = grant.reserved.0.saturating_add(grant.reserved.1);
            ctx.counters.tokens_reserved.fetch_add(reserved, Ordering::Relaxed);
        }
        ctx.need.tried |= 1 << grant.deployment;
        if let Some(trace) = &ctx.trace {
            trace.admitted();
        }
        Ok(CallLease::granted(grant, ctx, &self.limiter, &self.classes).watched_by(self.budget_watch.clone()))
    }

    /// Reserves the call all or nothing on one deployment of the model's pool: at
    /// once when nobody waits on the model and a deployment has room, else in the
    /// model's queue up to `max_wait_ms`.
    async fn grant(&self, ctx: &CallContext) -> Result<Grant, GatewayError> {
        if let Some(refusal) = budget_refusal(ctx) {
            return Err(refusal);
        }
        let model = &ctx.model;
        let max_wait_ms = model.config.max_wait_ms;
        let mut denied = None;
        if !model.queue.is_busy(ctx.need.class, ctx.caller.index) {
            let queue: Arc<dyn CapacityFreed> = model.queue.clone();
            match model.pool.reserve(&self.limiter, &queue, &ctx.need).await {
                Ok(grant) => return Ok(grant),
                Err(Refusal::Denied(denial)) => {
                    if denial.is_permanent() || self.is_budget(ctx, &denial) || max_wait_ms == 0 {
                        return Err(self.refuse(ctx, denial).await);
                    }
                    denied = Some(denial);
                }
                Err(Refusal::Failing { retry_after_ms }) if retry_after_ms == 0 || max_wait_ms == 0 => {
                    return Err(failing(retry_after_ms));
                }
                Err(Refusal::Failing { .. }) => {}
                Err(Refusal::Backend(e)) => return Err(backend_error(e)),
                Err(Refusal::QueueFull) => return Err(queue_failed()),
            }
        }
        self.wait(ctx, max_wait_ms, denied).await
    }

    /// The call's wait in the model's queue, up to `max_wait_ms`; `denied` is the
    /// denial of its try before it queued, if any (see [`ModelQueue::enqueue`]).
    async fn wait(&self, ctx: &CallContext, max_wait_ms: u64, denied: Option<Denial>) -> Result<Grant, GatewayError> {
        let model = &ctx.model;
        // Held while the call waits: one tenant cannot fill the queue for the others.
        let _waiting = ctx.caller.caps.wait()?;
        ctx.counters.queued.fetch_add(1, Ordering::Relaxed);
        ctx.class_counters.queued.fetch_add(1, Ordering::Relaxed);
        let waited = Instant::now();
        let line = (ctx.caller.index, ctx.need.clone());
        let mut ticket = match model.queue.enqueue(&self.limiter, &model.pool, line, denied) {
            Ok(ticket) => ticket,
            Err(_) => return Err(self.refuse(ctx, queue_denial(ctx, None)).await),
        };
        let outcome = tokio::time::timeout(Duration::from_millis(max_wait_ms), &mut ticket.grant).await;
        model.metrics.queue_wait.observe(waited.elapsed());
        ctx.class_counters.queue_wait.observe(waited.elapsed());
        if let Some(trace) = &ctx.trace {
            trace.queued(waited.elapsed());
        }
        match outcome {
            Ok(Ok(Ok(grant))) => Ok(grant),
            Ok(Ok(Err(Refusal::Denied(denial)))) => Err(self.refuse(ctx, denial).await),
            Ok(Ok(Err(Refusal::Backend(e)))) => Err(backend_error(e)),
            Ok(Ok(Err(Refusal::Failing { retry_after_ms }))) => Err(failing(retry_after_ms)),
            Ok(Ok(Err(Refusal::QueueFull))) | Ok(Err(_)) => Err(queue_failed()),
            // No denial seen while waiting: only open breakers stood in the way.
            Err(_) if ticket.last_denial().is_none() && model.queue.last_denial().is_none() => {
                Err(failing(PUMP_SLEEP_MAX_MS))
            }
            Err(_) => Err(self.refuse(ctx, queue_denial(ctx, ticket.last_denial())).await),
        }
    }

    /// Whether `denial` names a daily token budget of the caller (its
    /// tenant's, or its key's own).
    fn is_budget(&self, ctx: &CallContext, denial: &Denial) -> bool {
        let Some(keys) = ctx.caller.keys.as_ref() else {
            return false;
        };
        let denied = denial_key(denial);
        keys.budgets().any(|k| denied == Some(k.as_str()))
    }

    /// The answer to a denial: 400 when the call can never fit, else a 429.
    async fn refuse(&self, ctx: &CallContext, denial: Denial) -> GatewayError {
        if let Some(trace) = &ctx.trace {
            let cap_ms = ctx.model.pool.cooldown_left_ms(&denial).unwrap_or(u64::MAX);
            let hint = (!denial.is_permanent()).then(|| denial.retry_after_ms().min(cap_ms).max(1));
            trace.denied(denial_key(&denial).unwrap_or(""), hint);
        }
        if let Some(refused) = budget_denied(self.backend.as_ref(), &denial, ctx).await {
            ctx.counters.denied.fetch_add(1, Ordering::Relaxed);
            return refused;
        }
        if denial.is_permanent() {
            return never_fits(&ctx.call, &denial);
        }
        ctx.counters.denied.fetch_add(1, Ordering::Relaxed);
        // During this server's cooldown of a deployment, the provider's own time is the hint.
        let cap_ms = ctx.model.pool.cooldown_left_ms(&denial);
        self.rate_limited(&denial, self.is_budget(ctx, &denial), cap_ms).await
    }

    /// Anthropic's token counting is free at the provider and limited apart by
    /// it, so no model limit is reserved; the call is counted on its tenant's
    /// `rpm` and its key's own, so a tenant cannot flood the upstream through it.
    pub async fn count_tokens(&self, caller: &Caller) -> Result<(), GatewayError> {
        let Some(keys) = caller.keys.as_ref() else {
            return Ok(());
        };
        let own = keys.key.as_ref().and_then(|k| k.rpm.clone());
        let requirements: Vec<Requirement> = (keys.rpm.clone().into_iter().chain(own))
            .map(|key| Requirement { key, amount: 1 })
            .collect();
        if requirements.is_empty() {
            return Ok(());
        }
        let request = ReserveRequest::new(LeaseId::generate(), None, requirements)
            .map_err(|e| GatewayError::invalid(e.0))?
            .with_owner(Some(caller.lease_owner()));
        let lease_id = match reserve_guarded(&self.limiter, request, None).await {
            Ok(Reservation::Allowed(reserved)) => reserved.take(),
            Ok(Reservation::Denied(denial)) => return Err(self.rate_limited(&denial, false, None).await),
            Err(e) => return Err(backend_error(e)),
        };
        // The request stays counted for its minute; no slot is held during the call.
        let complete = CompleteRequest::new(lease_id, None, Vec::new()).map_err(|e| GatewayError::invalid(e.0))?;
        if let Err(e) = self.limiter.complete(&complete).await {
            tracing::warn!(%lease_id, error = %e, "gateway: complete failed; the hold ends by its window");
        }
        Ok(())
    }

    /// A 429 with the retry hints both SDKs read and the binding limit's figures.
    async fn rate_limited(&self, denial: &Denial, budget: bool, cap_ms: Option<u64>) -> GatewayError {
        let retry_after_ms = denial.retry_after_ms().min(cap_ms.unwrap_or(u64::MAX)).max(1);
        let key = denial_key(denial).unwrap_or("");
        // A budget in money's report, read once for its message and its figures.
        let money = if is_budget_key(key) {
            budget_report(self.backend.as_ref(), key).await
        } else {
            None
        };
        let message = if budget {
            let whose = if key.starts_with(KEY_LIMIT_PREFIX) {
                "key"
            } else {
                "tenant"
            };
            format!("The {whose}'s daily token budget ({key}) is spent; it frees as the day's calls age out.")
        } else if money.as_ref().is_some_and(|report| report.owing) {
            format!(
                "The budget {key} is spent: calls were billed more than it could hold, so it admits no \
                 call until their window has passed. Please try again in {retry_after_ms}ms."
            )
        } else if is_budget_key(key) {
            format!(
                "The budget {key} has no room for this call's worst case now; calls in flight free \
                 what they did not spend as they complete. Please try again in {retry_after_ms}ms."
            )
        } else {
            format!("Rate limit reached on {key}. Please try again in {retry_after_ms}ms.")
        };
        let mut error = GatewayError::new(ErrorKind::RateLimited { budget }, message)
            .with_header("retry-after-ms", retry_after_ms.to_string())
            .with_header("retry-after", retry_after_ms.div_ceil(1000).to_string());
        if budget {
            error = error.with_header("x-should-retry", "false".to_owned());
        }
        if is_budget_key(key) {
            // A budget in money: its figures in USD.
            return refusal_headers(money.as_ref(), error);
        }
        let dimension = match key.rsplit(':').next().unwrap_or("") {
            "rpm" => "requests",
            "input_tpm" => "input-tokens",
            "output_tpm" => "output-tokens",
            "concurrency" => "concurrency",
            _ => "tokens",
        };
        let Ok(key) = LimitKey::new(key) else {
            return error;
        };
        if let Ok(Some(report)) = self.backend.limit_report(&key).await {
            let capacity = report.state.definition().capacity();
            error = error
                .with_header(format!("x-ratelimit-limit-{dimension}"), capacity.to_string())
                .with_header(
                    format!("x-ratelimit-remaining-{dimension}"),
                    capacity.saturating_sub(report.in_use).to_string(),
                )
                .with_header(format!("x-ratelimit-reset-{dimension}"), format!("{retry_after_ms}ms"));
        }
        error
    }
}

/// The 400 of a call that can never be admitted.
fn never_fits(call: &Call, denial: &Denial) -> GatewayError {
    GatewayError::invalid(format!(
        "This request can never be admitted: it needs {} input and {} output tokens, more than the whole \
         capacity of the limit {}. Shorten the prompt or lower the output bound (max_tokens). A file, an \
         image of unknown size or stored context is counted at the model's file_tokens, image_tokens or \
         stored_context_tokens: the gateway's operator can set them to what calls send.",
        call.input_tokens,
        call.output_tokens,
        denial_key(denial).unwrap_or("?")
    ))
}

fn queue_failed() -> GatewayError {
    GatewayError::new(ErrorKind::Internal, "The queue failed.")
}

/// The answer when every deployment left is failing (its breaker open) or was
/// tried: a 502 the SDKs retry, with the time to the first half-open.
fn failing(retry_after_ms: u64) -> GatewayError {
    let mut error = GatewayError::new(
        ErrorKind::BadGateway,
        "Every deployment of this model is failing or was tried for this call.",
    );
    if retry_after_ms > 0 {
        error = error
            .with_header("retry-after-ms", retry_after_ms.to_string())
            .with_header("retry-after", retry_after_ms.div_ceil(1000).to_string());
    }
    error
}

/// The denial a call that waited in vain is answered with: its own last denial
/// (the key that denied *this* call, with its hint); else, never tried, the last
/// one the model's queue saw on a shared key, unless it names another tenant's
/// limit (see [`own_denial`]).
fn queue_denial(ctx: &CallContext, own: Option<Denial>) -> Denial {
    if let Some(denial) = own {
        return denial;
    }
    let keys = ctx.model.pool.deployments[0].keys();
    let fallback = (keys.rpm.clone())
        .or(keys.concurrency.clone())
        .or(keys.tpm.clone())
        .or(keys.input_tpm.clone())
        .unwrap_or_else(|| LimitKey::new("queue").expect("valid"));
    own_denial(
        ctx.model.queue.last_denial(),
        ctx.caller.key_prefix().as_deref(),
        fallback,
    )
}

/// `last` when it names the model or the caller's own tenant (keys under
/// `own_prefix`); else a denial on the model's `fallback` key with `last`'s hint:
/// another tenant's limit, figures and usage are that tenant's business.
fn own_denial(last: Option<Denial>, own_prefix: Option<&str>, fallback: LimitKey) -> Denial {
    let own = |denial: &Denial| {
        let key = denial_key(denial).unwrap_or("");
        !is_own_key(key) || own_prefix.is_some_and(|p| key.starts_with(p))
    };
    match last {
        Some(denial) if own(&denial) => denial,
        last => Denial::InsufficientCapacity {
            key: fallback,
            retry_after_ms: last.map_or(PUMP_SLEEP_MAX_MS, |d| d.retry_after_ms()),
        },
    }
}

/// The answer when the backend failed a reserve: nothing was sent. A tenant
/// holding its whole share of the lease table (or a table full of leases in
/// force) is a 429 that says so, with the backend's hint.
pub fn backend_error(error: ratelimiter::LimiterError) -> GatewayError {
    if let LimiterError::TooManyLeases {
        retry_after_ms,
        message,
    } = &error
    {
        let retry_after_ms = (*retry_after_ms).max(1);
        return GatewayError::new(
            ErrorKind::RateLimited { budget: false },
            format!("Too many calls in flight: {message}."),
        )
        .with_header("retry-after-ms", retry_after_ms.to_string())
        .with_header("retry-after", retry_after_ms.div_ceil(1000).to_string());
    }
    tracing::error!(error = %error, "gateway: the backend failed a reserve");
    GatewayError::new(
        ErrorKind::Internal,
        "The rate limiter's backend failed; nothing was sent upstream.",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn denied(key: &str) -> Denial {
        Denial::InsufficientCapacity {
            key: LimitKey::new(key).unwrap(),
            retry_after_ms: 700,
        }
    }

    #[test]
    fn a_denial_naming_another_tenant_is_never_shown() {
        let model = LimitKey::new("global:llm:openai:gpt-4o-mini:rpm").unwrap();
        let other = denied("tenant:beta:llm:rpm");
        let shown = own_denial(Some(other.clone()), Some("tenant:acme:"), model.clone());
        assert_eq!(denial_key(&shown), Some(model.as_str()));
        assert_eq!(shown.retry_after_ms(), 700, "the hint is kept");
        // A tenant whose name starts like another's is still another.
        let shown = own_denial(
            Some(denied("tenant:acme2:llm:rpm")),
            Some("tenant:acme:"),
            model.clone(),
        );
        assert_eq!(denial_key(&shown), Some(model.as_str()));
        let own = denied("tenant:acme:llm:rpm");
        assert_eq!(own_denial(Some(own.clone()), Some("tenant:acme:"), model.clone()), own);
        assert_eq!(
            denial_key(&own_denial(Some(other), None, model.clone())),
            Some(model.as_str())
        );
        let on_model = denied("global:llm:openai:gpt-4o-mini:concurrency");
        assert_eq!(own_denial(Some(on_model.clone()), None, model.clone()), on_model);
    }
}
