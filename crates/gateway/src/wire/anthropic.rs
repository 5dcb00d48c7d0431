//! Anthropic's wire format: Messages requests, their usage, and their event
//! streams (docs/gateway.md, "Anthropic").

use bytes::Bytes;
use serde_json::{Map, Value};

use crate::counting::tokens::Counter;
use crate::wire::call::{optional_bool, optional_u64, required_array, Call};
use crate::wire::content::append_text;
use crate::wire::error::GatewayError;
use crate::wire::response_facts::{short_string, ResponseFacts};
use crate::wire::sse;
use crate::wire::usage::{EventAction, Usage, UsageFields};

/// The API version sent upstream when the client names none (the one the SDKs send).
pub const API_VERSION_DEFAULT: &str = "2023-06-01";

/// Reads a Messages request: `messages` and `max_tokens` are required by the API,
/// so a request without them is answered here, before anything is reserved.
pub fn read_call(object: Map<String, Value>, counter: &Counter, body: Bytes) -> Result<Call, GatewayError> {
    let messages = required_array(&object, "messages")?;
    if !messages.iter().all(Value::is_object) {
        return Err(GatewayError::invalid("messages: each message must be an object."));
    }
    let Some(max_tokens) = optional_u64(&object, "max_tokens")? else {
        return Err(GatewayError::invalid("max_tokens: Field required."));
    };
    let stream = optional_bool(&object, "stream")?;
    let tally = counter.anthropic_messages(&Value::Object(object));
    Ok(Call {
        stream,
        input_tokens: counter.reserve(tally),
        prompt_characters: 0,
        output_tokens: max_tokens,
        calibration_sample: counter.calibration_sample(tally),
        drop_usage_chunk: false,
        upstream_body: body,
        // `max_tokens` is required: the bound reserved is the client's own.
        bound_to_send: None,
    })
}

/// Usage from an Anthropic `usage` object: input plus cache creation on the input
/// side (Anthropic counts both on ITPM), cache reads apart: they are billed
/// ([`Usage::billed`]) but not counted on ITPM by current models
/// (<https://docs.anthropic.com/en/api/rate-limits>).
fn usage_of(usage: &UsageFields) -> Usage {
    let (cache_write_tokens, cache_write_1h_tokens) = usage.cache_writes();
    Usage {
        input_tokens: usage.input_tokens.saturating_add(usage.cache_creation_input_tokens),
        output_tokens: usage.output_tokens,
        cache_read_tokens: usage.cache_read_input_tokens,
        cached_input_tokens: 0,
        // Shares of the input side, priced apart by a budget in money.
        cache_write_tokens,
        cache_write_1h_tokens,
    }
}

/// The usage of a whole (non-stream) answer, from its JSON bytes.
pub fn usage_of_body(body: &[u8]) -> Option<Usage> {
    UsageFields::of_answer(body).map(|fields| usage_of(&fields))
}

/// Usage from a Messages stream: `message_start` carries the input side,
/// `message_delta` the output so far, cumulative: the last one wins.
#[derive(Debug, Default)]
pub struct StreamUsage {
    /// The usage seen so far; `None` until `message_start`.
    pub usage: Option<Usage>,
    /// Whether `message_delta` was seen: only then is the output count final
    /// (`message_start` reports the output of the first token only).
    pub final_seen: bool,
    /// Whether a usage with a field that is not a non-negative integer was
    /// seen: the call then keeps its reservation, as the same answer whole would.
    malformed: bool,
    /// What the stream says of its message, read only when the call is traced:
    /// `message_start`'s id and model, `message_delta`'s stop reason, an `error` event's type.
    pub facts: Option<ResponseFacts>,
}

impl StreamUsage {
    /// The stream's usage once it ended: only after `message_delta`, and none
    /// when a malformed usage was seen anywhere in it, as the whole answer's.
    pub fn final_usage(&self) -> Option<Usage> {
        self.usage.filter(|_| self.final_seen && !self.malformed)
    }

