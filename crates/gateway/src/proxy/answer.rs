//! The client's body of an upstream answer (docs/gateway.md, "Forwarding"), over
//! one reader of the upstream's body for streams and whole answers alike: each
//! chunk goes on the moment it can (a stream's events once whole), the usage is
//! read on the way (from a stream's events, or by [`UsageScanner`] over a whole
//! answer), and the call's lease is settled and completed when the answer ends,
//! before the client sees its end. A client gone, an upstream failing or
//! pausing past the idle timeout: the lease drops with what it was settled to
//! so far. Memory per call is a chunk (an event) and the scanner's bounded
//! `usage` value, whatever the answer's size.

use std::collections::VecDeque;
use std::io;
use std::time::Duration;

use axum::body::Body;
use bytes::{Bytes, BytesMut};
use futures_util::stream::{self, Stream};
use futures_util::FutureExt;
use http_body_util::BodyExt;
use hyper::body::{Body as _, Incoming};

use super::response_ids::RememberResponseId;
use crate::admission::CallLease;
use crate::wire::call::Endpoint;
use crate::wire::content::texts_of_answer;
use crate::wire::envelope::Reframer;
use crate::wire::format::StreamUsage;
use crate::wire::response_facts::ResponseFacts;
use crate::wire::sse;
use crate::wire::usage::{EventAction, Usage};
use crate::wire::usage_scan::UsageScanner;

/// The largest answer sent as one body when it has all arrived by the time its
/// headers have (a typical chat answer): it goes out with its length, its lease
/// settled before, with no stream to run.
pub const WHOLE_ANSWER_BYTES_MAX: usize = 256 * 1024;

/// What an answer's bytes go through on their way to the client.
enum Reader {
    /// A stream: each event forwarded once whole, its usage read from the events.
    Events {
        reframer: Reframer,
        splitter: sse::Splitter,
        usage: StreamUsage,
    },
    /// A whole answer, forwarded as it comes; its usage scanned (`None`: not read,
    /// an error answer of an untraced call).
    Whole {
        endpoint: Endpoint,
        scanner: Option<UsageScanner>,
        /// The usage the answer's headers report (Bedrock's token counts),
        /// read when its body holds none.
        headers_usage: Option<Usage>,
        /// Whether its usage is read (a success; an error answer is scanned
        /// only for its facts).
        read_usage: bool,
    },
}

impl Reader {
    /// The bytes of `data` to forward now.
    fn push(&mut self, data: Bytes) -> Result<Bytes, io::Error> {
        match self {
            Reader::Events {
                reframer,
                splitter,
                usage,
            } => {
                let data = reframer.push(data).map_err(io::Error::other)?;
                let events = splitter.push(&data).map_err(|e| io::Error::other(e.to_string()))?;
                let mut out = Vec::with_capacity(data.len());
                for event in events {
                    if usage.on_event(&event) == EventAction::Forward {
                        out.extend_from_slice(&event);
                    }
                }
                Ok(Bytes::from(out))
            }
            Reader::Whole { scanner, .. } => {
                if let Some(scanner) = scanner {
                    scanner.push(&data);
                }
                Ok(data)
            }
        }
    }

    /// The answer ended whole: the bytes left to forward, and its usage if read.
    fn end(&mut self) -> (Bytes, Option<Usage>) {
        match self {
            Reader::Events { splitter, usage, .. } => (splitter.finish().unwrap_or_default(), usage.final_usage()),
            Reader::Whole {
                endpoint,
                scanner,
                headers_usage,
                read_usage,
            } => {
                let answer = scanner.as_ref().filter(|_| *read_usage).and_then(UsageScanner::answer);
                let usage = answer.and_then(|answer| endpoint.usage_of_body(&answer));
                (Bytes::new(), usage.or(*headers_usage))
            }
        }
    }

