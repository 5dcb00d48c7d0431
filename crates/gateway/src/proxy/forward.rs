//! One try of a call on a deployment of its pool (docs/gateway.md, "Pools"):
//! sent, its answer's status read, the provider's limit headers watched, and
//! either the answer passed back or the call failed over to the next deployment.

use std::sync::atomic::Ordering;
use std::time::Instant;

use axum::body::Body;
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::Response;

use super::answer;
use super::gateway::Gateway;
use super::response_ids::RememberResponseId;
use super::upstream::{response_headers, Upstream, UpstreamError};
use crate::admission::budget::{has_money_budget, remaining_micro_usd, REMAINING_USD_HEADER};
use crate::admission::{CallContext, CallLease, ModelEntry};
use crate::config::UpstreamKind;
use crate::limits::budgets::dollars;
use crate::observe::trace::{TraceHeaders, TryTarget};
use crate::routing::{pause, Deployment};
use crate::wire::call::Endpoint;
use crate::wire::error::{ErrorKind, GatewayError};
use crate::wire::{anthropic, openai};

/// What one try on a deployment came to.
pub enum Forwarded {
    /// The client's answer.
    Answer(Response),
    /// The deployment failed before any byte reached the client and another
    /// deployment of the pool is left: the call goes on there.
    FailedOver,
}

/// The name of the deployment that served a call, in its answer.
const DEPLOYMENT_HEADER: &str = "x-ratelimit-deployment";

/// Sends the call of `ctx` to its lease's deployment and answers the client; the
/// lease completes when the answer (or the stream) ends. A 429, a 5xx, the
/// gateway's credentials refused (401, 403), no connection or a timeout fails
/// over while another deployment is left (docs/gateway.md, "Pools").
pub async fn forward(
    gateway: &Gateway,
    ctx: &CallContext,
    headers: &HeaderMap,
    mut lease: CallLease,
) -> Result<Forwarded, GatewayError> {
    let model = &ctx.model;
    let deployment = &model.pool.deployments[lease.deployment()];
    let upstream = &gateway.upstreams[deployment.upstream];
    let last = ctx.is_last_try();
    let sent = Instant::now();
    // The bound reserved is the bound sent, in the field this deployment's upstream reads.
    let format = upstream.config.format_of(&deployment.config.name);
    let bound = (ctx.call.bound_to_send)
        .and_then(|bound| openai::bound_field(ctx.endpoint, format).map(|field| (field, bound)));
    let envelope = upstream.envelope(&deployment.config.name);
    let Some(path) = upstream.path_of(ctx.endpoint.path(), &deployment.config.name, ctx.call.stream) else {
        // Checked before admission (`Gateway::model_for`): nothing was sent.
        let error = GatewayError::model_not_found(&model.config.name);
        lease.refused(error.status());
        return try_next(lease, last).await.ok_or(error);
    };
    let forwarded = upstream.forwarded_headers(headers);
    let body = deployment.body(&ctx.call.upstream_body, bound, (envelope, &forwarded));
    let trace_headers = start_try_span(ctx, (upstream, deployment), bound.map(|(_, b)| b), &mut lease);
    let send = (gateway.client).send_with(upstream, (Method::POST, &path), headers, trace_headers, body);
    // What is left of the call's binding budget, read while the call is sent.
    let backend = gateway.admission.backend();
    let keys = deployment.keys();
    let tenant_keys = ctx.caller.keys.as_deref();
    let (result, remaining) = if has_money_budget(&keys, tenant_keys) {
        tokio::join!(send, remaining_micro_usd(backend.as_ref(), &keys, tenant_keys))
    } else {
        // Nothing to read beside the send: no second future polled with it.
        (send.await, None)
    };
    model.metrics.upstream_latency.observe(sent.elapsed());
    let failed = |error: GatewayError| error.with_header(DEPLOYMENT_HEADER, deployment.label.to_string());
    let response = match result {
        Ok(response) => response,
        Err(error) => {
            lease.trace_failed(error_type(&error));
            // Nothing reached the provider: no connection, or no credentials to send.
            let unreachable = matches!(error, UpstreamError::Unreachable(_) | UpstreamError::Credentials(_));
            let error = upstream_error(error);
            if unreachable {
                lease.refused(error.status());
            } else {
                lease.failed(error.status());
            }
            return try_next(lease, last).await.ok_or_else(|| failed(error));
        }
    };
    let (parts, body) = response.into_parts();
    observe_provider_limits(model, deployment, &parts.headers);
    lease.trace_answered(parts.status);
    if let Some(error) = credentials_refused(upstream, parts.status) {
        // Nothing was served: the provider refused the gateway's key for this
        // deployment, not the call; another deployment's key may hold.
        lease.refused(error.status());
        return try_next(lease, last).await.ok_or_else(|| failed(error));
    }
    if not_ready(upstream, &parts.headers) {
        lease.answered_unavailable(parts.status);
    } else {
        lease.answered(parts.status);
    }
    if parts.status == StatusCode::TOO_MANY_REQUESTS {
        let backend = gateway.admission.backend().clone();
        pause::start(backend, &deployment.keys(), &parts.headers, &deployment.state.cooldown);
    }
    if !last && (parts.status == StatusCode::TOO_MANY_REQUESTS || parts.status.is_server_error()) {
        lease.failed_over().await;
        return Ok(Forwarded::FailedOver);
    }
    let reframer = envelope.reframer();
    let stream = parts.status.is_success() && ctx.call.stream && reframer.is_stream(&parts.headers);
    let idle_timeout = gateway.client.timeout();
    // A stored response's id and its conversation are recorded for the tenant
    // they were handed to.
    let remember = (ctx.endpoint == Endpoint::Responses && parts.status.is_success()).then(|| RememberResponseId {
        ids: gateway.response_ids.clone(),
        tenant: ctx.caller.owner.clone(),
    });
    let answer_body = if stream {
        answer::events(
            (body, reframer),
            (ctx.endpoint, ctx.call.drop_usage_chunk),
            (lease, remember),
            idle_timeout,
        )
    } else {
        // Passed on as it arrives; only a success's usage is read, on the way.
        let scan = parts.status.is_success();
        let headers_usage = (upstream.config.kind == UpstreamKind::Bedrock)
            .then(|| anthropic::usage_of_bedrock_headers(&parts.headers))
            .flatten();
        answer::whole(
            (body, headers_usage),
            (ctx.endpoint, scan),
            (lease, remember),
            idle_timeout,
        )
        .await
    };
    let mut response = answer(parts.status, parts.headers, answer_body);
    if stream && envelope.reframer().changes_content_type() {
        let value = axum::http::HeaderValue::from_static("text/event-stream");
        response.headers_mut().insert(axum::http::header::CONTENT_TYPE, value);
    }
    if let Ok(value) = axum::http::HeaderValue::from_str(&deployment.label) {
        response
            .headers_mut()
            .insert(const { axum::http::HeaderName::from_static(DEPLOYMENT_HEADER) }, value);
    }
    if let Some(left) = remaining {
        let value = axum::http::HeaderValue::from_str(&dollars(left)).expect("digits and a dot");
        response.headers_mut().insert(
            const { axum::http::HeaderName::from_static(REMAINING_USD_HEADER) },
            value,
        );
    }
    Ok(Forwarded::Answer(response))
}