    /// Reads one event; every event is forwarded.
    pub fn on_event(&mut self, event: &[u8]) -> EventAction {
        let name = sse::name(event);
        let is_start = name == Some(b"message_start");
        let is_delta = name == Some(b"message_delta");
        let is_stop = name == Some(b"message_stop");
        let is_error = name == Some(b"error") && self.facts.is_some();
        let is_text = name == Some(b"content_block_delta") && self.facts.as_ref().is_some_and(|f| f.texts.is_some());
        if !is_start && !is_delta && !is_stop && !is_error && !is_text {
            return EventAction::Forward;
        }
        let Some(value) = sse::data(event).and_then(|d| serde_json::from_slice::<Value>(&d).ok()) else {
            return EventAction::Forward;
        };
        if let Some(facts) = &mut self.facts {
            read_facts(facts, &value);
        }
        if is_stop {
            self.on_bedrock_metrics(&value);
        } else if is_start {
            if let Some(usage) = value.get("message").and_then(|m| m.get("usage")) {
                let fields = UsageFields::of_value(usage);
                self.malformed |= fields.is_none();
                self.usage = fields.map(|fields| usage_of(&fields));
            }
        } else if let Some(delta) = value.get("usage").filter(|u| u.is_object()) {
            let Some(latest) = UsageFields::of_value(delta) else {
                self.malformed = true;
                return EventAction::Forward;
            };
            let mut usage = self.usage.unwrap_or_default();
            // Cumulative counts: take the latest of each field the event carries.
            if delta.get("input_tokens").is_some() || delta.get("cache_creation_input_tokens").is_some() {
                let latest = usage_of(&latest);
                if latest.input_tokens >= usage.input_tokens {
                    usage.input_tokens = latest.input_tokens;
                    usage.cache_write_tokens = latest.cache_write_tokens;
                    usage.cache_write_1h_tokens = latest.cache_write_1h_tokens;
                }
                usage.cache_read_tokens = usage.cache_read_tokens.max(latest.cache_read_tokens);
            }
            usage.output_tokens = latest.output_tokens;
            self.usage = Some(usage);
            self.final_seen = true;
        }
        EventAction::Forward
    }
}

/// The headers of Bedrock's token counts on a whole answer
/// (<https://docs.aws.amazon.com/bedrock/latest/APIReference/API_runtime_InvokeModel.html#API_runtime_InvokeModel_ResponseSyntax>).
pub const BEDROCK_INPUT_TOKENS_HEADER: &str = "x-amzn-bedrock-input-token-count";
/// The output count's header.
pub const BEDROCK_OUTPUT_TOKENS_HEADER: &str = "x-amzn-bedrock-output-token-count";
/// The cache reads' header.
pub const BEDROCK_CACHE_READ_HEADER: &str = "x-amzn-bedrock-cache-read-input-token-count";
/// The cache writes' header.
pub const BEDROCK_CACHE_WRITE_HEADER: &str = "x-amzn-bedrock-cache-write-input-token-count";

/// The usage Bedrock's headers report on a whole answer (`None` without both
/// the input and output counts): read when the body holds no usage.
pub fn usage_of_bedrock_headers(headers: &axum::http::HeaderMap) -> Option<Usage> {
    let count = |name: &str| headers.get(name)?.to_str().ok()?.trim().parse::<u64>().ok();
    let written = count(BEDROCK_CACHE_WRITE_HEADER).unwrap_or(0);
    Some(Usage {
        input_tokens: count(BEDROCK_INPUT_TOKENS_HEADER)?.saturating_add(written),
        output_tokens: count(BEDROCK_OUTPUT_TOKENS_HEADER)?,
        cache_read_tokens: count(BEDROCK_CACHE_READ_HEADER).unwrap_or(0),
        cache_write_tokens: written,
        ..Usage::default()
    })
}

/// The field of Bedrock's last stream event holding the call's token counts
/// (<https://docs.aws.amazon.com/bedrock/latest/userguide/model-parameters-anthropic-claude-messages-request-response.html>).
pub const BEDROCK_METRICS_FIELD: &str = "amazon-bedrock-invocationMetrics";

impl StreamUsage {
    /// Bedrock's `message_stop` carries the counts it bills and throttles on
    /// (`inputTokenCount` without the cache's, `cacheReadInputTokenCount`,
    /// `cacheWriteInputTokenCount`, `outputTokenCount`): they are the final usage.
    fn on_bedrock_metrics(&mut self, stop: &Value) {
        let Some(metrics) = stop.get(BEDROCK_METRICS_FIELD) else {
            return;
        };
        let count = |name: &str| metrics.get(name).map(Value::as_u64);
        let (Some(Some(input)), Some(Some(output))) = (count("inputTokenCount"), count("outputTokenCount")) else {
            self.malformed = true;
            return;
        };
        let written = count("cacheWriteInputTokenCount").flatten().unwrap_or(0);
        let mut usage = self.usage.unwrap_or_default();
        usage.input_tokens = input.saturating_add(written);
        usage.output_tokens = output;
        usage.cache_read_tokens = count("cacheReadInputTokenCount").flatten().unwrap_or(0);
        if usage.cache_write_tokens.saturating_add(usage.cache_write_1h_tokens) != written {
            // The stream's own split of the writes, else all at the 5-minute rate.
            usage.cache_write_tokens = written;
            usage.cache_write_1h_tokens = 0;
        }
        self.usage = Some(usage);
        self.final_seen = true;
    }
}

