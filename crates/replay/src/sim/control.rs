//! What the provider wire formats ([`crate::sim_openai`], [`crate::sim_anthropic`])
//! share: the model catalogue, the upstream key, admission through the [`Ledger`]
//! (`crate::provider::Ledger`), the calls in flight and their peak, the fault switch
//! that makes the simulator fail on demand, and server-sent-event bodies that emit
//! one event per token at the simulated model's pace.
//!
//! Control routes (not provider API): `GET /sim/stats`, `DELETE /sim/stats` (resets
//! the peak and the call counters, not the ledger), `POST /sim/faults` (arms a
//! fault), `DELETE /sim/faults` (disarms). docs/provider-sim.md describes them.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;

use crate::provider::{count_tokens, LimitKind, Remaining, Verdict};
use crate::provider_server::{ProviderServer, Slot, MAX_TOKENS_DEFAULT, MAX_TOKENS_MAX};
use crate::sim_profile::{CallShape, LimitState, ProfileName};

/// The models the simulator serves when none are configured: the replay's model and
/// the names the gateway's tests and examples use. Any other name gets a 404, as a
/// provider answers a model it does not have.
pub const MODELS_DEFAULT: [&str; 6] = [
    "sim-model",
    "gpt-4o-mini",
    "gpt-4o",
    "text-embedding-3-small",
    "claude-haiku-4-5",
    "claude-sonnet-4-5",
];
/// The most models a simulator serves: the catalogue is scanned on every call.
pub const MODELS_MAX: usize = 256;
/// The most calls one armed fault may cover: a bound on a counter set over HTTP.
pub const FAULT_COUNT_MAX: u64 = 1_000_000;
/// The longest retry hint a status fault may carry: one day.
pub const FAULT_RETRY_AFTER_MS_MAX: u64 = 86_400_000;
/// The longest a fault may be armed for by time: one hour.
pub const FAULT_FOR_MS_MAX: u64 = 3_600_000;
/// The most events a stream emits before a `drop` fault cuts it.
pub const FAULT_AFTER_EVENTS_MAX: u64 = 1_000_000;

/// The two wire formats, for the error shape and the key header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wire {
    /// `Authorization: Bearer`, `{"error":{"message","type","param","code"}}`.
    Openai,
    /// `x-api-key`, `{"type":"error","error":{"type","message"}}`.
    Anthropic,
}

/// What an armed fault does to the calls it covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case", tag = "mode")]
pub enum FaultMode {
    /// Answer this status (4xx or 5xx) in the provider's error shape; a 429 carries
    /// `retry_after_ms` as `retry-after-ms` and `retry-after`.
    Status {
        /// The HTTP status.
        status: u16,
        /// The retry hint of a 429.
        #[serde(default)]
        retry_after_ms: u64,
    },
    /// Accept the call and never answer: the caller's timeout must end it.
    Hang,
    /// Streams: emit `after_events` events, then cut the connection without the
    /// stream's end. Other calls: cut it before the body.
    Drop {
        /// Events sent before the cut.
        #[serde(default)]
        after_events: u64,
    },
}

/// The body of `POST /sim/faults` (unknown fields are ignored: serde cannot deny
/// them beside a flattened field).
#[derive(Debug, Clone, Deserialize)]
pub struct FaultRequest {
    /// What to do.
    #[serde(flatten)]
    pub mode: FaultMode,
    /// How many of the next model calls it covers (with `for_ms`: at most).
    #[serde(default)]
    pub count: Option<u64>,
    /// Covers every model call for this long from now (a provider failing for a
    /// while): the benchmark of a pool's failover arms one deployment this way.
    #[serde(default)]
    pub for_ms: Option<u64>,
    /// Only calls for this model; all models when absent.
    #[serde(default)]
    pub model: Option<String>,
}

