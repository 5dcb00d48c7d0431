//! Anthropic's wire format in the simulator: `POST /v1/messages` (streaming and
//! not) and `POST /v1/messages/count_tokens`, with Anthropic's rate-limit headers
//! and error shape.
//!
//! Sources: <https://docs.anthropic.com/en/api/messages> (the `message` object,
//! `usage.input_tokens` / `output_tokens`, `stop_reason` `end_turn` or `max_tokens`;
//! `max_tokens` is required), <https://docs.anthropic.com/en/docs/build-with-claude/streaming>
//! ("Each stream uses the following event flow: 1. `message_start`: contains a
//! `Message` object with empty `content`. 2. A series of content blocks, each of which
//! have a `content_block_start`, one or more `content_block_delta` events, and a
//! `content_block_stop` event. ... 3. One or more `message_delta` events, indicating
//! top-level changes to the final `Message` object. 4. A final `message_stop` event."
//! and "The token counts shown in the `usage` field of the `message_delta` event are
//! cumulative"), <https://docs.anthropic.com/en/api/messages-count-tokens>
//! (`{"input_tokens": n}`), <https://docs.anthropic.com/en/api/rate-limits>
//! (`anthropic-ratelimit-requests-limit`, `-remaining`, `-reset` "provided in RFC 3339
//! format", the same for `tokens`, and `retry-after` on 429) and
//! <https://docs.anthropic.com/en/api/errors> (`{"type": "error", "error": {"type":
//! "rate_limit_error", "message": ...}}`).
//!
//! The simulator keeps one token limit (the ledger's); Anthropic's separate input and
//! output limits are the `anthropic` profile's. Counting as in [`crate::sim::openai`]: the
//! system prompt and every text block, one token per 4 bytes per text; images by
//! Anthropic's rule ([`crate::sim::vision`]); the prefix marked `cache_control`
//! through the prompt cache ([`crate::sim::cache`]), whose reads the `anthropic`
//! profile does not charge on its input limit.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;

use crate::sim::admission::{admit_cached, full_reset_ms, play_fault, put_profile_headers, refused};
use crate::sim::cache::CacheSplit;
use crate::sim::content::{output_bound, output_words, prompt_tokens, Content};
use crate::sim::errors::{error, Wire};
use crate::sim::limits::ProviderLimits;
use crate::sim::price::BilledUsage;
use crate::sim::prompt;
use crate::sim::provider::Remaining;
use crate::sim::reset_time::rfc3339;
use crate::sim::server::ProviderServer;
use crate::sim::sse::{sse_event, sse_response, SseStream};
use crate::sim::wire::MESSAGES_MAX;

/// The body of `POST /v1/messages` and `POST /v1/messages/count_tokens`.
#[derive(Debug, Deserialize)]
struct MessagesBody {
    model: String,
    messages: Vec<Message>,
    #[serde(default)]
    system: Option<Content>,
    /// Required by `/v1/messages`, absent from `count_tokens`.
    #[serde(default)]
    max_tokens: Option<u64>,
    #[serde(default)]
    stream: bool,
    #[serde(default)]
    sim_output_tokens: Option<u64>,
}

#[derive(Debug, Deserialize)]
struct Message {
    #[allow(dead_code)]
    role: String,
    content: Content,
}

impl MessagesBody {
    /// Parses and checks a body; `Err` is the 400 to answer.
    fn parse(body: &[u8]) -> Result<(Self, u64), Box<Response>> {
        let request: Self =
            serde_json::from_slice(body).map_err(|e| Box::new(bad_request(format!("bad request body: {e}"))))?;
        if request.messages.is_empty() || request.messages.len() > MESSAGES_MAX {
            return Err(Box::new(bad_request(format!("messages: 1..={MESSAGES_MAX} entries"))));
        }
        let (prompt, _) = request.prompt();
        Ok((request, prompt))
    }

