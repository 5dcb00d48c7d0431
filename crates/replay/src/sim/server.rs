//! The simulated provider's HTTP face on loopback: the provider, its [`Ledger`] and
//! its routes. The wire formats are [`crate::sim_openai`] and
//! [`crate::sim_anthropic`]; the control routes and what they share,
//! [`crate::sim_control`]. Every call is admitted by the ledger, answered 429 with
//! `retry-after` and rate-limit headers when refused, and takes a time that grows
//! with the output tokens.

use std::future::Future;
use std::sync::{Arc, Mutex};

use axum::extract::DefaultBodyLimit;
use axum::http::{HeaderMap, HeaderValue};
use axum::routing::{get, post};
use axum::serve::ListenerExt;
use axum::Router;
use ratelimiter::Clock;
use serde::{Deserialize, Serialize};
use tokio::net::TcpListener;

use crate::provider::{Admission, Ledger, LedgerCounts, ProviderLimits, Remaining, Ticket, TokenLimit};
use crate::sim_control::{self, SimControl};
use crate::sim_profile::SimProfile;
use crate::{sim_anthropic, sim_openai};

/// The largest request body, in bytes: two million prompt tokens of four bytes.
pub const BODY_BYTES_MAX: usize = 8 * 1024 * 1024;
/// The largest `max_tokens` accepted, as a provider bounds its output.
pub const MAX_TOKENS_MAX: u64 = 131_072;
/// `max_tokens` when the request sets none.
pub const MAX_TOKENS_DEFAULT: u64 = 4_096;
/// The most messages in one request.
pub const MESSAGES_MAX: usize = 1_024;

/// One chat message.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Message {
    /// `system`, `user` or `assistant`.
    pub role: String,
    /// The text.
    pub content: String,
}

/// The request body. Unknown fields are ignored, as OpenAI clients send many.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ChatRequest {
    /// The model asked for (echoed back).
    pub model: String,
    /// The conversation; its text is the prompt.
    pub messages: Vec<Message>,
    /// The output bound the client sends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u64>,
    /// How many tokens the simulated model writes (capped by `max_tokens`); the
    /// trace's output length. Without it the model writes `max_tokens`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sim_output_tokens: Option<u64>,
}

/// Token usage, as OpenAI reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// The provider's count of the prompt.
    pub prompt_tokens: u64,
    /// Tokens generated.
    pub completion_tokens: u64,
    /// Their sum.
    pub total_tokens: u64,
}

/// The provider with its ledger, shared by every connection.
#[derive(Debug)]
pub struct ProviderServer {
    pub(crate) ledger: Mutex<Ledger>,
    pub(crate) clock: Arc<dyn Clock>,
    /// The models, key, fault switch and call counts of the wire formats.
    pub(crate) control: Arc<SimControl>,
}

impl ProviderServer {
    /// A provider enforcing `limits`, reading time from `clock`.
    pub fn new(limits: ProviderLimits, clock: Arc<dyn Clock>) -> Arc<Self> {
        Self::with_control(limits, clock, SimControl::default())
    }

    /// A provider enforcing `limits` that serves the models of `control` (and
    /// requires its key).
    pub fn with_control(limits: ProviderLimits, clock: Arc<dyn Clock>, control: SimControl) -> Arc<Self> {
        Arc::new(Self {
            ledger: Mutex::new(Ledger::new(limits)),
            clock,
            control: Arc::new(control),
        })
    }

    /// The most model calls served at once since the start or the last reset.
    pub fn in_flight_max(&self) -> u64 {
        self.control.in_flight_max()
    }

    /// Every admission so far.
    pub fn admissions(&self) -> Vec<Admission> {
        self.ledger.lock().expect("ledger lock").admissions().to_vec()
    }

    /// The token limits enforced, in the order of [`Admission::settled_tokens`].
    pub fn token_limits(&self) -> Vec<TokenLimit> {
        self.ledger.lock().expect("ledger lock").token_limits()
    }

    /// The counts so far.
    pub fn counts(&self) -> LedgerCounts {
        self.ledger.lock().expect("ledger lock").counts()
    }

    /// The limits enforced.
    pub fn limits(&self) -> ProviderLimits {
        *self.ledger.lock().expect("ledger lock").limits()
    }

    /// Enforces the limits as `profile`'s provider does from now on, with an
    /// empty ledger (call it before serving).
    pub fn set_profile(&self, profile: SimProfile) {
        let mut ledger = self.ledger.lock().expect("ledger lock");
        *ledger = Ledger::with_profile(*ledger.limits(), profile, self.clock.now_unix_ms());
    }

    /// The profile enforced.
    pub fn profile(&self) -> SimProfile {
        *self.ledger.lock().expect("ledger lock").profile()
    }

    /// The routes: the OpenAI and Anthropic endpoints (docs/provider-sim.md) and the
    /// simulator's control routes.
    pub fn router(self: &Arc<Self>) -> Router {
        Router::new()
            .route("/v1/chat/completions", post(sim_openai::chat_completions))
            .route("/v1/embeddings", post(sim_openai::embeddings))
            .route("/v1/responses", post(sim_openai::responses))
            .route("/v1/models", get(sim_openai::models))
            .route("/v1/messages", post(sim_anthropic::messages))
            .route("/v1/messages/count_tokens", post(sim_anthropic::count_tokens))
            .route("/sim/stats", get(sim_control::stats).delete(sim_control::reset_stats))
            .route(
                "/sim/faults",
                post(sim_control::arm_fault).delete(sim_control::disarm_fault),
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

/// Releases the concurrency slot when the call ends, also when the client hangs
/// up mid-call and the handler is dropped.
pub struct Slot {
    pub(crate) provider: Arc<ProviderServer>,
    pub(crate) ticket: Ticket,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.provider.ledger.lock().expect("ledger lock").release(self.ticket);
    }
}

pub(crate) fn limit_headers(headers: &mut HeaderMap, limits: &ProviderLimits, remaining: Remaining) {
    let mut put = |name: &'static str, value: u64| {
        headers.insert(name, HeaderValue::from(value));
    };
    put("x-ratelimit-limit-requests", limits.rpm);
    put("x-ratelimit-limit-tokens", limits.tpm);
    put("x-ratelimit-remaining-requests", remaining.requests);
    put("x-ratelimit-remaining-tokens", remaining.tokens);
}
