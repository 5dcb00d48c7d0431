//! `POST /v1/echo`: answers the JSON body it was sent. It is the benchmark's
//! reference (the cost of HTTP and JSON alone), served only when
//! `server.echo_route` is true.

use axum::Json;

use crate::body::JsonBody;

/// Parses the body and answers it.
pub async fn echo(JsonBody(value): JsonBody<serde_json::Value>) -> Json<serde_json::Value> {
    Json(value)
}
