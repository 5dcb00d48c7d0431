//! `POST /v1/conversations` forwarded (docs/gateway.md, "Stored responses"): OpenAI's
//! Conversations API creates the conversation a Responses call continues with its
//! `conversation` parameter
//! (<https://platform.openai.com/docs/api-reference/conversations/create>). The
//! gateway creates it with the upstream key of the first OpenAI model the caller may
//! use, counts it on the tenant's `rpm` as a token count is, and records the new
//! conversation's id for the calling tenant before answering, so that only that
//! tenant may continue it.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, Method};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use ratelimiter::handed_ids::StoredKind;
use serde_json::Value;

use super::body::{read_body, read_upstream_body};
use super::forward::{answer, credentials_refused, upstream_error};
use super::gateway::Gateway;
use crate::config::UpstreamKind;
use crate::wire::call::parse_object;
use crate::wire::error::{ErrorKind, Format, GatewayError, Shaped};

/// The path, the same upstream as here.
pub const CONVERSATIONS_PATH: &str = "/v1/conversations";

/// `POST /v1/conversations`.
pub async fn create_conversation(State(gateway): State<Arc<Gateway>>, headers: HeaderMap, body: Body) -> Response {
    match create(&gateway, &headers, body).await {
        Ok(response) => response,
        Err(error) => Shaped(Format::OpenAi, error).into_response(),
    }
}

async fn create(gateway: &Gateway, headers: &HeaderMap, body: Body) -> Result<Response, GatewayError> {
    let authorized = gateway.authenticate(headers).await?;
    let _held = authorized.caller.caps.open()?;
    let bytes = read_body(headers, body, gateway.body_bytes_max, gateway.body_timeout).await?;
    parse_object(&bytes)?;
    // A conversation belongs to the upstream's project: the first OpenAI model
    // the caller may use names it.
    let model = (gateway.model_names.iter())
        .filter(|name| authorized.allows_model(name))
        .map(|name| &gateway.models[name])
        .find(|model| model.kind == UpstreamKind::Openai)
        .ok_or_else(|| {
            GatewayError::new(
                ErrorKind::RouteNotFound,
                format!("Invalid URL (POST {CONVERSATIONS_PATH}): no OpenAI model is served to this caller."),
            )
        })?;
    let upstream = &gateway.upstreams[model.pool.deployments[0].upstream];
    gateway.admission.count_tokens(&authorized.caller).await?;
    let response = (gateway.client)
        .send(upstream, Method::POST, CONVERSATIONS_PATH, headers, bytes)
        .await
        .map_err(upstream_error)?;
    let (parts, body) = response.into_parts();
    if let Some(error) = credentials_refused(upstream, parts.status) {
        return Err(error);
    }
    let body: Bytes = read_upstream_body(body, gateway.client.timeout()).await?;
    if parts.status.is_success() {
        let created = serde_json::from_slice::<Value>(&body).ok();
        if let Some(id) = created.as_ref().and_then(|c| c.get("id")).and_then(Value::as_str) {
            (gateway.response_ids)
                .record(&authorized.caller.owner, StoredKind::Conversation, id)
                .await;
        }
    }
    Ok(answer(parts.status, parts.headers, Body::from(body)))
}
