//! The simulated provider's routes on loopback: the OpenAI and Anthropic
//! endpoints, Azure's and Vertex AI's paths (docs/provider-sim.md) and the simulator's control routes, served
//! over one listener.

use std::future::Future;
use std::sync::Arc;

use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};
use axum::serve::ListenerExt;
use axum::Router;
use tokio::net::TcpListener;

use crate::sim::server::ProviderServer;
use crate::sim::{anthropic, azure, bedrock, control_routes, openai, sts_routes, vertex};

/// The largest request body, in bytes: two million prompt tokens of four bytes.
pub const BODY_BYTES_MAX: usize = 8 * 1024 * 1024;

impl ProviderServer {
    /// The routes: the OpenAI and Anthropic endpoints (docs/provider-sim.md) and the
    /// simulator's control routes.
    pub fn router(self: &Arc<Self>) -> Router {
        Router::new()
            .route("/v1/chat/completions", post(openai::chat_completions))
            .route("/v1/embeddings", post(openai::embeddings))
            .route("/v1/responses", post(openai::responses))
            .route("/v1/conversations", post(openai::create_conversation))
            .route("/v1/models", get(openai::models))
            .route("/v1/messages", post(anthropic::messages))
            .route("/v1/messages/count_tokens", post(anthropic::count_tokens))
            .route(
                "/openai/deployments/{deployment}/chat/completions",
                post(azure::chat_completions),
            )
            .route("/openai/deployments/{deployment}/embeddings", post(azure::embeddings))
            .route("/openai/responses", post(azure::responses))
            .route("/model/{model}/invoke", post(bedrock::invoke::<false>))
            .route(
                "/model/{model}/invoke-with-response-stream",
                post(bedrock::invoke::<true>),
            )
            .route("/openai/v1/chat/completions", post(bedrock::chat_completions))
            .route("/", post(sts_routes::assume_role_with_web_identity))
            .route("/token", post(vertex::token))
            .route(
                "/v1/projects/{project}/locations/{region}/publishers/anthropic/models/{model_action}",
                post(vertex::claude),
            )
            .route(
                "/v1/projects/{project}/locations/{region}/endpoints/openapi/chat/completions",
                post(vertex::openapi_chat),
            )
            .route(
                "/sim/stats",
                get(control_routes::stats).delete(control_routes::reset_stats),
            )
            .route(
                "/sim/billing",
                get(control_routes::billing).delete(control_routes::reset_billing),
            )
            .route(
                "/sim/faults",
                post(control_routes::arm_fault).delete(control_routes::disarm_fault),
            )
            .layer(DefaultBodyLimit::max(BODY_BYTES_MAX))
            .with_state(Arc::clone(self))
    }

    /// Serves on `listener` until `shutdown` resolves.
    pub async fn serve(
        self: Arc<Self>,
        listener: TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        // Each event of a stream leaves when it is written, as a provider's does:
        // without TCP_NODELAY, Nagle's algorithm holds a token's event until the
        // client acknowledges the previous one (up to its delayed-ACK time, 40 ms).
        let listener = listener.tap_io(|tcp| {
            let _ = tcp.set_nodelay(true);
        });
        axum::serve(listener, self.router())
            .with_graceful_shutdown(shutdown)
            .await
    }
}
