//! The simulated provider's HTTP face: an OpenAI-style `POST /v1/chat/completions`
//! on loopback that enforces [`Ledger`] limits, answers 429 with `retry-after` and
//! `x-ratelimit-*` headers, and takes a time that grows with the output tokens.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use ratelimiter::Clock;
use serde::{Deserialize, Serialize};
use tokio::net::TcpListener;

use crate::prompt;
use crate::provider::{count_tokens, Admission, Ledger, LedgerCounts, ProviderLimits, Remaining, Ticket, Verdict};
use crate::provider_client::ADMITTED_HEADER;
use crate::sim_profile::{CallShape, LimitState, ProfileName, SimProfile};

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
    ledger: Mutex<Ledger>,
    clock: Arc<dyn Clock>,
}

impl ProviderServer {
    /// A provider enforcing `limits`, reading time from `clock`.
    pub fn new(limits: ProviderLimits, clock: Arc<dyn Clock>) -> Arc<Self> {
        Arc::new(Self {
            ledger: Mutex::new(Ledger::new(limits)),
            clock,
        })
    }

    /// Every admission so far.
    pub fn admissions(&self) -> Vec<Admission> {
        self.ledger.lock().expect("ledger lock").admissions().to_vec()
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

    /// The routes: the chat endpoint and `GET /sim/stats`.
    pub fn router(self: &Arc<Self>) -> Router {
        Router::new()
            .route("/v1/chat/completions", post(chat))
            .route("/sim/stats", get(stats))
            .layer(DefaultBodyLimit::max(BODY_BYTES_MAX))
            .with_state(Arc::clone(self))
    }

    /// Serves on `listener` until `shutdown` resolves.
    pub async fn serve(
        self: Arc<Self>,
        listener: TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        axum::serve(listener, self.router())
            .with_graceful_shutdown(shutdown)
            .await
    }
}

/// Releases the concurrency slot when the call ends, also when the client hangs
/// up mid-call and the handler is dropped.
struct Slot {
    provider: Arc<ProviderServer>,
    ticket: Ticket,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.provider.ledger.lock().expect("ledger lock").release(self.ticket);
    }
}

async fn stats(State(provider): State<Arc<ProviderServer>>) -> Json<serde_json::Value> {
    let ledger = provider.ledger.lock().expect("ledger lock");
    Json(serde_json::json!({ "counts": ledger.counts(), "in_flight": ledger.in_flight() }))
}

fn error(status: StatusCode, kind: &str, message: String) -> Response {
    let body = serde_json::json!({ "error": { "message": message, "type": kind, "code": null } });
    (status, Json(body)).into_response()
}

fn limit_headers(headers: &mut HeaderMap, limits: &ProviderLimits, remaining: Remaining) {
    let mut put = |name: &'static str, value: u64| {
        headers.insert(name, HeaderValue::from(value));
    };
    put("x-ratelimit-limit-requests", limits.rpm);
    put("x-ratelimit-limit-tokens", limits.tpm);
    put("x-ratelimit-remaining-requests", remaining.requests);
    put("x-ratelimit-remaining-tokens", remaining.tokens);
}

fn parse(body: &[u8]) -> Result<(ChatRequest, u64, u64, u64), String> {
    let request: ChatRequest = serde_json::from_slice(body).map_err(|e| format!("bad request body: {e}"))?;
    if request.messages.is_empty() || request.messages.len() > MESSAGES_MAX {
        return Err(format!("messages must hold 1..={MESSAGES_MAX} entries"));
    }
    let max_tokens = request.max_tokens.unwrap_or(MAX_TOKENS_DEFAULT);
    if !(1..=MAX_TOKENS_MAX).contains(&max_tokens) {
        return Err(format!("max_tokens must be 1..={MAX_TOKENS_MAX}, got {max_tokens}"));
    }
    let prompt_tokens = request.messages.iter().map(|m| count_tokens(&m.content)).sum();
    let output_tokens = request.sim_output_tokens.unwrap_or(max_tokens).min(max_tokens);
    Ok((request, prompt_tokens, max_tokens, output_tokens))
}