    /// The answer's response id (the Responses API's) and its conversation,
    /// once it ended whole.
    fn handed(&self) -> (Option<String>, Option<serde_json::Value>) {
        match self {
            Reader::Events { usage, .. } => (usage.response_id().map(str::to_owned), usage.conversation().cloned()),
            Reader::Whole { scanner, .. } => {
                let scanner = scanner.as_ref();
                (
                    scanner.and_then(UsageScanner::id),
                    scanner.and_then(UsageScanner::conversation),
                )
            }
        }
    }

    /// What the answer said of itself, when the call is traced and it ended whole.
    fn facts(&self) -> Option<ResponseFacts> {
        match self {
            Reader::Events { usage, .. } => usage.facts().cloned(),
            Reader::Whole { scanner, endpoint, .. } => {
                let scanner = scanner.as_ref()?;
                let mut facts = scanner.response_facts()?;
                if let Some(content) = scanner.content() {
                    facts.texts = Some(texts_of_answer(*endpoint, &content));
                }
                Some(facts)
            }
        }
    }

    /// What a stall of the upstream is called in the client's error.
    fn stalled(&self) -> &'static str {
        match self {
            Reader::Events { .. } => "upstream stream stalled",
            Reader::Whole { .. } => "upstream answer stalled",
        }
    }
}

/// One answer on its way: the upstream's body, its reader, the call's lease.
struct Answer {
    body: Incoming,
    reader: Reader,
    lease: CallLease,
    idle_timeout: Duration,
    /// Chunks read before the stream started, sent first.
    prefix: VecDeque<Bytes>,
    /// An upstream error met before the stream started, sent after the prefix.
    failed: Option<io::Error>,
    ended: bool,
    /// Where the answer's response id and conversation go when it ended whole
    /// (Responses only).
    remember: Option<RememberResponseId>,
    /// Whether the stream's first bytes were told to the try's span.
    first_chunk_seen: bool,
}

/// The client's stream of an event-stream answer of `endpoint`, its bytes
/// turned into server-sent events by `reframer`: each event forwarded the
/// moment it is whole (`drop_usage_chunk`: the usage chunk the gateway asked
/// for is not), the usage read on the way.
pub fn events(
    (body, reframer): (Incoming, Reframer),
    (endpoint, drop_usage_chunk): (Endpoint, bool),
    (lease, remember): (CallLease, Option<RememberResponseId>),
    idle_timeout: Duration,
) -> Body {
    let usage = endpoint.stream_usage(drop_usage_chunk);
    let reader = Reader::Events {
        reframer,
        splitter: sse::Splitter::default(),
        usage: match lease.trace_reads() {
            None => usage,
            Some(false) => usage.with_facts(),
            Some(true) => usage.with_content(),
        },
    };
    let mut answer = Answer::new(body, reader, lease, idle_timeout);
    answer.remember = remember;
    Body::from_stream(chunks(answer))
}

/// The client's body of a whole answer of `endpoint`: whole when it has all
/// arrived already (up to [`WHOLE_ANSWER_BYTES_MAX`]), else forwarded chunk by
/// chunk; with `scan`, its usage read (from the body, else `headers_usage`)
/// and the lease settled to it once the answer ended whole.
pub async fn whole(
    (body, headers_usage): (Incoming, Option<Usage>),
    (endpoint, scan): (Endpoint, bool),
    (lease, remember): (CallLease, Option<RememberResponseId>),
    idle_timeout: Duration,
) -> Body {
    let scanner = match (scan, lease.trace_reads()) {
        (_, Some(true)) => Some(UsageScanner::with_content()),
        (_, Some(false)) => Some(UsageScanner::with_facts()),
        (true, None) => Some(UsageScanner::default()),
        (false, None) => None,
    };
    let reader = Reader::Whole {
        endpoint,
        scanner,
        read_usage: scan,
        headers_usage: headers_usage.filter(|_| scan),
    };
    let mut answer = Answer::new(body, reader, lease, idle_timeout);
    answer.remember = remember;
    let mut read = 0;
    while read <= WHOLE_ANSWER_BYTES_MAX {
        match answer.body.frame().now_or_never() {
            None => break,
            Some(None) => {
                let rest = answer.end().await;
                let mut whole = BytesMut::with_capacity(read + rest.len());
                for chunk in answer.prefix.drain(..).chain([rest]) {
                    whole.extend_from_slice(&chunk);
                }
                return Body::from(whole.freeze());
            }
            Some(Some(Err(e))) => {
                answer.failed = Some(io::Error::other(e.to_string()));
                break;
            }
            Some(Some(Ok(frame))) => {
                let Ok(data) = frame.into_data() else { continue };
                read += data.len();
                match answer.reader.push(data) {
                    Ok(out) => answer.prefix.push_back(out),
                    Err(e) => {
                        answer.failed = Some(e);
                        break;
                    }
                }
            }
        }
    }
    Body::from_stream(chunks(answer))
}

