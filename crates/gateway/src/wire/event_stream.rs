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
use serde::de::IgnoredAny;
use serde::Deserialize;
use serde_json::{json, Value};
use std::borrow::Cow;

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
    /// The event a chunk decodes to, kept between chunks so that a stream of
    /// some tens of events allocates it once, not once per event.
    event: Vec<u8>,
}

/// A `chunk` event's payload, its base64 borrowed from the frame (copied only
/// if escaped): only `bytes` is read (Bedrock adds others, such as padding).
/// A bare `Cow`, not an `Option`: serde borrows only a field that is a `Cow`
/// itself; a missing field is the empty default.
#[derive(Deserialize)]
struct Chunk<'a> {
    #[serde(borrow, default)]
    bytes: Cow<'a, str>,
}

/// The `type` of an Anthropic event, read without building the rest of it
/// (the other fields are skipped, not allocated: the usage reader and the
/// client read the event's bytes, not a parsed copy). Empty when missing.
#[derive(Deserialize)]
struct Typed<'a> {
    #[serde(borrow, default, rename = "type")]
    kind: Cow<'a, str>,
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
                Ok(DecodedFrame::Complete(message)) => sse_of(&message, &mut self.event, &mut out)?,
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

/// Appends to `out` the server-sent event of one frame (nothing for an event
/// other than `chunk`); `event` is the scratch space a chunk's event is
/// decoded into.
fn sse_of(message: &Message, event: &mut Vec<u8>, out: &mut Vec<u8>) -> Result<(), String> {
    match header(message, ":message-type") {
        Some("event") if header(message, ":event-type") == Some("chunk") => {
            let chunk: Chunk = serde_json::from_slice(message.payload())
                .map_err(|_| "a Bedrock stream chunk is not JSON".to_owned())?;
            if chunk.bytes.is_empty() {
                return Err("a Bedrock stream chunk has no bytes".to_owned());
            }
            event.clear();
            (base64::engine::general_purpose::STANDARD.decode_vec(chunk.bytes.as_bytes(), event))
                .map_err(|_| "a Bedrock stream chunk's bytes are not base64".to_owned())?;
            let name = match serde_json::from_slice::<Typed>(event) {
                Ok(typed) if !typed.kind.is_empty() => typed.kind,
                // JSON, but no object with a text `type`: named as an unnamed
                // server-sent event is.
                Ok(_) => Cow::Borrowed("message"),
                Err(_) if serde_json::from_slice::<IgnoredAny>(event).is_ok() => Cow::Borrowed("message"),
                Err(_) => return Err("a Bedrock stream chunk is not an event".to_owned()),
            };
            sse(&name, event, out);
        }
        Some("event") => {}
        Some("exception") => {
            let kind = header(message, ":exception-type").unwrap_or("internalServerException");
            let text = serde_json::from_slice::<Value>(message.payload())
                .ok()
                .and_then(|v| v.get("message").and_then(Value::as_str).map(str::to_owned))
                .unwrap_or_else(|| kind.to_owned());
            error_event(error_type_of(kind), &format!("{kind}: {text}"), out);
        }
        _ => {
            let text = header(message, ":error-message").unwrap_or("the Bedrock stream failed");
            error_event("api_error", text, out);
        }
    }
    Ok(())
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

/// Appends `event: <name>\ndata: <data>\n\n` to `out`.
fn sse(name: &str, data: &[u8], out: &mut Vec<u8>) {
    out.reserve(data.len() + name.len() + 16);
    out.extend_from_slice(b"event: ");
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(b"\ndata: ");
    out.extend_from_slice(data);
    out.extend_from_slice(b"\n\n");
}

fn error_event(kind: &str, message: &str, out: &mut Vec<u8>) {
    let body = json!({"type": "error", "error": {"type": kind, "message": message}});
    sse("error", body.to_string().as_bytes(), out);
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
    fn a_chunk_with_escapes_padding_or_an_unnamed_event_is_read_whole() {
        let headers = [(":message-type", "event"), (":event-type", "chunk")];
        let event = br#"{"type":"content_block_delta","delta":{"text":"a/b?"}}"#;
        let encoded = base64::engine::general_purpose::STANDARD.encode(event);
        assert!(encoded.contains('/'), "the case JSON may escape");
        let payload = format!(r#"{{"bytes":"{}","p":"abcdefgh"}}"#, encoded.replace('/', "\\/"));
        let mut reframer = EventStreamReframer::default();
        let out = reframer.push(&frame(&headers, payload.as_bytes())).unwrap();
        let expected = [&b"event: content_block_delta\ndata: "[..], event, b"\n\n"].concat();
        assert_eq!(out, expected);
        let unnamed = base64::engine::general_purpose::STANDARD.encode(b"[1]");
        let out = reframer
            .push(&frame(&headers, format!(r#"{{"bytes":"{unnamed}"}}"#).as_bytes()))
            .unwrap();
        assert_eq!(out, &b"event: message\ndata: [1]\n\n"[..]);
        let not_json = base64::engine::general_purpose::STANDARD.encode(b"{oops");
        let corrupt = frame(&headers, format!(r#"{{"bytes":"{not_json}"}}"#).as_bytes());
        assert!(reframer.push(&corrupt).unwrap_err().contains("not an event"));
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
