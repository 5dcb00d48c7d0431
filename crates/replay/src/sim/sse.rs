//! Server-sent-event bodies: one event per token, emitted at the simulated
//! model's pace, holding the call's slot until the stream ends.

use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, HeaderValue};
use axum::response::Response;

use crate::sim::control::Busy;
use crate::sim::server::Slot;

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