/// The facts of a parsed stream event: `message_start`'s message id and
/// model, `message_delta`'s `delta.stop_reason`, an `error` event's type.
fn read_facts(facts: &mut ResponseFacts, value: &Value) {
    if let Some(message) = value.get("message") {
        facts.read_id_and_model(message);
    }
    if let Some(reason) = short_string(value.get("delta").and_then(|d| d.get("stop_reason"))) {
        facts.push_reason(&reason);
    }
    if let Some(error) = value.get("error") {
        facts.read_error(error);
    }
    let text = value.get("delta").and_then(|d| d.get("text")).and_then(Value::as_str);
    if let (Some(texts), Some(text)) = (&mut facts.texts, text) {
        // One message: its text blocks read as one text.
        append_text(texts, 0, text);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Encoding;
    use crate::wire::call::parse_object;
    use serde_json::json;

    #[test]
    fn max_tokens_and_messages_are_required() {
        let counter = Counter::new(Encoding::Bytes, crate::counting::model_table::lookup("claude"));
        let read = |body: Value| {
            let bytes = Bytes::from(body.to_string());
            read_call(parse_object(&bytes).unwrap(), &counter, bytes)
        };
        let ok = read(json!({"model": "c", "max_tokens": 50, "messages": [{"role": "user", "content": "hey"}]}));
        let call = ok.unwrap();
        assert_eq!((call.input_tokens, call.output_tokens), (8 + 3, 50));
        assert!(read(json!({"model": "c", "messages": []})).is_err());
        assert!(read(json!({"model": "c", "max_tokens": 5})).is_err());
        assert!(read(json!({"model": "c", "max_tokens": "5", "messages": []})).is_err());
    }

    #[test]
    fn bedrock_s_headers_give_a_whole_answer_s_usage() {
        let mut headers = axum::http::HeaderMap::new();
        headers.insert(BEDROCK_INPUT_TOKENS_HEADER, "12".parse().unwrap());
        assert_eq!(usage_of_bedrock_headers(&headers), None, "no output count");
        headers.insert(BEDROCK_OUTPUT_TOKENS_HEADER, "5".parse().unwrap());
        headers.insert(BEDROCK_CACHE_WRITE_HEADER, "3".parse().unwrap());
        let usage = usage_of_bedrock_headers(&headers).unwrap();
        assert_eq!(
            (usage.input_tokens, usage.output_tokens, usage.cache_write_tokens),
            (15, 5, 3)
        );
    }

    #[test]
    fn bedrock_s_invocation_metrics_are_the_final_usage() {
        let mut reader = StreamUsage::default();
        let start = b"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":20,\"output_tokens\":1}}}\n\n";
        reader.on_event(start);
        assert_eq!(reader.final_usage(), None, "no delta, no metrics yet");
        let stop = b"event: message_stop\ndata: {\"type\":\"message_stop\",\"amazon-bedrock-invocationMetrics\":{\"inputTokenCount\":21,\"outputTokenCount\":9,\"cacheReadInputTokenCount\":4,\"cacheWriteInputTokenCount\":2,\"invocationLatency\":5,\"firstByteLatency\":1}}\n\n";
        reader.on_event(stop);
        let usage = reader.final_usage().unwrap();
        assert_eq!(
            (usage.input_tokens, usage.output_tokens, usage.cache_read_tokens),
            (23, 9, 4)
        );
        assert_eq!(usage.cache_write_tokens, 2);
        let mut plain = StreamUsage::default();
        plain.on_event(b"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n");
        assert_eq!(plain.final_usage(), None, "Anthropic's own stop carries nothing");
    }

    #[test]
    fn stream_usage_takes_the_last_cumulative_delta() {
        let mut reader = StreamUsage::default();
        let start = b"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":20,\"cache_creation_input_tokens\":5,\"cache_read_input_tokens\":7,\"output_tokens\":1}}}\n\n";
        reader.on_event(start);
        assert!(!reader.final_seen);
        let delta = |n: u64| {
            format!(
                "event: message_delta\ndata: {{\"type\":\"message_delta\",\"usage\":{{\"output_tokens\":{n}}}}}\n\n"
            )
        };
        reader.on_event(delta(10).as_bytes());
        reader.on_event(delta(15).as_bytes());
        let usage = reader.usage.unwrap();
        assert_eq!(
            (usage.input_tokens, usage.output_tokens, usage.cache_read_tokens),
            (25, 15, 7)
        );
        assert!(reader.final_seen);
        let mut traced = StreamUsage {
            facts: Some(ResponseFacts::default()),
            ..StreamUsage::default()
        };
        let start = b"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"model\":\"claude-x\",\"usage\":{\"input_tokens\":2}}}\n\n";
        let stop = b"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"max_tokens\"},\"usage\":{\"output_tokens\":3}}\n\n";
        let error = b"event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\"}}\n\n";
        for event in [&start[..], stop, error] {
            traced.on_event(event);
        }
        let facts = traced.facts.unwrap();
        assert_eq!(
            (facts.id.as_deref(), facts.model.as_deref()),
            (Some("msg_1"), Some("claude-x"))
        );
        assert_eq!(facts.finish_reasons, ["max_tokens"]);
        assert_eq!(facts.error_type.as_deref(), Some("overloaded_error"));
        let body = json!({"usage": {"input_tokens": 3, "output_tokens": 4, "cache_creation_input_tokens": 2}});
        assert_eq!(usage_of_body(body.to_string().as_bytes()).unwrap().input_tokens, 5);
    }

    #[test]
    fn a_malformed_stream_usage_keeps_the_reservation() {
        let start = b"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":20,\"output_tokens\":1}}}\n\n";
        for field in ["-15", "null", "\"15\""] {
            let delta = format!("event: message_delta\ndata: {{\"type\":\"message_delta\",\"usage\":{{\"output_tokens\":{field}}}}}\n\n");
            let mut reader = StreamUsage::default();
            reader.on_event(start);
            reader.on_event(delta.as_bytes());
            let last = |reader: StreamUsage| reader.final_usage();
            assert_eq!(last(reader), None, "{field}: no usage, not 0");
            let body = format!(r#"{{"usage":{{"input_tokens":20,"output_tokens":{field}}}}}"#);
            assert_eq!(usage_of_body(body.as_bytes()), None, "{field}: the same answer whole");
            let mut reader = StreamUsage::default();
            let start = format!("event: message_start\ndata: {{\"type\":\"message_start\",\"message\":{{\"usage\":{{\"input_tokens\":{field}}}}}}}\n\n");
            reader.on_event(start.as_bytes());
            reader.on_event(
                b"event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":3}}\n\n",
            );
            assert_eq!(last(reader), None, "{field} in message_start");
        }
    }

    #[test]
    fn cache_writes_are_priced_by_their_lifetime() {
        let body = json!({"usage": {"input_tokens": 100, "cache_creation_input_tokens": 3000,
            "cache_creation": {"ephemeral_5m_input_tokens": 2000, "ephemeral_1h_input_tokens": 1000},
            "cache_read_input_tokens": 6000, "output_tokens": 500}});
        let usage = usage_of_body(body.to_string().as_bytes()).unwrap();
        let expected = ratelimiter::price::Usage {
            input_tokens: 100,
            cache_read_tokens: 6_000,
            cache_write_tokens: 2_000,
            cache_write_1h_tokens: 1_000,
            output_tokens: 500,
        };
        assert_eq!(usage.priced(), expected);
        assert_eq!(usage.input_tokens, 3_100, "the input limit still counts every write");
        // Without the split, every write is a 5-minute one.
        let body = json!({"usage": {"input_tokens": 1, "cache_creation_input_tokens": 30, "output_tokens": 2}});
        let priced = usage_of_body(body.to_string().as_bytes()).unwrap().priced();
        assert_eq!(
            (
                priced.input_tokens,
                priced.cache_write_tokens,
                priced.cache_write_1h_tokens
            ),
            (1, 30, 0)
        );
        // A stream: message_start carries the writes; a message_delta with the output only keeps them.
        let mut stream = StreamUsage::default();
        let start = json!({"type": "message_start", "message": {"usage": {"input_tokens": 100,
            "cache_creation_input_tokens": 3000, "cache_creation": {"ephemeral_5m_input_tokens": 2000,
            "ephemeral_1h_input_tokens": 1000}, "cache_read_input_tokens": 6000, "output_tokens": 1}}});
        let delta = json!({"type": "message_delta", "usage": {"output_tokens": 500}});
        stream.on_event(format!("event: message_start\ndata: {start}\n\n").as_bytes());
        stream.on_event(format!("event: message_delta\ndata: {delta}\n\n").as_bytes());
        assert_eq!(stream.usage.unwrap().priced(), expected);
    }

    #[test]
    fn cache_reads_are_billed_but_not_on_the_input_limit() {
        // 50 input, 300 cache writes, 5,000 cache reads, 0 output: 5,350 billed,
        // 350 on ITPM.
        let body = json!({"usage": {"input_tokens": 50, "cache_creation_input_tokens": 300,
            "cache_read_input_tokens": 5000, "output_tokens": 0}});
        let usage = usage_of_body(body.to_string().as_bytes()).unwrap();
        assert_eq!((usage.input_tokens, usage.billed()), (350, 5_350));
    }
}