    /// The prompt's tokens (texts, and images by Anthropic's rule) and its cached
    /// prefix: the hash and tokens of everything up to the last block marked
    /// `cache_control`, in Anthropic's order (system, then messages).
    fn prompt(&self) -> (u64, Option<(u64, u64)>) {
        use std::hash::{Hash, Hasher};
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        let (mut tokens, mut prefix) = (0, None);
        let contents = self.system.iter().chain(self.messages.iter().map(|m| &m.content));
        for content in contents {
            match content {
                Content::Text(text) => {
                    text.hash(&mut hasher);
                    tokens += prompt_tokens([text.as_str()]);
                }
                Content::Blocks(blocks) => {
                    for block in blocks {
                        (&block.kind, &block.text, block.source.as_ref().map(ToString::to_string)).hash(&mut hasher);
                        tokens +=
                            block.text.as_deref().map_or(0, |t| prompt_tokens([t])) + block.image_tokens(&self.model);
                        if block.cache_control.is_some() {
                            prefix = Some((hasher.finish(), tokens));
                        }
                    }
                }
            }
        }
        (tokens, prefix)
    }
}

fn bad_request(message: String) -> Response {
    error(Wire::Anthropic, StatusCode::BAD_REQUEST, message)
}

/// The rate-limit headers of an Anthropic answer; resets are RFC 3339 instants.
fn headers(limits: &ProviderLimits, remaining: Remaining, reset_unix_ms: u64) -> HeaderMap {
    let mut headers = HeaderMap::new();
    let reset = HeaderValue::from_str(&rfc3339(reset_unix_ms)).expect("ascii");
    for (kind, limit, left) in [
        ("requests", limits.rpm, remaining.requests),
        ("tokens", limits.tpm, remaining.tokens),
    ] {
        let name = |field: &str| format!("anthropic-ratelimit-{kind}-{field}");
        headers.insert(
            axum::http::HeaderName::try_from(name("limit")).expect("valid"),
            HeaderValue::from(limit),
        );
        headers.insert(
            axum::http::HeaderName::try_from(name("remaining")).expect("valid"),
            HeaderValue::from(left),
        );
        headers.insert(
            axum::http::HeaderName::try_from(name("reset")).expect("valid"),
            reset.clone(),
        );
    }
    headers
}

/// `POST /v1/messages`, streaming or not.
pub async fn messages(
    State(provider): State<Arc<ProviderServer>>,
    request_headers: HeaderMap,
    body: Bytes,
) -> Response {
    let (request, prompt) = match MessagesBody::parse(&body) {
        Ok(parsed) => parsed,
        Err(response) => return *response,
    };
    let Some(max_tokens) = request.max_tokens else {
        return bad_request("max_tokens: Field required".to_owned());
    };
    let bound = match output_bound("max_tokens", Some(max_tokens)) {
        Ok(bound) => bound,
        Err(message) => return bad_request(message),
    };
    let drop_after = match play_fault(
        &provider,
        Wire::Anthropic,
        &request_headers,
        &request.model,
        request.stream,
    )
    .await
    {
        Ok(drop_after) => drop_after,
        Err(response) => return *response,
    };
    let busy = provider.control.busy();
    let output = provider.control.output_tokens(request.sim_output_tokens, bound);
    let limits = provider.limits();
    let now_ms = provider.clock.now_unix_ms();
    let (_, prefix) = request.prompt();
    let split = provider
        .control
        .prompt_cache
        .split(&request.model, prompt, prefix, now_ms);
    let cache_read = split.cache_read_input_tokens;
    let admitted = match admit_cached(&provider, &request.model, prompt, cache_read, bound, output) {
        Ok(admitted) => {
            provider.control.prompt_cache.remember(split, prefix, now_ms);
            // Billed at once, as the OpenAI routes are (`openai::admit_openai`).
            let usage = BilledUsage::anthropic(
                split.input_tokens,
                split.cache_creation_input_tokens,
                split.cache_read_input_tokens,
                output,
            );
            provider.control.billing.bill(&request.model, &usage);
            admitted
        }
        Err(refusal) => {
            let remaining = refusal.remaining().unwrap_or(Remaining { requests: 0, tokens: 0 });
            let reset = now_ms + full_reset_ms(&provider, now_ms);
            return refused(Wire::Anthropic, refusal, limits.tpm, headers(&limits, remaining, reset));
        }
    };
    let mut headers = headers(&limits, admitted.remaining, admitted.now_ms + limits.window_ms);
    put_profile_headers(&mut headers, &admitted.profile_headers);
    let stop_reason = if output == bound { "max_tokens" } else { "end_turn" };
    let id = format!("msg_sim{}", admitted.now_ms);
    if !request.stream {
        tokio::time::sleep(std::time::Duration::from_millis(limits.ms_per_output_token * output)).await;
        drop((admitted.slot, busy));
        let body = serde_json::json!({
            "id": id, "type": "message", "role": "assistant", "model": request.model,
            "content": [{"type": "text", "text": prompt::synthesize(output)}],
            "stop_reason": stop_reason, "stop_sequence": null,
            "usage": usage(split, output),
        });
        return (headers, Json(body)).into_response();
    }
    let stream = SseStream {
        events: message_events(&id, &request.model, split, output, stop_reason),
        token_delay_ms: limits.ms_per_output_token,
        drop_after,
        guards: (admitted.slot, busy),
    };
    sse_response(stream, headers)
}

