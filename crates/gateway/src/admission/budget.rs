//! A call's budgets in money at admission (docs/gateway.md, "Budgets and
//! spend"): refused before any reservation when a budget is $0 or the call
//! cannot be priced, refused as never admissible (a 400) when its worst case
//! is above a whole budget, refused for good (`x-should-retry: false`) until
//! the period ends when the period's spend leaves too little, and the binding
//! budget's remaining dollars in every answer.

use ratelimiter::{Backend, Denial, LimitKey, LimitReport};

use super::context::CallContext;
use crate::limits::budgets::dollars;
use crate::limits::{call_budgets, denial_key, is_budget_key, ModelKeys, TenantKeys};
use crate::wire::call::Endpoint;
use crate::wire::error::{ErrorKind, GatewayError};

/// The header that gives, in USD with six decimals, what is left of the call's
/// binding budget (the one with the least left) after its reservation.
pub const REMAINING_USD_HEADER: &str = "x-ratelimit-remaining-usd";
/// The header that gives, in USD, the capacity of the budget a refusal names.
pub const LIMIT_USD_HEADER: &str = "x-ratelimit-limit-usd";

/// The refusal of a call no reservation can admit: a $0 budget of the call (a
/// 429 that is never retried, naming the budget), or a deployment of its model
/// without a price while the call has budgets (a budget of the directory on a
/// model the configuration left unpriced): a budget never counts a call as free.
pub fn budget_refusal(ctx: &CallContext) -> Option<GatewayError> {
    let tenant = ctx.caller.keys.as_deref();
    let deployments = &ctx.model.pool.deployments;
    let first = &deployments[0].keys();
    if let Some(zero) = call_budgets(first, tenant).find(|b| b.is_zero()) {
        if let Some(trace) = &ctx.trace {
            trace.denied(zero.key.as_str(), None);
        }
        let message = format!(
            "The budget {} is $0: it refuses every call. Raise it to call {}.",
            zero.key, ctx.model.name
        );
        return Some(never_retried(message));
    }
    // A call without budgets needs no price.
    call_budgets(first, tenant).next()?;
    let unpriced = deployments.iter().find(|d| d.keys().price.is_none())?;
    tracing::error!(model = %ctx.model.name, deployment = %unpriced.config.name,
        "gateway: a call with budgets in money to a model without a price; give the model a price");
    Some(GatewayError::new(
        ErrorKind::Internal,
        format!(
            "The model {} (deployment {}/{}) has no price, so the caller's budget cannot count this call; \
             the gateway's operator has to give it a price.",
            ctx.model.name, unpriced.config.upstream, unpriced.config.name
        ),
    ))
}

/// The answer to a permanent denial on a budget in money, with the budget's
/// headers; `None` for a denial on another key. A call whose worst case is
/// above the whole budget can never be admitted, whatever the period: a 400,
/// as a call above a token limit's whole capacity is, naming the budget and
/// the output bound to lower. Otherwise the period's settled spend leaves too
/// little: a 429 that is never retried, until the budget's next period.
pub async fn budget_denied(backend: &dyn Backend, denial: &Denial, ctx: &CallContext) -> Option<GatewayError> {
    let key = denial_key(denial).filter(|k| denial.is_permanent() && is_budget_key(k))?;
    let report = budget_report(backend, key).await;
    let capacity = report.as_ref().map(|r| r.state.definition().capacity());
    let error = match (least_worst_case(ctx), capacity) {
        (Some(least), Some(capacity)) if least > capacity => above_whole_budget(key, ctx, least, capacity),
        _ => {
            let now_unix_ms = ctx.model.pool.now_unix_ms();
            let resets = (report.as_ref().and_then(|r| r.state.definition().period()))
                .map(|period| ratelimiter::spend::UtcDay::of_unix_ms(period.end_unix_ms(now_unix_ms)));
            let owing = report.as_ref().is_some_and(|r| r.owing);
            spent(key, worst_case_of(ctx), owing, resets)
        }
    };
    Some(refusal_headers(report.as_ref(), error))
}

/// The 400 of a call whose least worst case (`least`, on the cheapest
/// deployment) is above the whole budget `key` of `capacity` micro-dollars.
fn above_whole_budget(key: &str, ctx: &CallContext, least: u64, capacity: u64) -> GatewayError {
    let field = match ctx.endpoint {
        Endpoint::ChatCompletions => "max_completion_tokens or max_tokens",
        Endpoint::Responses => "max_output_tokens",
        _ => "max_tokens",
    };
    let message = format!(
        "This request can never be admitted: its worst case (${}) is more than the whole budget {key} (${}). \
         Lower the output bound ({field}; {} tokens now, the model's default when the request names none) \
         or shorten the prompt.",
        dollars(least),
        dollars(capacity),
        ctx.call.output_tokens
    );
    GatewayError::invalid(message).with_header("x-should-retry", "false".to_owned())
}