#[derive(Debug, Clone)]
struct ArmedFault {
    mode: FaultMode,
    left: u64,
    /// `Some`: the fault ends then, whatever is left.
    until: Option<std::time::Instant>,
    model: Option<String>,
}

/// The simulator's own state beside the ledger.
#[derive(Debug)]
pub struct SimControl {
    models: Vec<String>,
    api_key: Option<String>,
    fault: Mutex<Option<ArmedFault>>,
    in_flight: AtomicU64,
    in_flight_max: AtomicU64,
    calls: AtomicU64,
    faults_injected: AtomicU64,
    /// Anthropic's prompt cache.
    pub(crate) prompt_cache: crate::sim_cache::PromptCache,
}

impl Default for SimControl {
    fn default() -> Self {
        Self::new(MODELS_DEFAULT.iter().map(|m| (*m).to_owned()).collect(), None)
    }
}

impl SimControl {
    /// Serves `models`; requires `api_key` from callers when set.
    pub fn new(models: Vec<String>, api_key: Option<String>) -> Self {
        assert!(
            !models.is_empty() && models.len() <= MODELS_MAX,
            "1..=MODELS_MAX models"
        );
        Self {
            models,
            api_key,
            fault: Mutex::new(None),
            in_flight: AtomicU64::new(0),
            in_flight_max: AtomicU64::new(0),
            calls: AtomicU64::new(0),
            faults_injected: AtomicU64::new(0),
            prompt_cache: crate::sim_cache::PromptCache::default(),
        }
    }

    /// The models served.
    pub fn models(&self) -> &[String] {
        &self.models
    }

    /// The most model calls served at once since the start or the last reset.
    pub fn in_flight_max(&self) -> u64 {
        self.in_flight_max.load(Ordering::SeqCst)
    }

    /// Checks the caller's key (when one is required) and the model, and takes the
    /// armed fault's next turn; `Err` is the answer to send instead.
    pub fn check(&self, wire: Wire, headers: &HeaderMap, model: &str) -> Result<Option<FaultMode>, Box<Response>> {
        self.authorize(wire, headers, model)?;
        self.calls.fetch_add(1, Ordering::SeqCst);
        Ok(self.take_fault(model))
    }

    /// Checks the caller's key (when one is required) and the model.
    pub fn authorize(&self, wire: Wire, headers: &HeaderMap, model: &str) -> Result<(), Box<Response>> {
        if let Some(key) = &self.api_key {
            let sent = match wire {
                Wire::Openai => headers
                    .get("authorization")
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.strip_prefix("Bearer ")),
                Wire::Anthropic => headers.get("x-api-key").and_then(|v| v.to_str().ok()),
            };
            if sent != Some(key.as_str()) {
                return Err(Box::new(error(
                    wire,
                    StatusCode::UNAUTHORIZED,
                    "invalid api key".to_owned(),
                )));
            }
        }
        if !self.models.iter().any(|m| m == model) {
            let message = format!("The model `{model}` does not exist");
            return Err(Box::new(error(wire, StatusCode::NOT_FOUND, message)));
        }
        Ok(())
    }

    /// The armed fault's next turn for a call of `model`, if it covers it.
    fn take_fault(&self, model: &str) -> Option<FaultMode> {
        let mut armed = self.fault.lock().expect("fault lock");
        let fault = armed.as_mut()?;
        if fault.until.is_some_and(|until| std::time::Instant::now() >= until) {
            *armed = None;
            return None;
        }
        if fault.model.as_deref().is_some_and(|m| m != model) {
            return None;
        }
        let mode = fault.mode;
        fault.left -= 1;
        if fault.left == 0 {
            *armed = None;
        }
        self.faults_injected.fetch_add(1, Ordering::SeqCst);
        Some(mode)
    }

    /// Counts a model call in flight until the guard drops.
    pub fn busy(self: &Arc<Self>) -> Busy {
        let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.in_flight_max.fetch_max(now, Ordering::SeqCst);
        Busy(Arc::clone(self))
    }
}

