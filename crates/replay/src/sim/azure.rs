//! Azure OpenAI's per-deployment paths
//! (<https://learn.microsoft.com/en-us/azure/ai-foundry/openai/reference>):
//! `POST /openai/deployments/{deployment}/chat/completions` and `/embeddings`,
//! and `POST /openai/responses`, each with the `api-version` query parameter,
//! which Azure requires (a call without one is its 404 "Resource not found"),
//! and the key in the `api-key` header (or a bearer token). The body is
//! OpenAI's; the deployment named in the path is the model that serves it, so
//! the simulator serves these as its OpenAI endpoints with the deployment as
//! the model.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Json;

use crate::sim::openai;
use crate::sim::server::ProviderServer;

/// `POST /openai/deployments/{deployment}/chat/completions?api-version=...`.
pub async fn chat_completions(
    state: State<Arc<ProviderServer>>,
    Path(deployment): Path<String>,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    match as_openai(&uri, headers, body, Some(&deployment)) {
        Ok((headers, body)) => openai::chat_completions(state, headers, body).await,
        Err(response) => *response,
    }
}

/// `POST /openai/deployments/{deployment}/embeddings?api-version=...`.
pub async fn embeddings(
    state: State<Arc<ProviderServer>>,
    Path(deployment): Path<String>,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    match as_openai(&uri, headers, body, Some(&deployment)) {
        Ok((headers, body)) => openai::embeddings(state, headers, body).await,
        Err(response) => *response,
    }
}

/// `POST /openai/responses?api-version=...`: the body's `model` is the deployment.
pub async fn responses(state: State<Arc<ProviderServer>>, uri: Uri, headers: HeaderMap, body: Bytes) -> Response {
    match as_openai(&uri, headers, body, None) {
        Ok((headers, body)) => openai::responses(state, headers, body).await,
        Err(response) => *response,
    }
}

/// The call as the OpenAI endpoint takes it: the `api-key` as a bearer token,
/// the body's `model` the path's deployment (when the path names one). A call
/// without `api-version` is Azure's 404.
fn as_openai(
    uri: &Uri,
    mut headers: HeaderMap,
    body: Bytes,
    deployment: Option<&str>,
) -> Result<(HeaderMap, Bytes), Box<Response>> {
    let version = (uri.query().unwrap_or_default().split('&'))
        .find_map(|pair| pair.strip_prefix("api-version="))
        .filter(|v| !v.is_empty());
    if version.is_none() {
        let error = serde_json::json!({"error": {"code": "404", "message": "Resource not found"}});
        return Err(Box::new((StatusCode::NOT_FOUND, Json(error)).into_response()));
    }
    if let Some(key) = headers.get("api-key").and_then(|v| v.to_str().ok()) {
        let bearer = HeaderValue::from_str(&format!("Bearer {key}"))
            .map_err(|_| Box::new(StatusCode::UNAUTHORIZED.into_response()))?;
        headers.insert("authorization", bearer);
    }
    let Some(deployment) = deployment else {
        return Ok((headers, body));
    };
    let mut object = match serde_json::from_slice::<serde_json::Map<String, serde_json::Value>>(&body) {
        Ok(object) => object,
        // The OpenAI endpoint answers a bad body in its own words.
        Err(_) => return Ok((headers, body)),
    };
    object.insert("model".to_owned(), deployment.into());
    let body = serde_json::to_vec(&object).expect("a map serializes");
    Ok((headers, Bytes::from(body)))
}
