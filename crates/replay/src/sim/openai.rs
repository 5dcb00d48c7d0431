//! OpenAI's wire format in the simulator: `POST /v1/chat/completions` (streaming and
//! not), `POST /v1/embeddings`, `POST /v1/responses` (streaming and not; a
//! `conversation` is echoed), `POST /v1/conversations` and `GET /v1/models`, with OpenAI's rate-limit headers and error shape.
//!
//! Sources: the API reference, <https://platform.openai.com/docs/api-reference/chat/create>
//! ("stream_options: ... include_usage: If set, an additional chunk will be streamed
//! before the `data: [DONE]` message. The usage field on this chunk shows the token
//! usage statistics for the entire request, and the choices field will always be an
//! empty array. All other chunks will also include a usage field, but with a null
//! value."), <https://platform.openai.com/docs/api-reference/chat-streaming>
//! (`chat.completion.chunk` objects), <https://platform.openai.com/docs/api-reference/responses-streaming>
//! (`response.created` ... `response.output_text.delta` ... `response.completed`, whose
//! response carries `usage`), <https://platform.openai.com/docs/api-reference/embeddings/create>
//! (`usage.prompt_tokens`; "The input must not exceed the max input tokens for the
//! model ... and any array must be 2048 dimensions or less"), and the rate-limit guide
//! <https://platform.openai.com/docs/guides/rate-limits> (`x-ratelimit-limit-requests`,
//! `x-ratelimit-remaining-tokens`, `x-ratelimit-reset-requests` "the time until the
//! rate limit (based on requests) resets to its initial state").
//!
//! Counting rule (docs/provider-sim.md): a prompt is [`crate::sim::limits::count_tokens`]
//! of each text (one token per 4 bytes, rounded up, per text) and each image by
//! OpenAI's rule for the model ([`crate::sim::vision`]); the model writes
//! `sim_output_tokens` tokens (a body field of the simulator) capped by the output
//! bound, or the bound itself; each output token is the 4-byte word of
//! [`crate::sim::prompt::synthesize`] and takes the provider's `ms_per_output_token`.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use base64::Engine;
use serde::Deserialize;

use crate::sim::admission::{admit, full_reset_ms, play_fault, put_profile_headers, refused, Admitted};
use crate::sim::content::{output_bound, output_words, prompt_tokens, Content};
use crate::sim::errors::{error, Wire};
use crate::sim::hosted_tools;
use crate::sim::limits::ProviderLimits;
use crate::sim::price::BilledUsage;
use crate::sim::prompt;
use crate::sim::provider::Remaining;
use crate::sim::reset_time::openai_duration;
use crate::sim::server::{self, ProviderServer};
use crate::sim::sse::{sse_event, sse_response, SseStream};
use crate::sim::wire::{Usage, ADMITTED_HEADER, MESSAGES_MAX};

/// The most inputs of one embeddings call, as OpenAI documents ("any array must be
/// 2048 dimensions or less").
pub const EMBEDDING_INPUTS_MAX: usize = 2_048;
/// The vector length when the request names none: short, as the simulator's vectors
/// carry no meaning and the benchmark should not measure JSON of floats.
pub const EMBEDDING_DIMENSIONS_DEFAULT: usize = 16;
/// The longest vector asked for (text-embedding-3-large's length).
pub const EMBEDDING_DIMENSIONS_MAX: usize = 3_072;

/// A chat request as the simulator reads it (the replay sends the subset
/// [`crate::sim::wire::ChatRequest`]).
#[derive(Debug, Deserialize)]
struct ChatBody {
    model: String,
    messages: Vec<ChatMessage>,
    #[serde(default)]
    stream: bool,
    #[serde(default)]
    stream_options: Option<StreamOptions>,
    #[serde(default)]
    max_tokens: Option<u64>,
    #[serde(default)]
    max_completion_tokens: Option<u64>,
    #[serde(default)]
    sim_output_tokens: Option<u64>,
}

#[derive(Debug, Deserialize)]
struct ChatMessage {
    #[allow(dead_code)]
    role: String,
    #[serde(default)]
    content: Option<Content>,
}