/// A model call in flight at the simulator (admitted or being refused): the count
/// `/sim/stats` reports as `in_flight_calls` and its peak as `in_flight_max`.
#[derive(Debug)]
pub struct Busy(Arc<SimControl>);

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The answer to a fault that ends the call before it reaches the ledger, or
/// `None` for `drop` on a stream (the stream applies it).
pub async fn fault_response(wire: Wire, mode: FaultMode) -> Option<Response> {
    match mode {
        FaultMode::Status { status, retry_after_ms } => {
            let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            let mut response = error(wire, status, format!("simulated fault: status {}", status.as_u16()));
            if status == StatusCode::TOO_MANY_REQUESTS {
                retry_headers(response.headers_mut(), retry_after_ms.max(1));
            }
            Some(response)
        }
        FaultMode::Hang => std::future::pending().await,
        FaultMode::Drop { .. } => None,
    }
}

/// Checks the call ([`SimControl::check`]) and plays the armed fault, if any:
/// `Ok(Some(n))` cuts a stream after `n` events, `Ok(None)` serves the call as
/// usual, `Err` is the answer to send instead (a status, a hang, or a call that
/// is not streamed cut before its body).
pub async fn play_fault(
    provider: &ProviderServer,
    wire: Wire,
    headers: &HeaderMap,
    model: &str,
    stream: bool,
) -> Result<Option<u64>, Box<Response>> {
    match provider.control.check(wire, headers, model)? {
        Some(FaultMode::Drop { after_events }) if stream => Ok(Some(after_events)),
        Some(FaultMode::Drop { .. }) => Err(Box::new(dropped(wire))),
        Some(mode) => Err(Box::new(fault_response(wire, mode).await.expect("not a drop"))),
        None => Ok(None),
    }
}

/// A call that is not streamed, cut before its body (the fault `drop`); OpenAI's
/// answers carry their JSON content type first.
fn dropped(wire: Wire) -> Response {
    let mut response = Response::new(dropped_body(Vec::new()));
    if wire == Wire::Openai {
        response
            .headers_mut()
            .insert("content-type", HeaderValue::from_static("application/json"));
    }
    response
}

/// The body that cuts the connection after `chunks` (the fault `drop`).
pub fn dropped_body(chunks: Vec<Bytes>) -> Body {
    let cut = std::io::Error::new(std::io::ErrorKind::ConnectionAborted, "simulated drop");
    let items = chunks.into_iter().map(Ok).chain(std::iter::once(Err(cut)));
    Body::from_stream(futures_util::stream::iter(items))
}

/// `retry-after` (whole seconds, rounded up) and `retry-after-ms`: both SDKs read both.
pub fn retry_headers(headers: &mut HeaderMap, retry_after_ms: u64) {
    headers.insert("retry-after", HeaderValue::from(retry_after_ms.div_ceil(1000)));
    headers.insert("retry-after-ms", HeaderValue::from(retry_after_ms));
}

/// An error in the provider's shape. OpenAI: <https://platform.openai.com/docs/guides/error-codes>
/// (`{"error": {"message", "type", "param", "code"}}`); Anthropic:
/// <https://docs.anthropic.com/en/api/errors> ("errors are always returned as JSON,
/// with a top-level `error` object that always includes a `type` and `message`").
pub fn error(wire: Wire, status: StatusCode, message: String) -> Response {
    let body = match wire {
        Wire::Openai => {
            let (kind, code) = match status {
                StatusCode::UNAUTHORIZED => ("invalid_request_error", "invalid_api_key"),
                StatusCode::NOT_FOUND => ("invalid_request_error", "model_not_found"),
                StatusCode::TOO_MANY_REQUESTS => ("requests", "rate_limit_exceeded"),
                s if s.is_server_error() => ("server_error", "server_error"),
                _ => ("invalid_request_error", "invalid_request"),
            };
            serde_json::json!({"error": {"message": message, "type": kind, "param": null, "code": code}})
        }
        Wire::Anthropic => {
            let kind = match status.as_u16() {
                401 => "authentication_error",
                403 => "permission_error",
                404 => "not_found_error",
                413 => "request_too_large",
                429 => "rate_limit_error",
                529 => "overloaded_error",
                s if s >= 500 => "api_error",
                _ => "invalid_request_error",
            };
            serde_json::json!({"type": "error", "error": {"type": kind, "message": message}})
        }
    };
    (status, Json(body)).into_response()
}

