//! The proxy service (docs/gateway.md): authenticate, read and count, admit
//! (waiting in the model's fair queue when denied), forward, stream back,
//! reconcile; and the routes that answer without a call.

use std::sync::Arc;
use std::time::Instant;

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, Method};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use bytes::Bytes;

use super::body::{read_body, read_upstream_body};
use super::forward::{answer, credentials_refused, forward, upstream_error, Forwarded};
use super::gateway::Gateway;
use super::key_callers::Authorized;
use crate::admission::spend::CallSpend;
use crate::admission::tenant_caps::HoldingBody;
use crate::admission::{Caller, ModelEntry};
use crate::observe::trace::CallTrace;
use crate::wire::call::{model_name, parse_object, Endpoint};
use crate::wire::error::{ErrorKind, Format, GatewayError, Shaped};

/// The gateway's router: the provider endpoints, and 404 in the provider's shape
/// for everything else.
pub fn router(gateway: Arc<Gateway>) -> Router {
    let endpoint = |e: Endpoint| {
        move |State(g): State<Arc<Gateway>>, headers: HeaderMap, body: Body| async move { handle(g, e, headers, body).await }
    };
    Router::new()
        .route("/v1/chat/completions", post(endpoint(Endpoint::ChatCompletions)))
        .route("/v1/embeddings", post(endpoint(Endpoint::Embeddings)))
        .route("/v1/responses", post(endpoint(Endpoint::Responses)))
        .route("/v1/messages", post(endpoint(Endpoint::Messages)))
        .route("/v1/messages/count_tokens", post(endpoint(Endpoint::CountTokens)))
        .route("/v1/models", get(list_models))
        .route(
            super::conversations::CONVERSATIONS_PATH,
            post(super::conversations::create_conversation),
        )
        .fallback(not_found)
        .layer(super::origin::RequireOrigin(gateway.clone()))
        .with_state(gateway)
}

async fn not_found(method: Method, uri: axum::http::Uri, headers: HeaderMap) -> Response {
    let error = GatewayError::new(
        ErrorKind::RouteNotFound,
        format!("Invalid URL ({method} {})", uri.path()),
    );
    error.into_response(Format::of_headers(&headers))
}

/// The models the caller may use: every served one, or a directory key's scope.
async fn list_models(State(gateway): State<Arc<Gateway>>, headers: HeaderMap) -> Response {
    let format = Format::of_headers(&headers);
    let authorized = match gateway.authenticate(&headers).await {
        Ok(authorized) => authorized,
        Err(e) => return e.into_response(format),
    };
    let allowed = gateway.model_names.iter().filter(|name| authorized.allows_model(name));
    let entries = allowed.map(|name| {
        let model = &gateway.models[name];
        (name, model.pool.deployments[0].label.as_ref())
    });
    let body = format.models_list(entries);
    Json(body).into_response()
}

async fn handle(gateway: Arc<Gateway>, endpoint: Endpoint, headers: HeaderMap, body: Body) -> Response {
    // The call's SERVER span, only when the server exports traces (docs/observability.md).
    let trace = (gateway.telemetry.as_ref()).map(|telemetry| telemetry.start_call(&headers, endpoint));
    let response = answer_call(gateway, endpoint, headers, body, trace.clone()).await;
    if let Some(trace) = &trace {
        trace.responded(response.status());
    }
    response
}

/// The answer to a call: authenticated, held on its tenant's cap, served.
async fn answer_call(
    gateway: Arc<Gateway>,
    endpoint: Endpoint,
    headers: HeaderMap,
    body: Body,
    trace: Option<CallTrace>,
) -> Response {
    let opened = gateway.authenticate(&headers).await.and_then(|authorized| {
        let held = authorized.caller.caps.open()?;
        Ok((authorized, held))
    });
    let (authorized, held) = match opened {
        Ok(opened) => opened,
        Err(error) => return Shaped(endpoint.format(), error).into_response(),
    };
    let response = match serve(gateway, endpoint, (authorized, trace), headers, body).await {
        Ok(response) => response,
        Err(error) => Shaped(endpoint.format(), error).into_response(),
    };
    // The call stays open, on its tenant's cap, until its answer's last byte.
    response.map(|body| HoldingBody::wrap(body, held))
}

