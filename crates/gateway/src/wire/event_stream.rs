//! Bedrock's streamed answers (`InvokeModelWithResponseStream`,
//! <https://docs.aws.amazon.com/bedrock/latest/APIReference/API_runtime_InvokeModelWithResponseStream.html>)
//! re-framed as Anthropic's server-sent events, as each frame arrives.
//!
//! The stream is AWS event-stream: binary frames (a prelude with lengths and a
//! CRC, headers, a payload, a CRC;
//! <https://docs.aws.amazon.com/transcribe/latest/dg/streaming-setting-up.html#streaming-event-stream>),
//! decoded by AWS's own `aws-smithy-eventstream`. A `chunk` event's payload is
//! `{"bytes": "<base64>"}`, the base64 of one Anthropic event's JSON, which
//! becomes `event: <type>\ndata: <json>\n\n`; an exception frame
//! (`:message-type: exception`, such as `throttlingException` mid-stream)
//! becomes an Anthropic `error` event
//! (<https://docs.anthropic.com/en/docs/build-with-claude/streaming#error-events>).

use aws_smithy_eventstream::frame::{DecodedFrame, MessageFrameDecoder};
use aws_smithy_types::event_stream::{HeaderValue as FrameValue, Message};
use base64::Engine as _;
use bytes::{Bytes, BytesMut};
use serde_json::{json, Value};

/// The content type of an event-stream answer.
pub const CONTENT_TYPE: &str = "application/vnd.amazon.eventstream";

/// The most bytes held while a frame is incomplete: event-stream frames are at
/// most 16 MiB (the prelude's limit in AWS's decoder), as SSE events here are.
pub const FRAME_BYTES_MAX: usize = 16 * 1024 * 1024;

/// Decodes event-stream frames into Anthropic server-sent events.
#[derive(Debug, Default)]
pub struct EventStreamReframer {
    pending: BytesMut,
    decoder: MessageFrameDecoder,
}

impl EventStreamReframer {
    /// The server-sent events of the frames `data` completes (a frame split
    /// across reads waits for its end); an error for a corrupt frame or a
    /// chunk that is not an event, which ends the stream.
    pub fn push(&mut self, data: &[u8]) -> Result<Bytes, String> {
        self.pending.extend_from_slice(data);
        let mut out = Vec::new();
        loop {
            match self.decoder.decode_frame(&mut self.pending) {
                Ok(DecodedFrame::Complete(message)) => out.extend_from_slice(&sse_of(&message)?),
                Ok(DecodedFrame::Incomplete) => break,
                Err(e) => return Err(format!("a Bedrock stream frame is corrupt: {e}")),
            }
        }
        if self.pending.len() > FRAME_BYTES_MAX {
            return Err(format!("a Bedrock stream frame grew past {FRAME_BYTES_MAX} bytes"));
        }
        Ok(Bytes::from(out))
    }
}

/// A frame header's text value.
fn header<'a>(message: &'a Message, name: &str) -> Option<&'a str> {
    let found = message.headers().iter().find(|h| h.name().as_str() == name)?;
    match found.value() {
        FrameValue::String(text) => Some(text.as_str()),
        _ => None,
    }
}

/// The server-sent event of one frame (empty for an event other than `chunk`).
fn sse_of(message: &Message) -> Result<Vec<u8>, String> {
    match header(message, ":message-type") {
        Some("event") if header(message, ":event-type") == Some("chunk") => {
            let payload: Value = serde_json::from_slice(message.payload())
                .map_err(|_| "a Bedrock stream chunk is not JSON".to_owned())?;
            let encoded = (payload.get("bytes").and_then(Value::as_str))
                .ok_or_else(|| "a Bedrock stream chunk has no bytes".to_owned())?;
            let event = (base64::engine::general_purpose::STANDARD.decode(encoded))
                .map_err(|_| "a Bedrock stream chunk's bytes are not base64".to_owned())?;
            let value: Value =
                serde_json::from_slice(&event).map_err(|_| "a Bedrock stream chunk is not an event".to_owned())?;
            let name = value.get("type").and_then(Value::as_str).unwrap_or("message");
            Ok(sse(name, &event))
        }
        Some("event") => Ok(Vec::new()),
        Some("exception") => {
            let kind = header(message, ":exception-type").unwrap_or("internalServerException");
            let text = serde_json::from_slice::<Value>(message.payload())
                .ok()
                .and_then(|v| v.get("message").and_then(Value::as_str).map(str::to_owned))
                .unwrap_or_else(|| kind.to_owned());
            Ok(error_event(error_type_of(kind), &format!("{kind}: {text}")))
        }
        _ => {
            let text = header(message, ":error-message").unwrap_or("the Bedrock stream failed");
            Ok(error_event("api_error", text))
        }
    }
}