/// An admitted call: its concurrency slot, what is left, and when it was admitted.
pub struct Admitted {
    /// Releases the slot when dropped.
    pub slot: Slot,
    /// The rolling limits after this call.
    pub remaining: Remaining,
    /// The admission instant, Unix ms.
    pub now_ms: u64,
    /// The enforced provider profile's rate-limit headers (none for the sliding log).
    pub profile_headers: Vec<(String, String)>,
}

/// Why the ledger refused a call.
pub enum Refused {
    /// 429: the limit, the hint, what is left, and the profile's own answer (its
    /// headers and body) when a provider profile is enforced.
    Throttled(LimitKind, u64, Remaining, Option<ProfileAnswer>),
    /// 400: the charge exceeds the whole token limit.
    TooLarge(u64),
}

/// A provider profile's rate-limit headers and, on a 429, its body
/// (docs/provider-profiles.md): what the simulated provider answers in place of
/// the sliding log's generic ones.
pub struct ProfileAnswer {
    /// Headers in the provider's names; they replace any of the same name.
    pub headers: Vec<(String, String)>,
    /// The 429 body in the provider's shape (`Null` on an admission).
    pub body: serde_json::Value,
}

impl Refused {
    /// What is left of the rolling limits, for the rate-limit headers of a 429.
    pub fn remaining(&self) -> Option<Remaining> {
        match self {
            Refused::Throttled(_, _, remaining, _) => Some(*remaining),
            Refused::TooLarge(_) => None,
        }
    }
}

/// Adds a profile's `headers`, replacing any of the same name.
pub fn put_profile_headers(target: &mut HeaderMap, headers: &[(String, String)]) {
    for (name, value) in headers {
        if let (Ok(name), Ok(value)) = (
            axum::http::HeaderName::try_from(name.as_str()),
            HeaderValue::try_from(value.as_str()),
        ) {
            target.insert(name, value);
        }
    }
}

/// The limit a profile's 429 names: the refused kind's exhausted limit, else its first.
fn refused_state(states: &[LimitState], limit: LimitKind) -> Option<LimitState> {
    let of_kind = |s: &&LimitState| s.dimension.is_requests() == (limit == LimitKind::Requests);
    let mut candidates = states.iter().filter(of_kind);
    let first = candidates.clone().next().copied();
    candidates.find(|s| s.remaining == 0).copied().or(first)
}

/// Admits a call of `prompt_tokens` bounded by `max_tokens` that writes
/// `output_tokens`, charged as the enforced profile's provider charges it (the
/// sliding log: by the provider's accounting) and busy for the model's time per
/// output token.
pub fn admit(
    provider: &Arc<ProviderServer>,
    model: &str,
    prompt_tokens: u64,
    max_tokens: u64,
    output_tokens: u64,
) -> Result<Admitted, Refused> {
    admit_cached(provider, model, prompt_tokens, 0, max_tokens, output_tokens)
}