/// The CLIENT span of this try on `deployment` of `upstream`, when the call is
/// traced: handed to the lease, and its `traceparent` returned for the request.
fn start_try_span(
    ctx: &CallContext,
    (upstream, deployment): (&Upstream, &Deployment),
    max_tokens: Option<u64>,
    lease: &mut CallLease,
) -> Option<TraceHeaders> {
    let trace = ctx.trace.as_ref()?.start_try(TryTarget {
        endpoint: ctx.endpoint,
        kind: upstream.config.kind,
        upstream: &upstream.config.name,
        base_url: &upstream.config.base_url,
        model: &deployment.config.name,
        max_tokens,
        stream: ctx.call.stream,
        request: &ctx.call.upstream_body,
    });
    let headers = trace.trace_headers();
    lease.traced(trace);
    headers
}

/// A failed try's `error.type`: what went wrong on the connection.
fn error_type(error: &UpstreamError) -> &'static str {
    match error {
        UpstreamError::Timeout => "timeout",
        UpstreamError::Unreachable(_) => "unreachable",
        UpstreamError::Failed(_) => "connection_failed",
        UpstreamError::Credentials(_) => "credentials",
    }
}

/// Bedrock's error type of a model that cannot serve yet (a 429 that is no
/// throttle: the model is being loaded,
/// <https://docs.aws.amazon.com/bedrock/latest/APIReference/API_runtime_InvokeModel.html#API_runtime_InvokeModel_Errors>).
const MODEL_NOT_READY: &str = "ModelNotReadyException";

/// Whether `upstream` answered that its model is not ready (`x-amzn-ErrorType`
/// `ModelNotReadyException...`): its breaker counts it, as a 5xx.
fn not_ready(upstream: &Upstream, headers: &HeaderMap) -> bool {
    upstream.config.kind == UpstreamKind::Bedrock
        && (headers.get("x-amzn-errortype"))
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with(MODEL_NOT_READY))
}

/// A failed try: failed over when a deployment is left (`Some`), else `None`:
/// the client gets the failure.
async fn try_next(lease: CallLease, last: bool) -> Option<Forwarded> {
    if last {
        return None;
    }
    lease.failed_over().await;
    Some(Forwarded::FailedOver)
}