/// Anthropic's error type of a Bedrock exception
/// (<https://docs.aws.amazon.com/bedrock/latest/APIReference/API_runtime_ResponseStream.html>,
/// <https://docs.anthropic.com/en/api/errors>).
pub fn error_type_of(exception: &str) -> &'static str {
    match exception.trim_end_matches("Exception").to_ascii_lowercase().as_str() {
        "throttling" => "rate_limit_error",
        "serviceunavailable" | "modelnotready" => "overloaded_error",
        "validation" => "invalid_request_error",
        "accessdenied" => "permission_error",
        _ => "api_error",
    }
}

fn sse(name: &str, data: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(data.len() + name.len() + 16);
    out.extend_from_slice(b"event: ");
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(b"\ndata: ");
    out.extend_from_slice(data);
    out.extend_from_slice(b"\n\n");
    out
}

fn error_event(kind: &str, message: &str) -> Vec<u8> {
    let body = json!({"type": "error", "error": {"type": kind, "message": message}});
    sse("error", body.to_string().as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;
    use aws_smithy_eventstream::frame::write_message_to;
    use aws_smithy_types::event_stream::Header;

    fn frame(headers: &[(&str, &str)], payload: &[u8]) -> Vec<u8> {
        let headers = headers
            .iter()
            .map(|(n, v)| Header::new(n.to_string(), FrameValue::String(v.to_string().into())))
            .collect();
        let mut out = Vec::new();
        write_message_to(&Message::new_from_parts(headers, payload.to_vec()), &mut out).unwrap();
        out
    }

    fn chunk(event: &Value) -> Vec<u8> {
        let bytes = base64::engine::general_purpose::STANDARD.encode(event.to_string());
        let payload = json!({"bytes": bytes}).to_string();
        let headers = [
            (":message-type", "event"),
            (":event-type", "chunk"),
            (":content-type", "application/json"),
        ];
        frame(&headers, payload.as_bytes())
    }

    #[test]
    fn chunks_become_anthropic_events_even_split_across_reads() {
        let start = json!({"type": "message_start", "message": {"usage": {"input_tokens": 3, "output_tokens": 1}}});
        let stop = json!({"type": "message_stop", "amazon-bedrock-invocationMetrics": {"inputTokenCount": 3}});
        let stream = [chunk(&start), chunk(&stop)].concat();
        let mut reframer = EventStreamReframer::default();
        // Into the second frame, past its 12-byte prelude.
        let cut = chunk(&start).len() + 20;
        let first = reframer.push(&stream[..cut]).unwrap();
        let expected_start = format!("event: message_start\ndata: {start}\n\n");
        assert_eq!(
            first,
            expected_start.as_bytes(),
            "the whole first frame, nothing of the second"
        );
        assert!(
            reframer.push(&stream[cut..cut + 1]).unwrap().is_empty(),
            "still incomplete"
        );
        let rest = reframer.push(&stream[cut + 1..]).unwrap();
        assert_eq!(rest, format!("event: message_stop\ndata: {stop}\n\n").as_bytes());
    }

    #[test]
    fn an_exception_frame_becomes_an_error_event() {
        let payload = br#"{"message":"Too many requests, please wait before trying again."}"#;
        let headers = [
            (":message-type", "exception"),
            (":exception-type", "throttlingException"),
        ];
        let out = EventStreamReframer::default().push(&frame(&headers, payload)).unwrap();
        let text = String::from_utf8(out.to_vec()).unwrap();
        let data: Value = serde_json::from_str(text.strip_prefix("event: error\ndata: ").unwrap().trim()).unwrap();
        assert_eq!(data["error"]["type"], "rate_limit_error");
        assert_eq!(
            data["error"]["message"],
            "throttlingException: Too many requests, please wait before trying again."
        );
        assert_eq!(error_type_of("serviceUnavailableException"), "overloaded_error");
        assert_eq!(error_type_of("modelStreamErrorException"), "api_error");
    }

    #[test]
    fn a_corrupt_frame_or_chunk_ends_the_stream() {
        let mut bad = chunk(&json!({"type": "ping"}));
        let last = bad.len() - 1;
        bad[last] ^= 1;
        assert!(EventStreamReframer::default()
            .push(&bad)
            .unwrap_err()
            .contains("corrupt"));
        let headers = [(":message-type", "event"), (":event-type", "chunk")];
        let not_base64 = frame(&headers, br#"{"bytes":"%%%"}"#);
        assert!(EventStreamReframer::default()
            .push(&not_base64)
            .unwrap_err()
            .contains("base64"));
    }
}