/// [`admit`] for a prompt of which `cache_read_tokens` are read from the prompt
/// cache (Anthropic's profile does not charge them on its input limit).
pub fn admit_cached(
    provider: &Arc<ProviderServer>,
    model: &str,
    prompt_tokens: u64,
    cache_read_tokens: u64,
    max_tokens: u64,
    output_tokens: u64,
) -> Result<Admitted, Refused> {
    let limits = provider.limits();
    let call = CallShape {
        prompt_tokens,
        cache_read_tokens,
        max_tokens,
        output_tokens,
        best_of: 1,
    };
    let busy_ms = limits.ms_per_output_token * output_tokens;
    let now_ms = provider.clock.now_unix_ms();
    let (verdict, states, profile) = {
        let mut ledger = provider.ledger.lock().expect("ledger lock");
        let verdict = ledger.admit_call(now_ms, &call, busy_ms);
        (verdict, ledger.limit_states(now_ms), *ledger.profile())
    };
    // The sliding log keeps the generic headers; a provider profile answers in its own.
    let profiled = profile.name != ProfileName::Sliding;
    let profile_headers = if profiled {
        profile.headers(now_ms, &states)
    } else {
        Vec::new()
    };
    match verdict {
        Verdict::Admitted { ticket, remaining } => Ok(Admitted {
            slot: Slot {
                provider: Arc::clone(provider),
                ticket,
            },
            remaining,
            now_ms,
            profile_headers,
        }),
        Verdict::Throttled {
            limit,
            retry_after_ms,
            remaining,
        } => {
            let answer = (profiled && limit != LimitKind::Concurrency)
                .then(|| refused_state(&states, limit))
                .flatten()
                .map(|state| {
                    let (mut headers, body) = profile.throttled(model, &state, retry_after_ms);
                    headers.splice(0..0, profile_headers);
                    ProfileAnswer { headers, body }
                });
            Err(Refused::Throttled(limit, retry_after_ms, remaining, answer))
        }
        Verdict::TooLarge { charge } => Err(Refused::TooLarge(charge)),
    }
}

/// The message of a 429 from the ledger.
pub fn throttled_message(limit: LimitKind, retry_after_ms: u64) -> String {
    let kind = serde_json::to_value(limit).expect("serializes");
    format!(
        "rate limit reached for {}; retry after {retry_after_ms} ms",
        kind.as_str().unwrap_or("")
    )
}

/// A message's content in both wire formats: a string, or blocks of which the text
/// ones count (`{"type": "text" | "input_text", "text": ...}`) and the images
/// (`crate::sim_vision`); other blocks (files) count nothing in the simulator.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Content {
    /// Plain text.
    Text(String),
    /// Content blocks.
    Blocks(Vec<Block>),
}

/// One content block; only its text is read.
#[derive(Debug, Clone, Deserialize)]
pub struct Block {
    /// The block's kind (`text`, `input_text`, `image_url`, ...).
    #[serde(rename = "type")]
    pub kind: String,
    /// The text of a text block.
    #[serde(default)]
    pub text: Option<String>,
    /// An OpenAI image's `image_url`: an object in chat, a string in Responses.
    #[serde(default)]
    pub image_url: Option<serde_json::Value>,
    /// Responses' `detail`, beside its `image_url`.
    #[serde(default)]
    pub detail: Option<String>,
    /// An Anthropic image's `source`.
    #[serde(default)]
    pub source: Option<serde_json::Value>,
    /// Anthropic's cache breakpoint (`crate::sim_cache`).
    #[serde(default)]
    pub cache_control: Option<serde_json::Value>,
}

impl Block {
    /// Whether the block is an image of either wire format.
    pub fn is_image(&self) -> bool {
        matches!(self.kind.as_str(), "image_url" | "input_image" | "image")
    }

    /// The tokens `model` bills for this block when it is an image, else 0.
    pub fn image_tokens(&self, model: &str) -> u64 {
        if !self.is_image() {
            return 0;
        }
        let part = serde_json::json!({"image_url": self.image_url, "detail": self.detail, "source": self.source});
        crate::sim_vision::image_tokens(model, &part)
    }
}

