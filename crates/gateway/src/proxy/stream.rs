//! A streamed answer passed to the client event by event (docs/gateway.md,
//! "Forwarding").

use std::time::Duration;

use bytes::Bytes;
use futures_util::stream::{self, Stream};

use super::passthrough;
use crate::admission::CallLease;
use crate::wire::call::Endpoint;
use crate::wire::error::Format;
use crate::wire::sse;
use crate::wire::usage::{EventAction, Usage};
use crate::wire::{anthropic, openai};

/// How a stream's usage is read, per provider.
enum StreamReader {
    OpenAi(openai::StreamUsage),
    Anthropic(anthropic::StreamUsage),
}

impl StreamReader {
    fn on_event(&mut self, event: &[u8]) -> EventAction {
        match self {
            StreamReader::OpenAi(reader) => reader.on_event(event),
            StreamReader::Anthropic(reader) => reader.on_event(event),
        }
    }

    /// The final usage, once the stream ended normally.
    fn final_usage(&self) -> Option<Usage> {
        match self {
            StreamReader::OpenAi(reader) => reader.usage,
            StreamReader::Anthropic(reader) => reader.usage.filter(|_| reader.final_seen),
        }
    }
}

struct StreamState {
    body: hyper::body::Incoming,
    splitter: sse::Splitter,
    reader: StreamReader,
    lease: CallLease,
    idle_timeout: Duration,
    ended: bool,
}

/// The client's stream: each event forwarded the moment it is whole; the usage
/// read on the way; the lease settled when the stream ends, or kept reserved
/// when the client leaves first (the state, and its lease, drop with the body).
pub fn event_stream(
    body: hyper::body::Incoming,
    endpoint: Endpoint,
    drop_usage_chunk: bool,
    lease: CallLease,
    idle_timeout: Duration,
) -> impl Stream<Item = Result<Bytes, std::io::Error>> + Send + 'static {
    let reader = match endpoint.format() {
        Format::OpenAi => StreamReader::OpenAi(openai::StreamUsage::new(endpoint, drop_usage_chunk)),
        Format::Anthropic => StreamReader::Anthropic(anthropic::StreamUsage::default()),
    };
    let state = StreamState {
        body,
        splitter: sse::Splitter::default(),
        reader,
        lease,
        idle_timeout,
        ended: false,
    };
    stream::unfold(state, |mut state| async move {
        if state.ended {
            return None;
        }
        loop {
            let frame =
                match passthrough::next_frame(&mut state.body, state.idle_timeout, "upstream stream stalled").await {
                    Ok(frame) => frame,
                    Err(error) => {
                        state.ended = true;
                        return Some((Err(error), state));
                    }
                };
            match frame {
                None => {
                    state.ended = true;
                    let rest = state.splitter.finish().unwrap_or_default();
                    if let Some(usage) = state.reader.final_usage() {
                        state.lease.settled(usage);
                    }
                    // Completed before the client sees the stream end.
                    state.lease.finish().await;
                    return Some((Ok(rest), state));
                }
                Some(Err(e)) => {
                    state.ended = true;
                    return Some((Err(std::io::Error::other(e.to_string())), state));
                }
                Some(Ok(frame)) => {
                    let Ok(data) = frame.into_data() else { continue };
                    let events = match state.splitter.push(&data) {
                        Ok(events) => events,
                        Err(e) => {
                            state.ended = true;
                            return Some((Err(std::io::Error::other(e.to_string())), state));
                        }
                    };
                    let mut out = Vec::with_capacity(data.len());
                    for event in events {
                        if state.reader.on_event(&event) == EventAction::Forward {
                            out.extend_from_slice(&event);
                        }
                    }
                    if !out.is_empty() {
                        return Some((Ok(Bytes::from(out)), state));
                    }
                }
            }
        }
    })
}

