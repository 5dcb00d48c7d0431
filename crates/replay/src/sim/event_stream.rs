//! Bedrock's streamed answers as the simulator writes them: AWS event-stream
//! frames (`aws-smithy-eventstream`), each `chunk` event's payload
//! `{"bytes": "<base64 of one Anthropic event>"}`, the last event carrying
//! `amazon-bedrock-invocationMetrics`, and a failure mid-stream told by an
//! exception frame (`:message-type: exception`)
//! (<https://docs.aws.amazon.com/bedrock/latest/APIReference/API_runtime_InvokeModelWithResponseStream.html>).

use aws_smithy_eventstream::frame::write_message_to;
use aws_smithy_types::event_stream::{Header, HeaderValue, Message};
use axum::body::{Body, Bytes};
use base64::Engine as _;
use futures_util::StreamExt;
use serde_json::{json, Value};

/// The content type of an event-stream answer.
pub const CONTENT_TYPE: &str = "application/vnd.amazon.eventstream";

/// The exception a stream cut by the fault switch ends with: Bedrock tells a
/// stream's failure in a frame, and throttling is the one a pool must survive.
pub const CUT_EXCEPTION: &str = "throttlingException";

fn frame(headers: &[(&str, &str)], payload: &[u8]) -> Bytes {
    let headers = (headers.iter())
        .map(|(name, value)| Header::new(name.to_string(), HeaderValue::String(value.to_string().into())))
        .collect();
    let mut out = Vec::with_capacity(payload.len() + 128);
    write_message_to(&Message::new_from_parts(headers, payload.to_vec()), &mut out).expect("a frame within limits");
    Bytes::from(out)
}

/// One `chunk` event carrying `event` (an Anthropic event's JSON).
pub fn chunk_frame(event: &[u8]) -> Bytes {
    let encoded = base64::engine::general_purpose::STANDARD.encode(event);
    // Bedrock pads each chunk's payload with a `p` field of filler, so that
    // the frames' sizes do not tell the tokens' lengths.
    let payload = json!({"bytes": encoded, "p": "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"});
    frame(
        &[
            (":event-type", "chunk"),
            (":content-type", "application/json"),
            (":message-type", "event"),
        ],
        payload.to_string().as_bytes(),
    )
}

/// An exception frame of type `exception` (`throttlingException`...).
pub fn exception_frame(exception: &str, message: &str) -> Bytes {
    let payload = json!({ "message": message });
    frame(
        &[
            (":exception-type", exception),
            (":content-type", "application/json"),
            (":message-type", "exception"),
        ],
        payload.to_string().as_bytes(),
    )
}

/// The token counts of a stream, as its events tell them.
#[derive(Debug, Default)]
struct Counts {
    input: u64,
    cache_read: u64,
    cache_write: u64,
    output: u64,
    started_ms: u128,
}

impl Counts {
    /// Reads `event`; on `message_stop`, adds Bedrock's invocation metrics.
    fn read(&mut self, event: &mut Value) {
        let count = |v: &Value, name: &str| v.get(name).and_then(Value::as_u64).unwrap_or(0);
        match event.get("type").and_then(Value::as_str) {
            Some("message_start") => {
                let usage = &event["message"]["usage"];
                self.input = count(usage, "input_tokens");
                self.cache_read = count(usage, "cache_read_input_tokens");
                self.cache_write = count(usage, "cache_creation_input_tokens");
            }
            Some("message_delta") => self.output = count(&event["usage"], "output_tokens"),
            Some("message_stop") => {
                let latency_ms = now_ms().saturating_sub(self.started_ms);
                event["amazon-bedrock-invocationMetrics"] = json!({
                    "inputTokenCount": self.input, "outputTokenCount": self.output,
                    "cacheReadInputTokenCount": self.cache_read, "cacheWriteInputTokenCount": self.cache_write,
                    "invocationLatency": latency_ms, "firstByteLatency": latency_ms.min(1),
                });
            }
            _ => {}
        }
    }
}

fn now_ms() -> u128 {
    (std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)).map_or(0, |d| d.as_millis())
}

/// The event-stream body of an Anthropic server-sent-event `body`: each
/// event re-framed as it comes; a cut (the fault `drop`) becomes a
/// [`CUT_EXCEPTION`] frame that ends the stream.
pub fn reframe(body: Body) -> Body {
    let counts = Counts {
        started_ms: now_ms(),
        ..Counts::default()
    };
    let state = (body.into_data_stream(), Vec::<u8>::new(), counts, false);
    let frames = futures_util::stream::unfold(state, |(mut inner, mut pending, mut counts, done)| async move {
        if done {
            return None;
        }
        loop {
            if let Some(end) = find_event_end(&pending) {
                let event: Vec<u8> = pending.drain(..end).collect();
                let Some(mut value) = event_data(&event) else { continue };
                counts.read(&mut value);
                let out = chunk_frame(value.to_string().as_bytes());
                return Some((Ok::<Bytes, std::io::Error>(out), (inner, pending, counts, false)));
            }
            match inner.next().await {
                Some(Ok(data)) => pending.extend_from_slice(&data),
                Some(Err(_)) => {
                    let out = exception_frame(CUT_EXCEPTION, "Too many tokens, please wait before trying again.");
                    return Some((Ok(out), (inner, pending, counts, true)));
                }
                None => return None,
            }
        }
    });
    Body::from_stream(frames)
}

/// The end (exclusive) of the first whole server-sent event.
fn find_event_end(buffer: &[u8]) -> Option<usize> {
    buffer.windows(2).position(|w| w == b"\n\n").map(|i| i + 2)
}

/// An event's `data:` JSON.
fn event_data(event: &[u8]) -> Option<Value> {
    let text = std::str::from_utf8(event).ok()?;
    let data = text.lines().find_map(|line| line.strip_prefix("data: "))?;
    serde_json::from_str(data).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use aws_smithy_eventstream::frame::read_message_from;

    #[tokio::test]
    async fn events_become_chunks_and_the_stop_carries_the_metrics() {
        let sse = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":7,\"output_tokens\":1}}}\n\n\
                   event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":3}}\n\n\
                   event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n";
        let body = reframe(Body::from(sse));
        let mut bytes = axum::body::to_bytes(body, usize::MAX).await.unwrap();
        let mut events = Vec::new();
        while !bytes.is_empty() {
            let message = read_message_from(&mut bytes).unwrap();
            let payload: Value = serde_json::from_slice(message.payload()).unwrap();
            let decoded = base64::engine::general_purpose::STANDARD
                .decode(payload["bytes"].as_str().unwrap())
                .unwrap();
            events.push(serde_json::from_slice::<Value>(&decoded).unwrap());
        }
        assert_eq!(events.len(), 3);
        let metrics = &events[2]["amazon-bedrock-invocationMetrics"];
        assert_eq!(
            (
                metrics["inputTokenCount"].as_u64(),
                metrics["outputTokenCount"].as_u64()
            ),
            (Some(7), Some(3))
        );
    }
}