async fn chat(State(provider): State<Arc<ProviderServer>>, body: Bytes) -> Response {
    let (request, prompt_tokens, max_tokens, output_tokens) = match parse(&body) {
        Ok(parsed) => parsed,
        Err(message) => return error(StatusCode::BAD_REQUEST, "invalid_request_error", message),
    };
    let limits = provider.limits();
    let call = CallShape {
        prompt_tokens,
        max_tokens,
        output_tokens,
        best_of: 1,
        ..CallShape::default()
    };
    let busy_ms = limits.ms_per_output_token * output_tokens;
    let now_ms = provider.clock.now_unix_ms();
    let (verdict, states, profile) = {
        let mut ledger = provider.ledger.lock().expect("ledger lock");
        let verdict = ledger.admit_call(now_ms, &call, busy_ms);
        (verdict, ledger.limit_states(now_ms), *ledger.profile())
    };
    let (slot, remaining) = match verdict {
        Verdict::Admitted { ticket, remaining } => {
            let slot = Slot {
                provider: Arc::clone(&provider),
                ticket,
            };
            (slot, remaining)
        }
        Verdict::Throttled {
            limit,
            retry_after_ms,
            remaining,
        } => {
            let mut response = throttled(&limits, limit, retry_after_ms, remaining);
            profile_throttled(
                &mut response,
                &profile,
                &request.model,
                limit,
                &states,
                retry_after_ms,
                now_ms,
            );
            return response;
        }
        Verdict::TooLarge { charge } => {
            let message = format!(
                "request too large: {charge} tokens charged, the limit is {} per window",
                limits.tpm
            );
            return error(StatusCode::BAD_REQUEST, "tokens", message);
        }
    };
    tokio::time::sleep(Duration::from_millis(busy_ms)).await;
    drop(slot);
    let body = serde_json::json!({
        "id": format!("chatcmpl-sim-{now_ms}"),
        "object": "chat.completion",
        "created": now_ms / 1000,
        "model": request.model,
        "choices": [{
            "index": 0,
            "message": { "role": "assistant", "content": prompt::synthesize(output_tokens) },
            "finish_reason": if output_tokens == max_tokens { "length" } else { "stop" },
        }],
        "usage": Usage { prompt_tokens, completion_tokens: output_tokens, total_tokens: prompt_tokens + output_tokens },
    });
    let mut response = Json(body).into_response();
    limit_headers(response.headers_mut(), &limits, remaining);
    put_headers(response.headers_mut(), profile.headers(now_ms, &states));
    (response.headers_mut()).insert(ADMITTED_HEADER, HeaderValue::from(now_ms));
    response
}

/// Adds `headers` (the profile's names), replacing any of the same name.
fn put_headers(target: &mut HeaderMap, headers: Vec<(String, String)>) {
    for (name, value) in headers {
        if let (Ok(name), Ok(value)) = (HeaderName::try_from(name), HeaderValue::try_from(value)) {
            target.insert(name, value);
        }
    }
}

/// Turns a 429 into the profile's provider's: its body and headers.
fn profile_throttled(
    response: &mut Response,
    profile: &SimProfile,
    model: &str,
    limit: crate::provider::LimitKind,
    states: &[LimitState],
    retry_after_ms: u64,
    now_ms: u64,
) {
    use crate::provider::LimitKind;
    if profile.name == ProfileName::Sliding || limit == LimitKind::Concurrency {
        return;
    }
    let refused = (states.iter())
        .filter(|s| s.dimension.is_requests() == (limit == LimitKind::Requests))
        .find(|s| s.remaining == 0)
        .or_else(|| {
            states
                .iter()
                .find(|s| s.dimension.is_requests() == (limit == LimitKind::Requests))
        })
        .copied()
        .expect("a profile keeps a limit of each kind");
    let (extra, body) = profile.throttled(model, &refused, retry_after_ms);
    let headers = response.headers_mut().clone();
    *response = (StatusCode::TOO_MANY_REQUESTS, Json(body)).into_response();
    *response.headers_mut() = headers;
    response.headers_mut().remove(axum::http::header::CONTENT_LENGTH);
    put_headers(response.headers_mut(), profile.headers(now_ms, states));
    put_headers(response.headers_mut(), extra);
}

fn throttled(
    limits: &ProviderLimits,
    limit: crate::provider::LimitKind,
    retry_after_ms: u64,
    remaining: Remaining,
) -> Response {
    let kind = serde_json::to_value(limit).expect("serializes");
    let message = format!(
        "rate limit reached for {}; retry after {retry_after_ms} ms",
        kind.as_str().unwrap_or("")
    );
    let mut response = error(
        StatusCode::TOO_MANY_REQUESTS,
        kind.as_str().unwrap_or("requests"),
        message,
    );
    let headers = response.headers_mut();
    headers.insert("retry-after", HeaderValue::from(retry_after_ms.div_ceil(1000)));
    headers.insert("retry-after-ms", HeaderValue::from(retry_after_ms));
    limit_headers(headers, limits, remaining);
    response
}