impl Answer {
    fn new(body: Incoming, reader: Reader, lease: CallLease, idle_timeout: Duration) -> Self {
        Self {
            body,
            reader,
            lease,
            idle_timeout,
            prefix: VecDeque::new(),
            failed: None,
            ended: false,
            remember: None,
            first_chunk_seen: false,
        }
    }

    /// The next data of the upstream's body (`None` at its end), or an error: the
    /// upstream's, or a `TimedOut` when nothing comes within the idle timeout.
    async fn next_data(&mut self) -> Result<Option<Bytes>, io::Error> {
        loop {
            let frame = (tokio::time::timeout(self.idle_timeout, self.body.frame()).await)
                .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, self.reader.stalled()))?;
            match frame {
                None => return Ok(None),
                Some(Err(e)) => return Err(io::Error::other(e.to_string())),
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        return Ok(Some(data));
                    }
                }
            }
        }
    }

    /// The answer ended whole: the lease is settled to its usage, if read, and
    /// completed, on TigerBeetle its reply awaited, and its response id and
    /// conversation recorded for its tenant (on a fleet, in the cluster, at the
    /// same time), before the client sees the end, so that a caller's next call,
    /// on any server, finds its hold released and may continue the response.
    /// Returns the bytes left to forward.
    async fn end(&mut self) -> Bytes {
        self.ended = true;
        let (rest, usage) = self.reader.end();
        if let Some(usage) = usage {
            self.lease.settled(usage);
        }
        if let Some(facts) = self.reader.facts() {
            self.lease.trace_response(facts);
        }
        let Some(remember) = &self.remember else {
            // Not a stored response: its id and conversation are not read.
            self.lease.finish().await;
            return rest;
        };
        let (response_id, conversation) = self.reader.handed();
        let record = remember.record(response_id.as_deref(), conversation.as_ref());
        tokio::join!(record, self.lease.finish());
        rest
    }

    /// The next chunk for the client, `None` once the answer ended.
    async fn next_chunk(&mut self) -> Option<Result<Bytes, io::Error>> {
        if let Some(chunk) = self.prefix.pop_front() {
            return Some(Ok(chunk));
        }
        if let Some(error) = self.failed.take() {
            self.ended = true;
            return Some(Err(error));
        }
        while !self.ended {
            let out = match self.next_data().await {
                Ok(Some(data)) => {
                    if !self.first_chunk_seen && matches!(self.reader, Reader::Events { .. }) {
                        self.first_chunk_seen = true;
                        self.lease.trace_first_chunk();
                    }
                    self.reader.push(data)
                }
                Ok(None) => Ok(self.end().await),
                Err(e) => Err(e),
            };
            let mut out = match out {
                Ok(out) => out,
                Err(e) => {
                    self.ended = true;
                    return Some(Err(e));
                }
            };
            if !self.ended && self.body.is_end_stream() {
                // A length-delimited answer ends for the client with its last
                // byte, before this stream ends: complete first.
                let rest = self.end().await;
                if !rest.is_empty() {
                    out = [out, rest].concat().into();
                }
            }
            if !out.is_empty() {
                return Some(Ok(out));
            }
        }
        None
    }
}

fn chunks(answer: Answer) -> impl Stream<Item = Result<Bytes, io::Error>> + Send + 'static {
    stream::unfold(answer, |mut answer| async move {
        let chunk = answer.next_chunk().await?;
        Some((chunk, answer))
    })
}
