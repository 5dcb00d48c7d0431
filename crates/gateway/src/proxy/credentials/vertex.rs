//! Vertex AI's credentials: the OAuth access token of a service account
//! (<https://cloud.google.com/vertex-ai/docs/authentication>), sent as
//! `authorization: Bearer`, from a source that keeps it fresh.

use axum::http::HeaderValue;

use super::CredentialsError;

/// A source of Vertex AI's `authorization` header, renewing its token before
/// it expires: a call reads the current header, waiting only when no valid
/// token is held.
#[async_trait::async_trait]
pub trait VertexTokenSource: Send + Sync {
    /// The header value (`Bearer <token>`) for a request sent now.
    async fn header(&self) -> Result<HeaderValue, CredentialsError>;
}