#[derive(Debug, Default, Deserialize)]
struct StreamOptions {
    #[serde(default)]
    include_usage: bool,
}

/// The rate-limit headers of an OpenAI answer: limits, what is left, and the time
/// until the rolling window is empty again.
fn headers(limits: &ProviderLimits, remaining: Remaining, reset_ms: u64) -> HeaderMap {
    let mut headers = HeaderMap::new();
    server::limit_headers(&mut headers, limits, remaining);
    let reset = HeaderValue::from_str(&openai_duration(reset_ms)).expect("ascii");
    headers.insert("x-ratelimit-reset-requests", reset.clone());
    headers.insert("x-ratelimit-reset-tokens", reset);
    headers
}

fn bad_request(message: String) -> Response {
    error(Wire::Openai, StatusCode::BAD_REQUEST, message)
}

/// Admits a call or answers the ledger's refusal with OpenAI's headers. An
/// admitted call is billed its whole usage (`prompt` input tokens and the
/// `searched` ones a hosted web search read, none cached: the simulator keeps no
/// OpenAI prompt cache; `output` tokens) at once: a cut stream or a client's
/// hang-up bills no less, an upper bound of the provider's bill.
fn admit_openai(
    provider: &Arc<ProviderServer>,
    model: &str,
    (prompt, searched): (u64, u64),
    bound: u64,
    output: u64,
) -> Result<(Admitted, HeaderMap), Box<Response>> {
    let limits = provider.limits();
    let now_ms = provider.clock.now_unix_ms();
    match admit(provider, model, prompt, bound, output) {
        Ok(admitted) => {
            let billed = BilledUsage::openai(prompt + searched, 0, output);
            (provider.control.billing).bill(model, &billed);
            let mut headers = headers(&limits, admitted.remaining, limits.window_ms);
            put_profile_headers(&mut headers, &admitted.profile_headers);
            Ok((admitted, headers))
        }
        Err(refusal) => {
            let remaining = refusal.remaining().unwrap_or(Remaining { requests: 0, tokens: 0 });
            let headers = headers(&limits, remaining, full_reset_ms(provider, now_ms));
            Err(Box::new(refused(Wire::Openai, refusal, limits.tpm, headers)))
        }
    }
}