/// Anthropic's usage object, the prompt split by the prompt cache.
fn usage(split: CacheSplit, output: u64) -> serde_json::Value {
    serde_json::json!({
        "input_tokens": split.input_tokens, "output_tokens": output,
        "cache_creation_input_tokens": split.cache_creation_input_tokens,
        "cache_read_input_tokens": split.cache_read_input_tokens,
    })
}

/// The events of a streamed message: `message_start` with the input tokens (and
/// one output token, as Anthropic reports at the start), one text block with a
/// delta per token, `message_delta` with the cumulative output tokens, `message_stop`.
fn message_events(id: &str, model: &str, prompt: CacheSplit, output: u64, stop_reason: &str) -> Vec<(Bytes, bool)> {
    let start = serde_json::json!({
        "type": "message_start",
        "message": {
            "id": id, "type": "message", "role": "assistant", "model": model, "content": [],
            "stop_reason": null, "stop_sequence": null, "usage": usage(prompt, output.min(1)),
        },
    });
    let mut events: Vec<(serde_json::Value, bool)> = vec![
        (start, false),
        (
            serde_json::json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
            false,
        ),
        (serde_json::json!({"type": "ping"}), false),
    ];
    for word in output_words(output) {
        let delta = serde_json::json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": word}});
        events.push((delta, true));
    }
    events.extend([
        (serde_json::json!({"type": "content_block_stop", "index": 0}), false),
        (
            serde_json::json!({"type": "message_delta", "delta": {"stop_reason": stop_reason, "stop_sequence": null}, "usage": {"output_tokens": output}}),
            false,
        ),
        (serde_json::json!({"type": "message_stop"}), false),
    ]);
    events
        .into_iter()
        .map(|(event, is_token)| {
            let name = event["type"].as_str().expect("named").to_owned();
            (sse_event(Some(&name), &event.to_string()), is_token)
        })
        .collect()
}

/// `POST /v1/messages/count_tokens`: the prompt's count, not limited by the ledger
/// (Anthropic limits it by requests of its own, which the simulator does not model).
pub async fn count_tokens(
    State(provider): State<Arc<ProviderServer>>,
    request_headers: HeaderMap,
    body: Bytes,
) -> Response {
    let (request, prompt) = match MessagesBody::parse(&body) {
        Ok(parsed) => parsed,
        Err(response) => return *response,
    };
    if let Err(response) = provider
        .control
        .authorize(Wire::Anthropic, &request_headers, &request.model)
    {
        return *response;
    }
    Json(serde_json::json!({"input_tokens": prompt})).into_response()
}