async fn serve(
    gateway: Arc<Gateway>,
    endpoint: Endpoint,
    (authorized, trace): (Authorized, Option<CallTrace>),
    headers: HeaderMap,
    body: Body,
) -> Result<Response, GatewayError> {
    let started = Instant::now();
    let caller = authorized.caller.clone();
    let class = gateway.admission.classes().of_request(caller.class, &headers)?;
    let bytes = read_body(&headers, body, gateway.body_bytes_max, gateway.body_timeout).await?;
    let object = parse_object(&bytes)?;
    let name = model_name(&object)?;
    let model = gateway.model_for(endpoint, name)?.clone();
    if !authorized.allows_model(name) {
        // Before anything is reserved or sent.
        return Err(GatewayError::new(
            ErrorKind::PermissionDenied,
            format!(
                "This API key may not use the model `{}`.",
                crate::wire::error::echoed(name)
            ),
        ));
    }
    gateway.response_ids.check(endpoint, &caller.owner, &object).await?;
    if endpoint == Endpoint::CountTokens {
        // Sent to a pool's first deployment.
        return Box::pin(count_tokens(&gateway, &model, &caller, &headers, bytes)).await;
    }
    let call = endpoint.read_call(object, &model.counter, bytes)?;
    let mut ctx = gateway
        .admission
        .context((caller, class), model, (endpoint, call), started);
    ctx.key_call = authorized.key.as_ref().map(|k| gateway.key_call(&k.key.id));
    let key = authorized.key.as_ref().map(|k| k.key.id.as_str());
    if let Some(trace) = &trace {
        let class = gateway.admission.classes().name(ctx.class);
        trace.caller((&ctx.caller.name, key), class, &ctx.model.name);
    }
    ctx.trace = trace;
    ctx.spend = gateway.spend.as_ref().map(|sink| CallSpend::new(sink, key));
    // Each deployment of the pool is tried at most once (docs/gateway.md, "Pools").
    loop {
        let lease = gateway.admission.admit(&mut ctx).await?;
        // Boxed: a try's state is most of a call's future (some 6 KB), which
        // every layer above would otherwise hold, and copy whole as it moves.
        let forwarded = Box::pin(forward(&gateway, &ctx, &headers, lease));
        if let Forwarded::Answer(response) = forwarded.await? {
            return Ok(response);
        }
    }
}

/// Anthropic's token counting, sent to the pool's first deployment: counted on
/// its tenant's `rpm` only ([`crate::admission::Admission::count_tokens`]).
async fn count_tokens(
    gateway: &Gateway,
    model: &ModelEntry,
    caller: &Caller,
    headers: &HeaderMap,
    bytes: Bytes,
) -> Result<Response, GatewayError> {
    let deployment = &model.pool.deployments[0];
    let upstream = &gateway.upstreams[deployment.upstream];
    let name = &deployment.config.name;
    let path = (upstream.path_of(Endpoint::CountTokens.path(), name, false))
        .ok_or_else(|| GatewayError::model_not_found(&model.config.name))?;
    gateway.admission.count_tokens(caller).await?;
    let forwarded = upstream.forwarded_headers(headers);
    let body = deployment.body(&bytes, None, (upstream.envelope(name), &forwarded));
    let response = (gateway.client)
        .send(upstream, Method::POST, &path, headers, body)
        .await
        .map_err(upstream_error)?;
    let (parts, body) = response.into_parts();
    if let Some(error) = credentials_refused(upstream, parts.status) {
        return Err(error);
    }
    let body = read_upstream_body(body, gateway.client.timeout()).await?;
    Ok(answer(parts.status, parts.headers, Body::from(body)))
}