impl Content {
    /// The texts the provider counts.
    pub fn texts(&self) -> Vec<&str> {
        match self {
            Content::Text(text) => vec![text.as_str()],
            Content::Blocks(blocks) => blocks.iter().filter_map(|b| b.text.as_deref()).collect(),
        }
    }

    /// The tokens of its images, as `model` bills them.
    pub fn image_tokens(&self, model: &str) -> u64 {
        match self {
            Content::Text(_) => 0,
            Content::Blocks(blocks) => blocks.iter().map(|b| b.image_tokens(model)).sum(),
        }
    }
}

/// Checks an output bound: 1..=[`MAX_TOKENS_MAX`], as providers bound output.
pub fn output_bound(name: &str, value: Option<u64>) -> Result<u64, String> {
    let bound = value.unwrap_or(MAX_TOKENS_DEFAULT);
    if (1..=MAX_TOKENS_MAX).contains(&bound) {
        Ok(bound)
    } else {
        Err(format!("{name} must be 1..={MAX_TOKENS_MAX}, got {bound}"))
    }
}

/// The provider's count of a prompt made of `texts`: [`count_tokens`] of each.
pub fn prompt_tokens<'a>(texts: impl IntoIterator<Item = &'a str>) -> u64 {
    texts.into_iter().map(count_tokens).sum()
}

/// The model's output of `tokens` tokens cut into its tokens: the streamed deltas
/// join to the text a non-streamed call answers.
pub fn output_words(tokens: u64) -> Vec<String> {
    let text = crate::prompt::synthesize(tokens);
    let step = usize::try_from(crate::provider::BYTES_PER_TOKEN).expect("small");
    (0..text.len())
        .step_by(step)
        .map(|i| text[i..i + step].to_owned())
        .collect()
}

/// One server-sent event: an optional `event:` name and its `data:` line.
pub fn sse_event(name: Option<&str>, data: &str) -> Bytes {
    let mut text = String::with_capacity(data.len() + 32);
    if let Some(name) = name {
        text.push_str("event: ");
        text.push_str(name);
        text.push('\n');
    }
    text.push_str("data: ");
    text.push_str(data);
    text.push_str("\n\n");
    Bytes::from(text)
}

/// A stream's events in order, each with whether the model's per-token time
/// passes before it (the token deltas), and what the stream holds until it ends.
pub struct SseStream {
    /// The events, each flagged when it carries a token.
    pub events: Vec<(Bytes, bool)>,
    /// The model's time per output token, in ms.
    pub token_delay_ms: u64,
    /// Cut the connection after this many events (the fault `drop`).
    pub drop_after: Option<u64>,
    /// Held until the body ends or the client hangs up: the ledger slot and the
    /// in-flight count are released then, as the provider frees a cancelled call.
    pub guards: (Slot, Busy),
}

/// The `text/event-stream` response of `stream`: events are sent as the model
/// writes them, so a client measures time to first token.
pub fn sse_response(stream: SseStream, headers: HeaderMap) -> Response {
    type State = (std::vec::IntoIter<(Bytes, bool)>, u64, SseStream);
    let SseStream {
        events,
        token_delay_ms,
        drop_after,
        guards,
    } = stream;
    let rest = SseStream {
        events: Vec::new(),
        token_delay_ms,
        drop_after,
        guards,
    };
    let state: State = (events.into_iter(), 0, rest);
    let body = futures_util::stream::unfold(state, |(mut events, sent, rest)| async move {
        if rest.drop_after == Some(sent) {
            let cut = std::io::Error::new(std::io::ErrorKind::ConnectionAborted, "simulated drop");
            return Some((Err(cut), (Vec::new().into_iter(), u64::MAX, rest)));
        }
        let (event, is_token) = events.next()?;
        if is_token && rest.token_delay_ms > 0 {
            tokio::time::sleep(Duration::from_millis(rest.token_delay_ms)).await;
        }
        Some((Ok::<Bytes, std::io::Error>(event), (events, sent + 1, rest)))
    });
    let mut response = Response::new(Body::from_stream(body));
    *response.headers_mut() = headers;
    response
        .headers_mut()
        .insert("content-type", HeaderValue::from_static("text/event-stream"));
    response
        .headers_mut()
        .insert("cache-control", HeaderValue::from_static("no-cache"));
    response
}