/// `POST /v1/chat/completions`, streaming or not (the replay's calls are the
/// non-streaming ones, with [`ADMITTED_HEADER`]).
pub async fn chat_completions(
    State(provider): State<Arc<ProviderServer>>,
    request_headers: HeaderMap,
    body: Bytes,
) -> Response {
    let request: ChatBody = match serde_json::from_slice(&body) {
        Ok(request) => request,
        Err(e) => return bad_request(format!("bad request body: {e}")),
    };
    let drop_after = match play_fault(
        &provider,
        Wire::Openai,
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
    if request.messages.is_empty() || request.messages.len() > MESSAGES_MAX {
        return bad_request(format!("messages must hold 1..={} entries", MESSAGES_MAX));
    }
    let bound = match output_bound("max_tokens", request.max_completion_tokens.or(request.max_tokens)) {
        Ok(bound) => bound,
        Err(message) => return bad_request(message),
    };
    let contents = request.messages.iter().filter_map(|m| m.content.as_ref());
    let images: u64 = contents.clone().map(|c| c.image_tokens(&request.model)).sum();
    let prompt = prompt_tokens(contents.flat_map(Content::texts)) + images;
    let output = provider.control.output_tokens(request.sim_output_tokens, bound);
    let (admitted, headers) = match admit_openai(&provider, &request.model, (prompt, 0), bound, output) {
        Ok(admitted) => admitted,
        Err(response) => return *response,
    };
    if !request.stream {
        let limits = provider.limits();
        tokio::time::sleep(Duration::from_millis(limits.ms_per_output_token * output)).await;
        drop((admitted.slot, busy));
        let now_ms = admitted.now_ms;
        let body = serde_json::json!({
            "id": format!("chatcmpl-sim-{now_ms}"), "object": "chat.completion", "created": now_ms / 1000,
            "model": request.model,
            "choices": [{
                "index": 0,
                "message": {"role": "assistant", "content": prompt::synthesize(output)},
                "finish_reason": if output == bound { "length" } else { "stop" },
            }],
            "usage": Usage { prompt_tokens: prompt, completion_tokens: output, total_tokens: prompt + output },
        });
        let mut response = (headers, Json(body)).into_response();
        response
            .headers_mut()
            .insert(ADMITTED_HEADER, HeaderValue::from(now_ms));
        return response;
    }
    let include_usage = request.stream_options.unwrap_or_default().include_usage;
    let events = chat_events(&request.model, admitted.now_ms, prompt, bound, output, include_usage);
    let stream = SseStream {
        events,
        token_delay_ms: provider.limits().ms_per_output_token,
        drop_after,
        guards: (admitted.slot, busy),
    };
    sse_response(stream, headers)
}

/// The chunks of a streamed chat completion: the role, one chunk per token, the
/// finish reason, the usage chunk when asked for, and `[DONE]`.
fn chat_events(
    model: &str,
    now_ms: u64,
    prompt: u64,
    bound: u64,
    output: u64,
    include_usage: bool,
) -> Vec<(Bytes, bool)> {
    let id = format!("chatcmpl-sim-{now_ms}");
    let usage_null = include_usage.then_some(serde_json::Value::Null);
    let chunk = |delta: serde_json::Value, finish: Option<&str>| {
        let mut chunk = serde_json::json!({
            "id": id, "object": "chat.completion.chunk", "created": now_ms / 1000, "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        });
        if let Some(null) = &usage_null {
            chunk["usage"] = null.clone();
        }
        sse_event(None, &chunk.to_string())
    };
    let mut events = Vec::with_capacity(usize::try_from(output).expect("fits") + 4);
    events.push((
        chunk(serde_json::json!({"role": "assistant", "content": ""}), None),
        false,
    ));
    for word in output_words(output) {
        events.push((chunk(serde_json::json!({"content": word}), None), true));
    }
    let finish = if output == bound { "length" } else { "stop" };
    events.push((chunk(serde_json::json!({}), Some(finish)), false));
    if include_usage {
        let usage = Usage {
            prompt_tokens: prompt,
            completion_tokens: output,
            total_tokens: prompt + output,
        };
        let last = serde_json::json!({
            "id": id, "object": "chat.completion.chunk", "created": now_ms / 1000, "model": model,
            "choices": [], "usage": usage,
        });
        events.push((sse_event(None, &last.to_string()), false));
    }
    events.push((sse_event(None, "[DONE]"), false));
    events
}

/// The body of `POST /v1/embeddings`.
#[derive(Debug, Deserialize)]
struct EmbeddingsBody {
    model: String,
    input: EmbeddingInput,
    #[serde(default)]
    encoding_format: Option<String>,
    #[serde(default)]
    dimensions: Option<usize>,
}

/// A string, strings, a token array or token arrays, as OpenAI accepts.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum EmbeddingInput {
    Text(String),
    Texts(Vec<String>),
    Tokens(Vec<u32>),
    TokenArrays(Vec<Vec<u32>>),
}

impl EmbeddingInput {
    /// The token count of each input: a text's by the simulator's rule, a token
    /// array's length.
    fn counts(&self) -> Vec<u64> {
        match self {
            EmbeddingInput::Text(text) => vec![prompt_tokens([text.as_str()])],
            EmbeddingInput::Texts(texts) => texts.iter().map(|t| prompt_tokens([t.as_str()])).collect(),
            EmbeddingInput::Tokens(tokens) => vec![tokens.len() as u64],
            EmbeddingInput::TokenArrays(arrays) => arrays.iter().map(|a| a.len() as u64).collect(),
        }
    }
}

/// `POST /v1/embeddings`: charged the input tokens, answered at once.
pub async fn embeddings(
    State(provider): State<Arc<ProviderServer>>,
    request_headers: HeaderMap,
    body: Bytes,
) -> Response {
    let request: EmbeddingsBody = match serde_json::from_slice(&body) {
        Ok(request) => request,
        Err(e) => return bad_request(format!("bad request body: {e}")),
    };
    let counts = request.input.counts();
    if counts.is_empty() || counts.len() > EMBEDDING_INPUTS_MAX || counts.contains(&0) {
        return bad_request(format!("input must hold 1..={EMBEDDING_INPUTS_MAX} non-empty entries"));
    }
    let dimensions = request.dimensions.unwrap_or(EMBEDDING_DIMENSIONS_DEFAULT);
    let base64 = match request.encoding_format.as_deref() {
        None | Some("float") => false,
        Some("base64") => true,
        Some(other) => return bad_request(format!("encoding_format must be float or base64, got {other}")),
    };
    if !(1..=EMBEDDING_DIMENSIONS_MAX).contains(&dimensions) {
        return bad_request(format!("dimensions must be 1..={EMBEDDING_DIMENSIONS_MAX}"));
    }
    if let Err(response) = play_fault(&provider, Wire::Openai, &request_headers, &request.model, false).await {
        return *response;
    }
    let _busy = provider.control.busy();
    let prompt: u64 = counts.iter().sum();
    let (admitted, headers) = match admit_openai(&provider, &request.model, (prompt, 0), 1, 0) {
        Ok(admitted) => admitted,
        Err(response) => return *response,
    };
    drop(admitted.slot);
    let data: Vec<serde_json::Value> = (0..counts.len())
        .map(|index| {
            let vector = embedding(index, dimensions);
            let embedding = if base64 {
                let bytes: Vec<u8> = vector.iter().flat_map(|x| x.to_le_bytes()).collect();
                serde_json::Value::from(base64::engine::general_purpose::STANDARD.encode(bytes))
            } else {
                serde_json::Value::from(vector)
            };
            serde_json::json!({"object": "embedding", "index": index, "embedding": embedding})
        })
        .collect();
    let body = serde_json::json!({
        "object": "list", "data": data, "model": request.model,
        "usage": {"prompt_tokens": prompt, "total_tokens": prompt},
    });
    (headers, Json(body)).into_response()
}

/// A deterministic vector: the simulator's embeddings carry no meaning.
fn embedding(index: usize, dimensions: usize) -> Vec<f32> {
    (0..dimensions)
        .map(|d| ((index * 31 + d * 7) % 97) as f32 / 97.0)
        .collect()
}

/// The body of `POST /v1/responses`.
#[derive(Debug, Deserialize)]
struct ResponsesBody {
    model: String,
    input: ResponsesInput,
    #[serde(default)]
    instructions: Option<String>,
    #[serde(default)]
    max_output_tokens: Option<u64>,
    #[serde(default)]
    stream: bool,
    #[serde(default)]
    sim_output_tokens: Option<u64>,
    /// The conversation continued (an id, or `{"id": ...}`), echoed in the answer.
    #[serde(default)]
    conversation: Option<serde_json::Value>,
    /// The tools offered; a web search among them runs once
    /// ([`hosted_tools`]).
    #[serde(default)]
    tools: Vec<serde_json::Value>,
}

/// A string or input items (messages whose content is a string or blocks).
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum ResponsesInput {
    Text(String),
    Items(Vec<ResponsesItem>),
}

#[derive(Debug, Deserialize)]
struct ResponsesItem {
    #[serde(default)]
    content: Option<Content>,
}

/// `POST /v1/responses`, streaming or not.
pub async fn responses(
    State(provider): State<Arc<ProviderServer>>,
    request_headers: HeaderMap,
    body: Bytes,
) -> Response {
    let request: ResponsesBody = match serde_json::from_slice(&body) {
        Ok(request) => request,
        Err(e) => return bad_request(format!("bad request body: {e}")),
    };
    let bound = match output_bound("max_output_tokens", request.max_output_tokens) {
        Ok(bound) => bound,
        Err(message) => return bad_request(message),
    };
    let mut texts: Vec<&str> = request.instructions.as_deref().into_iter().collect();
    let mut images = 0;
    match &request.input {
        ResponsesInput::Text(text) => texts.push(text),
        ResponsesInput::Items(items) if items.is_empty() => return bad_request("input must not be empty".to_owned()),
        ResponsesInput::Items(items) => {
            let contents = items.iter().filter_map(|i| i.content.as_ref());
            images = contents.clone().map(|c| c.image_tokens(&request.model)).sum();
            texts.extend(contents.flat_map(Content::texts))
        }
    }
    let drop_after = match play_fault(
        &provider,
        Wire::Openai,
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
    let prompt = prompt_tokens(texts) + images;
    let output = provider.control.output_tokens(request.sim_output_tokens, bound);
    let searched = if hosted_tools::offers_web_search(&request.tools) {
        hosted_tools::WEB_SEARCH_CONTENT_TOKENS
    } else {
        0
    };
    let (admitted, headers) = match admit_openai(&provider, &request.model, (prompt, searched), bound, output) {
        Ok(admitted) => admitted,
        Err(response) => return *response,
    };
    let delay_ms = provider.limits().ms_per_output_token;
    let mut done = response_object(&request.model, admitted.now_ms, prompt, bound, output);
    if searched > 0 {
        with_web_search(&mut done, searched);
    }
    done["conversation"] = conversation_of(request.conversation.as_ref());
    if !request.stream {
        tokio::time::sleep(Duration::from_millis(delay_ms * output)).await;
        drop((admitted.slot, busy));
        return (headers, Json(done)).into_response();
    }
    let stream = SseStream {
        events: response_events(done, output),
        token_delay_ms: delay_ms,
        drop_after,
        guards: (admitted.slot, busy),
    };
    sse_response(stream, headers)
}

/// The response's `conversation`: `{"id": ...}` of the request's, else `null`
/// (<https://platform.openai.com/docs/api-reference/responses/object>).
fn conversation_of(requested: Option<&serde_json::Value>) -> serde_json::Value {
    let id = match requested {
        Some(serde_json::Value::String(id)) => Some(id.as_str()),
        Some(object) => object.get("id").and_then(serde_json::Value::as_str),
        None => None,
    };
    id.map_or(serde_json::Value::Null, |id| serde_json::json!({"id": id}))
}

/// A completed `response` object with its usage; its id unique in the process
/// (two answers of one millisecond never share one).
fn response_object(model: &str, now_ms: u64, prompt: u64, bound: u64, output: u64) -> serde_json::Value {
    let incomplete = output == bound;
    let seq = server::next_object_seq();
    serde_json::json!({
        "id": format!("resp_sim{now_ms}_{seq}"), "object": "response", "created_at": now_ms / 1000,
        "status": if incomplete { "incomplete" } else { "completed" },
        "incomplete_details": if incomplete { serde_json::json!({"reason": "max_output_tokens"}) } else { serde_json::Value::Null },
        "model": model, "error": null, "instructions": null, "max_output_tokens": bound,
        "parallel_tool_calls": true, "tool_choice": "auto", "tools": [], "text": {"format": {"type": "text"}},
        "output": [{
            "type": "message", "id": format!("msg_sim{now_ms}"), "status": "completed", "role": "assistant",
            "content": [{"type": "output_text", "text": prompt::synthesize(output), "annotations": []}],
        }],
        "usage": {
            "input_tokens": prompt, "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": output, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt + output,
        },
    })
}

/// `done` after one web search: its call first in the output, its `searched`
/// content tokens in the usage's input (billed as input,
/// [`hosted_tools::WEB_SEARCH_CONTENT_TOKENS`]).
fn with_web_search(done: &mut serde_json::Value, searched: u64) {
    let id = done["id"]
        .as_str()
        .unwrap_or_default()
        .trim_start_matches("resp_")
        .to_owned();
    let output = done["output"].as_array_mut().expect("a response has output");
    output.insert(0, hosted_tools::web_search_call(&id));
    let usage = &mut done["usage"];
    for field in ["input_tokens", "total_tokens"] {
        usage[field] = (usage[field].as_u64().unwrap_or(0) + searched).into();
    }
}

/// The events of a streamed response, each named by its `type` and numbered:
/// created, the output item and part, one text delta per token, their ends, and
/// `response.completed` (or `response.incomplete`) with the usage.
fn response_events(done: serde_json::Value, output: u64) -> Vec<(Bytes, bool)> {
    // The message, after any hosted tool's call.
    let (index, item) = (done["output"].as_array().into_iter().flatten().enumerate())
        .find(|(_, item)| item["type"] == "message")
        .map(|(i, item)| (i, item.clone()))
        .expect("a response has a message");
    let item_id = item["id"].clone();
    let mut started = done.clone();
    started["status"] = "in_progress".into();
    started["output"] = serde_json::json!([]);
    started["usage"] = serde_json::Value::Null;
    let mut empty_item = item.clone();
    empty_item["status"] = "in_progress".into();
    empty_item["content"] = serde_json::json!([]);
    let empty_part = serde_json::json!({"type": "output_text", "text": "", "annotations": []});
    let text = item["content"][0]["text"].clone();
    let part = item["content"][0].clone();
    let end = if done["status"] == "completed" {
        "response.completed"
    } else {
        "response.incomplete"
    };
    let mut bodies: Vec<(serde_json::Value, bool)> = vec![
        (
            serde_json::json!({"type": "response.created", "response": started}),
            false,
        ),
        (
            serde_json::json!({"type": "response.in_progress", "response": started}),
            false,
        ),
        (
            serde_json::json!({"type": "response.output_item.added", "output_index": index, "item": empty_item}),
            false,
        ),
        (
            serde_json::json!({"type": "response.content_part.added", "item_id": item_id, "output_index": index, "content_index": 0, "part": empty_part}),
            false,
        ),
    ];
    for word in output_words(output) {
        let delta = serde_json::json!({"type": "response.output_text.delta", "item_id": item_id, "output_index": index, "content_index": 0, "delta": word});
        bodies.push((delta, true));
    }
    bodies.extend([
        (
            serde_json::json!({"type": "response.output_text.done", "item_id": item_id, "output_index": index, "content_index": 0, "text": text}),
            false,
        ),
        (
            serde_json::json!({"type": "response.content_part.done", "item_id": item_id, "output_index": index, "content_index": 0, "part": part}),
            false,
        ),
        (serde_json::json!({"type": "response.output_item.done", "output_index": index, "item": item}), false),
        (serde_json::json!({"type": end, "response": done}), false),
    ]);
    bodies
        .into_iter()
        .enumerate()
        .map(|(sequence, (mut event, is_token))| {
            event["sequence_number"] = sequence.into();
            let name = event["type"].as_str().expect("named").to_owned();
            (sse_event(Some(&name), &event.to_string()), is_token)
        })
        .collect()
}

/// `GET /v1/models`: the models the simulator serves.
pub async fn models(State(provider): State<Arc<ProviderServer>>) -> Json<serde_json::Value> {
    let data: Vec<serde_json::Value> = provider
        .control
        .models()
        .iter()
        .map(|id| serde_json::json!({"id": id, "object": "model", "created": 0, "owned_by": "provider-sim"}))
        .collect();
    Json(serde_json::json!({"object": "list", "data": data}))
}

/// `POST /v1/conversations`: a new conversation's object
/// (<https://platform.openai.com/docs/api-reference/conversations/create>); the
/// simulator keeps no items, so any conversation id continues.
pub async fn create_conversation(body: Bytes) -> Response {
    let metadata = match serde_json::from_slice::<serde_json::Value>(&body) {
        Ok(serde_json::Value::Object(request)) => request.get("metadata").cloned().unwrap_or_default(),
        _ => return bad_request("bad request body: a JSON object is expected".to_owned()),
    };
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let seq = server::next_object_seq();
    Json(serde_json::json!({
        "id": format!("conv_sim{now_ms}_{seq}"), "object": "conversation",
        "created_at": now_ms / 1000, "metadata": metadata,
    }))
    .into_response()
}
