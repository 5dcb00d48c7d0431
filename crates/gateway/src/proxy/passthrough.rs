//! A whole (non-stream) answer passed to the client as it arrives
//! (docs/gateway.md, "Forwarding"): each chunk is forwarded the moment it comes,
//! its usage read on the way by [`UsageScanner`], and the call's lease settled
//! when the answer has ended. Memory per call is a chunk and the scanner's
//! bounded `usage` value, whatever the answer's size.

use std::collections::VecDeque;
use std::time::Duration;

use axum::body::Body;
use bytes::{Bytes, BytesMut};
use futures_util::stream::{self, Stream};
use futures_util::FutureExt;
use http_body_util::BodyExt;
use hyper::body::Body as _;

use crate::admission::CallLease;
use crate::wire::call::Endpoint;
use crate::wire::error::Format;
use crate::wire::usage_scan::UsageScanner;
use crate::wire::{anthropic, openai};

/// The largest answer sent as one body when it has all arrived by the time its
/// headers have (a typical chat answer): it goes out with its length, its lease
/// settled before, with no stream to run.
pub const WHOLE_ANSWER_BYTES_MAX: usize = 256 * 1024;

struct State {
    body: hyper::body::Incoming,
    /// Chunks read before the stream started, sent first.
    prefix: VecDeque<Bytes>,
    /// An upstream error met before the stream started, sent after the prefix.
    failed: Option<std::io::Error>,
    /// `None`: the answer is not read for usage (an error answer).
    scanner: Option<UsageScanner>,
    endpoint: Endpoint,
    lease: CallLease,
    idle_timeout: Duration,
    ended: bool,
}

/// The client's body of an upstream answer: whole when it has all arrived
/// already (up to [`WHOLE_ANSWER_BYTES_MAX`]), else forwarded chunk by chunk;
/// with `scan`, its usage read and the lease settled to it once the answer
/// ended whole. A client gone, an upstream failing or pausing past
/// `idle_timeout`: the lease drops with what it was settled to so far.
pub async fn body(
    body: hyper::body::Incoming,
    endpoint: Endpoint,
    scan: bool,
    lease: CallLease,
    idle_timeout: Duration,
) -> Body {
    let mut state = State {
        body,
        prefix: VecDeque::new(),
        failed: None,
        scanner: scan.then(UsageScanner::default),
        endpoint,
        lease,
        idle_timeout,
        ended: false,
    };
    let mut read = 0;
    while read <= WHOLE_ANSWER_BYTES_MAX {
        match state.body.frame().now_or_never() {
            None => break,
            Some(None) => {
                state.end_whole().await;
                let mut whole = BytesMut::with_capacity(read);
                for chunk in state.prefix.drain(..) {
                    whole.extend_from_slice(&chunk);
                }
                return Body::from(whole.freeze());
            }
            Some(Some(Err(e))) => {
                state.failed = Some(std::io::Error::other(e.to_string()));
                break;
            }
            Some(Some(Ok(frame))) => {
                let Ok(data) = frame.into_data() else { continue };
                state.push(&data);
                read += data.len();
                state.prefix.push_back(data);
            }
        }
    }
    Body::from_stream(chunks(state))
}

fn chunks(state: State) -> impl Stream<Item = Result<Bytes, std::io::Error>> + Send + 'static {
    stream::unfold(state, |mut state| async move {
        if let Some(chunk) = state.prefix.pop_front() {
            return Some((Ok(chunk), state));
        }
        if let Some(error) = state.failed.take() {
            state.ended = true;
            return Some((Err(error), state));
        }
        if state.ended {
            return None;
        }
        loop {
            let frame = match next_frame(&mut state.body, state.idle_timeout, "upstream answer stalled").await {
                Ok(frame) => frame,
                Err(error) => {
                    state.ended = true;
                    return Some((Err(error), state));
                }
            };
            match frame {
                None => {
                    state.end_whole().await;
                    return None;
                }
                Some(Err(e)) => {
                    state.ended = true;
                    return Some((Err(std::io::Error::other(e.to_string())), state));
                }
                Some(Ok(frame)) => {
                    let Ok(data) = frame.into_data() else { continue };
                    state.push(&data);
                    if state.body.is_end_stream() {
                        // A length-delimited answer ends for the client with its
                        // last byte, before this stream ends: complete first.
                        state.end_whole().await;
                        return (!data.is_empty()).then_some((Ok(data), state));
                    }
                    if !data.is_empty() {
                        return Some((Ok(data), state));
                    }
                }
            }
        }
    })
}

/// The next frame of an upstream answer, or a `TimedOut` error saying `stalled`
/// when none comes within `idle_timeout`: one rule for streamed and passed-through
/// answers alike.
pub(crate) async fn next_frame(
    body: &mut hyper::body::Incoming,
    idle_timeout: Duration,
    stalled: &'static str,
) -> Result<Option<Result<hyper::body::Frame<Bytes>, hyper::Error>>, std::io::Error> {
    (tokio::time::timeout(idle_timeout, body.frame()).await)
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, stalled))
}

impl State {
    fn push(&mut self, data: &[u8]) {
        if let Some(scanner) = &mut self.scanner {
            scanner.push(data);
        }
    }

    /// The answer ended whole: the lease is settled to its usage, if it had one,
    /// and completed, on TigerBeetle its reply awaited, before the client sees the
    /// end, so that a caller's next call finds its hold released.
    async fn end_whole(&mut self) {
        self.ended = true;
        let answer = self.scanner.as_ref().and_then(UsageScanner::answer);
        let usage = answer.and_then(|answer| match self.endpoint.format() {
            Format::OpenAi => openai::usage_of_body(self.endpoint, &answer),
            Format::Anthropic => anthropic::usage_of_body(&answer),
        });
        if let Some(usage) = usage {
            self.lease.settled(usage);
        }
        self.lease.finish().await;
    }
}