/// The 429 of a budget whose period's settled spend leaves too little for the
/// call's worst case (`worst`, when known) before the period ends, or that
/// `owing` a bill above what it held, refuses every call until then; the day
/// it `resets` on (at 00:00 UTC), when known.
fn spent(key: &str, worst: Option<u64>, owing: bool, resets: Option<ratelimiter::spend::UtcDay>) -> GatewayError {
    let resets = resets.map_or_else(String::new, |day| format!(" It resets at {day}T00:00:00Z."));
    if owing {
        return never_retried(format!(
            "The budget {key} is spent: calls were billed more than it could hold, so it admits no call \
             before its period ends.{resets}"
        ));
    }
    let worst = worst.map_or_else(String::new, |w| format!(" (at most ${})", dollars(w)));
    never_retried(format!(
        "The budget {key} cannot hold this call's worst case{worst} before its period ends: it is spent. \
         Lower the output bound (max_tokens) or wait for the budget's next period.{resets}"
    ))
}

/// A 429 the SDKs do not retry: no wait can admit the call.
fn never_retried(message: String) -> GatewayError {
    GatewayError::new(ErrorKind::RateLimited { budget: true }, message)
        .with_header("x-should-retry", "false".to_owned())
}

/// What is left, in micro-dollars, of the budget with the least left among
/// those a call of `model` by `tenant` is charged on (capacity less what is
/// held, nothing while it owes: what admission would grant,
/// [`ratelimiter::LimitReport::available`]); `None` when the call has no budget
/// or none can be read.
pub async fn remaining_micro_usd(backend: &dyn Backend, model: &ModelKeys, tenant: Option<&TenantKeys>) -> Option<u64> {
    let mut least: Option<u64> = None;
    for budget in call_budgets(model, tenant).filter(|b| !b.is_zero()) {
        let Ok(Some(left)) = backend.limit_available(&budget.key).await else {
            continue;
        };
        least = Some(least.map_or(left, |l| l.min(left)));
    }
    least
}

/// Whether a call of `model` by `tenant` is charged on any budget in money:
/// without one there is nothing for [`remaining_micro_usd`] to read.
pub fn has_money_budget(model: &ModelKeys, tenant: Option<&TenantKeys>) -> bool {
    call_budgets(model, tenant).any(|b| !b.is_zero())
}

/// The report of the budget `key`, read once for a refusal's message and
/// headers; `None` when it cannot be read.
pub async fn budget_report(backend: &dyn Backend, key: &str) -> Option<LimitReport> {
    let key = LimitKey::new(key).ok()?;
    backend.limit_report(&key).await.ok().flatten()
}

/// The budget headers of a refusal on a budget in money of `report`: its
/// capacity and what is left of it, in USD; none when it could not be read.
pub fn refusal_headers(report: Option<&LimitReport>, mut error: GatewayError) -> GatewayError {
    if let Some(report) = report {
        let capacity = report.state.definition().capacity();
        error = error
            .with_header(LIMIT_USD_HEADER, dollars(capacity))
            .with_header(REMAINING_USD_HEADER, dollars(report.available()));
    }
    error
}

/// The worst case the call reserves on its budgets, for a refusal's message:
/// only for a model of one deployment (a pool's deployments may price apart).
pub fn worst_case_of(ctx: &CallContext) -> Option<u64> {
    let [deployment] = ctx.model.pool.deployments.as_slice() else {
        return None;
    };
    worst_case_on(ctx, &deployment.keys())
}

/// The least worst case of the call over its model's deployments: above a
/// whole budget, no deployment can ever admit it.
fn least_worst_case(ctx: &CallContext) -> Option<u64> {
    (ctx.model.pool.deployments.iter())
        .filter_map(|deployment| worst_case_on(ctx, &deployment.keys()))
        .min()
}

/// The worst case of the call at the price of the deployment of `keys`.
fn worst_case_on(ctx: &CallContext, keys: &ModelKeys) -> Option<u64> {
    let input = crate::limits::prompt_charge(keys, ctx.need.input_tokens, ctx.need.prompt_characters);
    crate::limits::budgets::worst_case(keys.price.as_ref(), (input, ctx.need.output_tokens))
}