/// A duration as OpenAI writes `x-ratelimit-reset-*` ("1s", "6m0s", "12ms").
pub fn openai_duration(ms: u64) -> String {
    if ms < 1_000 {
        format!("{ms}ms")
    } else if ms < 60_000 {
        let text = format!("{}.{:03}", ms / 1_000, ms % 1_000);
        format!("{}s", text.trim_end_matches('0').trim_end_matches('.'))
    } else {
        let seconds = ms.div_ceil(1_000);
        format!("{}m{}s", seconds / 60, seconds % 60)
    }
}

/// A Unix time in ms as RFC 3339 UTC, as Anthropic writes `anthropic-ratelimit-*-reset`.
pub fn rfc3339(unix_ms: u64) -> String {
    let seconds = unix_ms / 1_000;
    let days = i64::try_from(seconds / 86_400).expect("a date fits i64");
    let (year, month, day) = civil_from_days(days);
    let of_day = seconds % 86_400;
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        of_day / 3_600,
        of_day % 3_600 / 60,
        of_day % 60
    )
}

/// Howard Hinnant's `civil_from_days`: the proleptic Gregorian date of a day count
/// since 1970-01-01.
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = u32::try_from(doy - (153 * mp + 2) / 5 + 1).expect("1..=31");
    let month = u32::try_from(if mp < 10 { mp + 3 } else { mp - 9 }).expect("1..=12");
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// When the ledger's rolling window is empty again: the last admission plus the window.
pub fn full_reset_ms(provider: &ProviderServer, now_ms: u64) -> u64 {
    let ledger = provider.ledger.lock().expect("ledger lock");
    let last = ledger.admissions().last().map_or(0, |a| a.at_unix_ms);
    (last + ledger.limits().window_ms).saturating_sub(now_ms)
}

/// `GET /sim/stats`: the ledger's counts and calls in flight, and the simulator's
/// calls in flight with their peak.
pub async fn stats(State(provider): State<Arc<ProviderServer>>) -> Json<serde_json::Value> {
    let control = &provider.control;
    let ledger = provider.ledger.lock().expect("ledger lock");
    Json(serde_json::json!({
        "counts": ledger.counts(),
        "in_flight": ledger.in_flight(),
        "in_flight_calls": control.in_flight.load(Ordering::SeqCst),
        "in_flight_max": control.in_flight_max.load(Ordering::SeqCst),
        "calls": control.calls.load(Ordering::SeqCst),
        "faults_injected": control.faults_injected.load(Ordering::SeqCst),
    }))
}

/// `DELETE /sim/stats`: the peak starts again from the calls in flight now, the
/// call counters from 0 (the ledger keeps its window: limits are not reset).
pub async fn reset_stats(State(provider): State<Arc<ProviderServer>>) -> StatusCode {
    let control = &provider.control;
    control
        .in_flight_max
        .store(control.in_flight.load(Ordering::SeqCst), Ordering::SeqCst);
    control.calls.store(0, Ordering::SeqCst);
    control.faults_injected.store(0, Ordering::SeqCst);
    StatusCode::NO_CONTENT
}