/// An upstream 401 or 403 is the provider refusing the gateway's own key (the
/// client's never reaches it): the client gets a 502 saying so, in its
/// provider's shape, and never the provider's body, which may quote the key.
pub fn credentials_refused(upstream: &Upstream, status: StatusCode) -> Option<GatewayError> {
    if status != StatusCode::UNAUTHORIZED && status != StatusCode::FORBIDDEN {
        return None;
    }
    tracing::error!(upstream = %upstream.config.name, status = status.as_u16(),
        "gateway: the upstream refused the gateway's credentials; check its api_key_env");
    Some(GatewayError::new(
        ErrorKind::BadGateway,
        format!(
            "The upstream provider refused the gateway's upstream credentials ({}); the call was not served. \
             The gateway's operator has to fix the upstream key.",
            status.as_u16()
        ),
    ))
}

/// Reads the provider's rate-limit headers (by the library's
/// `ratelimiter::provider_headers`) into the model's gauges, and warns once when the
/// configured limit is above the provider's.
fn observe_provider_limits(model: &ModelEntry, deployment: &Deployment, headers: &HeaderMap) {
    let read = pause::provider_headers(headers);
    let dimension = |name: &str| read.limits.iter().find(|l| l.dimension == name);
    let requests = dimension("rpm");
    let tokens = match model.kind {
        UpstreamKind::Anthropic => dimension("itpm"),
        _ => dimension("tpm"),
    };
    if let Some(value) = requests.and_then(|l| l.remaining) {
        model
            .metrics
            .provider_remaining_requests
            .store(value.saturating_add(1), Ordering::Relaxed);
    }
    if let Some(value) = tokens.and_then(|l| l.remaining) {
        model
            .metrics
            .provider_remaining_tokens
            .store(value.saturating_add(1), Ordering::Relaxed);
    }
    let (limit_requests, limit_tokens) = (requests.and_then(|l| l.limit), tokens.and_then(|l| l.limit));
    let config = &deployment.config;
    let configured_tokens = config.limits.published.tpm.or(config.limits.published.input_tpm);
    let above = if deployment.keys().profile.is_some() {
        // A profile's sub-windows are compared per minute by the library.
        let upstream = &config.upstream;
        !ratelimiter::provider_headers::below_configured(&read, upstream, &config.key_name(), &deployment.definitions)
            .is_empty()
    } else {
        matches!((config.limits.published.rpm, limit_requests), (Some(ours), Some(theirs)) if ours > theirs)
            || matches!((configured_tokens, limit_tokens), (Some(ours), Some(theirs)) if ours > theirs)
    };
    if above && !deployment.warned_above_provider.swap(true, Ordering::Relaxed) {
        tracing::warn!(model = %model.config.name, upstream = %config.upstream, ?limit_requests, ?limit_tokens,
            configured_rpm = ?config.limits.published.rpm, configured_tokens = ?configured_tokens,
            "gateway: the configured limit is above the provider's; expect provider 429s");
    }
}

/// The client's error for an upstream that failed.
pub fn upstream_error(error: UpstreamError) -> GatewayError {
    tracing::warn!(error = %error, "gateway: upstream call failed");
    match error {
        UpstreamError::Timeout => {
            GatewayError::new(ErrorKind::Timeout, "The upstream provider did not answer in time.")
        }
        UpstreamError::Unreachable(_) => {
            GatewayError::new(ErrorKind::BadGateway, "The upstream provider could not be reached.")
        }
        UpstreamError::Failed(_) => {
            GatewayError::new(ErrorKind::BadGateway, "The upstream provider's connection failed.")
        }
        UpstreamError::Credentials(_) => GatewayError::new(
            ErrorKind::BadGateway,
            "The gateway's credentials for the upstream provider could not be obtained; the call was not sent.",
        ),
    }
}

/// The client's answer: the upstream's status and headers (moved, not copied;
/// hop-by-hop ones removed) and `body`.
pub fn answer(status: StatusCode, upstream_headers: HeaderMap, body: Body) -> Response {
    let mut response = Response::new(body);
    *response.status_mut() = status;
    *response.headers_mut() = response_headers(upstream_headers);
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_bedrock_s_model_not_ready_counts_as_unavailable() {
        let upstream = |kind: &str| {
            let yaml =
                format!("{{name: u, kind: {kind}, region: us-east-1, base_url: \"http://x\", api_key_env: PATH}}");
            Upstream::new(serde_yaml::from_str(&yaml).unwrap()).unwrap()
        };
        let mut headers = HeaderMap::new();
        let not_ready_type = "ModelNotReadyException:http://internal.amazon.com/coral/com.amazon.bedrock/";
        headers.insert("x-amzn-errortype", not_ready_type.parse().unwrap());
        assert!(not_ready(&upstream("bedrock"), &headers));
        let mut throttled = HeaderMap::new();
        throttled.insert("x-amzn-errortype", "ThrottlingException".parse().unwrap());
        assert!(!not_ready(&upstream("bedrock"), &throttled));
        let anthropic = "{name: u, kind: anthropic, base_url: \"http://x\", api_key_env: PATH}";
        let anthropic = Upstream::new(serde_yaml::from_str(anthropic).unwrap()).unwrap();
        assert!(
            !not_ready(&anthropic, &headers),
            "another provider's header means nothing"
        );
    }
}
