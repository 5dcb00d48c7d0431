//! A whole (non-stream) answer passed to the client as it arrives
//! (docs/gateway.md, "Forwarding"): each chunk is forwarded the moment it comes,
//! its usage read on the way by [`UsageScanner`], and the call's lease settled
//! when the answer has ended. Memory per call is a chunk and the scanner's
//! bounded `usage` value, whatever the answer's size.

use std::time::Duration;

use bytes::Bytes;
use futures_util::stream::{self, Stream};
use http_body_util::BodyExt;

use crate::call::Endpoint;
use crate::error::Format;
use crate::lease::{CallLease, Settle};
use crate::usage_scan::UsageScanner;
use crate::{anthropic, openai};

struct State {
    body: hyper::body::Incoming,
    /// `None`: the answer is not read for usage (an error answer).
    scanner: Option<UsageScanner>,
    endpoint: Endpoint,
    lease: CallLease,
    idle_timeout: Duration,
    ended: bool,
}

/// The client's body of an upstream answer: forwarded chunk by chunk; with
/// `scan`, its usage read and the lease settled to it once the answer ended
/// whole. A client gone, an upstream failing or pausing past `idle_timeout`:
/// the lease drops with what it was settled to so far.
pub fn body(
    body: hyper::body::Incoming,
    endpoint: Endpoint,
    scan: bool,
    lease: CallLease,
    idle_timeout: Duration,
) -> impl Stream<Item = Result<Bytes, std::io::Error>> + Send + 'static {
    let state = State {
        body,
        scanner: scan.then(UsageScanner::default),
        endpoint,
        lease,
        idle_timeout,
        ended: false,
    };
    stream::unfold(state, |mut state| async move {
        if state.ended {
            return None;
        }
        loop {
            let frame = match tokio::time::timeout(state.idle_timeout, state.body.frame()).await {
                Ok(frame) => frame,
                Err(_) => {
                    state.ended = true;
                    let error = std::io::Error::new(std::io::ErrorKind::TimedOut, "upstream answer stalled");
                    return Some((Err(error), state));
                }
            };
            match frame {
                None => {
                    state.settle();
                    return None;
                }
                Some(Err(e)) => {
                    state.ended = true;
                    return Some((Err(std::io::Error::other(e.to_string())), state));
                }
                Some(Ok(frame)) => {
                    let Ok(data) = frame.into_data() else { continue };
                    if let Some(scanner) = &mut state.scanner {
                        scanner.push(&data);
                    }
                    if !data.is_empty() {
                        return Some((Ok(data), state));
                    }
                }
            }
        }
    })
}

impl State {
    /// The answer ended whole: the lease is settled to its usage, if it had one.
    fn settle(&mut self) {
        let Some(answer) = self.scanner.as_ref().and_then(UsageScanner::answer) else {
            return;
        };
        let usage = match self.endpoint.format() {
            Format::OpenAi => openai::usage_of_body(self.endpoint, &answer),
            Format::Anthropic => anthropic::usage_of_body(&answer),
        };
        if let Some(usage) = usage {
            self.lease.settle = Settle::Usage(usage);
        }
    }
}
