//! A model call's way through the simulator, shared by both wire formats: the
//! armed fault's turn, admission by the [`Ledger`](crate::sim::provider::Ledger)
//! (charged as the enforced profile charges), and the answer to a refusal in the
//! provider's shape.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;

use crate::sim::errors::{error, retry_headers, Wire};
use crate::sim::faults::{dropped, fault_response, FaultMode};
use crate::sim::profile::{CallShape, LimitState, ProfileName};
use crate::sim::provider::{LimitKind, Remaining, Verdict};
use crate::sim::server::{ProviderServer, Slot};

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

/// When the ledger's rolling window is empty again: the last admission plus the window.
pub fn full_reset_ms(provider: &ProviderServer, now_ms: u64) -> u64 {
    let ledger = provider.ledger.lock().expect("ledger lock");
    let last = ledger.admissions().last().map_or(0, |a| a.at_unix_ms);
    (last + ledger.limits().window_ms).saturating_sub(now_ms)
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
