//! The gateway's own credentials on each upstream (docs/gateway.md,
//! "Upstreams"), applied to each request just before it is sent: a static key
//! header, or credentials that are renewed while the gateway runs (Vertex AI's
//! OAuth token) and may depend on the request itself (a signature).
//!
//! Secrets are marked sensitive in the headers and never logged nor written in
//! an error.

pub mod aws;
pub mod sts;
pub mod vertex;

use std::sync::Arc;

use axum::http::{HeaderName, HeaderValue, Request};
use bytes::Bytes;

pub use aws::AwsSigner;
pub use vertex::VertexTokenSource;

/// Why credentials could not be applied to a request: nothing was sent. The
/// message names what failed, never a secret.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{0}")]
pub struct CredentialsError(pub String);

/// How one upstream's requests are authenticated.
#[derive(Clone)]
pub enum Credentials {
    /// None: a local server without keys.
    None,
    /// A key in a header, the same on every request (`authorization: Bearer`,
    /// Anthropic's `x-api-key`, Azure's `api-key`).
    Header(HeaderName, HeaderValue),
    /// AWS Signature Version 4 over the whole request (Bedrock).
    Aws(Arc<AwsSigner>),
    /// Vertex AI's OAuth access token, `authorization: Bearer`, from a source
    /// that renews it before it expires.
    Vertex(Arc<dyn VertexTokenSource>),
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The kind only: never the secret.
        f.write_str(match self {
            Credentials::None => "None",
            Credentials::Header(..) => "Header",
            Credentials::Aws(_) => "Aws",
            Credentials::Vertex(_) => "Vertex",
        })
    }
}

impl Credentials {
    /// Authenticates `request`, final but for its credentials (a signature
    /// covers its method, URI, headers and body, so nothing may change after).
    pub async fn apply(&self, request: &mut Request<Bytes>) -> Result<(), CredentialsError> {
        match self {
            Credentials::None => Ok(()),
            Credentials::Header(name, value) => {
                request.headers_mut().insert(name.clone(), value.clone());
                Ok(())
            }
            Credentials::Aws(signer) => signer.sign(request).await,
            Credentials::Vertex(source) => {
                let mut value = source.header().await?;
                value.set_sensitive(true);
                request.headers_mut().insert(axum::http::header::AUTHORIZATION, value);
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fixed(Result<&'static str, &'static str>);

    #[async_trait::async_trait]
    impl VertexTokenSource for Fixed {
        async fn header(&self) -> Result<HeaderValue, CredentialsError> {
            self.0
                .map(HeaderValue::from_static)
                .map_err(|m| CredentialsError(m.to_owned()))
        }
    }

    #[tokio::test]
    async fn each_arm_sets_its_header_and_a_failing_source_sets_none() {
        let mut request = Request::new(Bytes::new());
        let key = HeaderValue::from_static("k");
        Credentials::Header(HeaderName::from_static("x-api-key"), key)
            .apply(&mut request)
            .await
            .unwrap();
        assert_eq!(request.headers()["x-api-key"], "k");
        let vertex = Credentials::Vertex(Arc::new(Fixed(Ok("Bearer t"))));
        vertex.apply(&mut request).await.unwrap();
        assert_eq!(request.headers()["authorization"], "Bearer t");
        assert!(request.headers()["authorization"].is_sensitive());
        let mut fresh = Request::new(Bytes::new());
        let failing = Credentials::Vertex(Arc::new(Fixed(Err("no token"))));
        assert_eq!(failing.apply(&mut fresh).await.unwrap_err().0, "no token");
        assert!(fresh.headers().is_empty());
        assert_eq!(format!("{failing:?}"), "Vertex");
    }
}