/// `POST /sim/faults`: arms a fault for the next `count` model calls, or for
/// every call during `for_ms`.
pub async fn arm_fault(State(provider): State<Arc<ProviderServer>>, body: Bytes) -> Response {
    let request: FaultRequest = match serde_json::from_slice(&body) {
        Ok(request) => request,
        Err(e) => return error(Wire::Openai, StatusCode::BAD_REQUEST, format!("bad fault: {e}")),
    };
    let valid = match request.mode {
        FaultMode::Status { status, retry_after_ms } => {
            (400..=599).contains(&status) && retry_after_ms <= FAULT_RETRY_AFTER_MS_MAX
        }
        FaultMode::Hang => true,
        FaultMode::Drop { after_events } => after_events <= FAULT_AFTER_EVENTS_MAX,
    };
    let count = match (request.count, request.for_ms) {
        (Some(count), _) => count,
        (None, Some(_)) => FAULT_COUNT_MAX,
        (None, None) => 0,
    };
    let for_ms_valid = request.for_ms.is_none_or(|ms| (1..=FAULT_FOR_MS_MAX).contains(&ms));
    if !valid || !for_ms_valid || !(1..=FAULT_COUNT_MAX).contains(&count) {
        let message = format!(
            "a fault needs count 1..={FAULT_COUNT_MAX} (or for_ms 1..={FAULT_FOR_MS_MAX}), a status 400..=599, retry_after_ms <= {FAULT_RETRY_AFTER_MS_MAX}, after_events <= {FAULT_AFTER_EVENTS_MAX}"
        );
        return error(Wire::Openai, StatusCode::BAD_REQUEST, message);
    }
    *provider.control.fault.lock().expect("fault lock") = Some(ArmedFault {
        mode: request.mode,
        left: count,
        until: (request.for_ms).map(|ms| std::time::Instant::now() + Duration::from_millis(ms)),
        model: request.model,
    });
    StatusCode::NO_CONTENT.into_response()
}

/// `DELETE /sim/faults`: disarms.
pub async fn disarm_fault(State(provider): State<Arc<ProviderServer>>) -> StatusCode {
    *provider.control.fault.lock().expect("fault lock") = None;
    StatusCode::NO_CONTENT
}

/// Answers a refusal of the ledger in the provider's shape, with `headers` (the
/// provider's rate-limit headers) and, on 429, the retry hints.
pub fn refused(wire: Wire, refusal: Refused, limit_tpm: u64, mut headers: HeaderMap) -> Response {
    let mut response = match refusal {
        Refused::Throttled(_, retry_after_ms, _, Some(answer)) => {
            let mut response = (StatusCode::TOO_MANY_REQUESTS, Json(answer.body)).into_response();
            retry_headers(&mut headers, retry_after_ms);
            response.headers_mut().extend(headers.drain());
            put_profile_headers(response.headers_mut(), &answer.headers);
            return response;
        }
        Refused::Throttled(limit, retry_after_ms, _, None) => {
            let mut response = error(
                wire,
                StatusCode::TOO_MANY_REQUESTS,
                throttled_message(limit, retry_after_ms),
            );
            if wire == Wire::Openai {
                // OpenAI names the limit in `type`: "requests" or "tokens".
                let kind = serde_json::to_value(limit).expect("serializes");
                let body = serde_json::json!({"error": {"message": throttled_message(limit, retry_after_ms),
                    "type": kind, "param": null, "code": "rate_limit_exceeded"}});
                *response.body_mut() = Body::from(body.to_string());
            }
            retry_headers(&mut headers, retry_after_ms);
            response.headers_mut().extend(headers.drain());
            return response;
        }
        Refused::TooLarge(charge) => error(
            wire,
            StatusCode::BAD_REQUEST,
            format!("request too large: {charge} tokens charged, the limit is {limit_tpm} per window"),
        ),
    };
    response.headers_mut().extend(headers.drain());
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reset_formats_follow_the_providers() {
        assert_eq!(openai_duration(12), "12ms");
        assert_eq!(openai_duration(1_000), "1s");
        assert_eq!(openai_duration(17_280), "17.28s");
        assert_eq!(openai_duration(360_000), "6m0s");
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(1_709_251_199_000), "2024-02-29T23:59:59Z");
        assert_eq!(rfc3339(1_764_057_600_500), "2025-11-25T08:00:00Z");
    }
}
