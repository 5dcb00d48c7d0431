//! OpenAI's wire format: chat completions, embeddings and responses requests,
//! their usage, and their streams (docs/gateway.md, "OpenAI").

use bytes::Bytes;
use serde_json::{Map, Value};

use crate::config::UpstreamKind;
use crate::counting::tokens::{prompt_characters, Counter};
use crate::wire::call::{optional_bool, optional_u64, required_array, Call, Endpoint};
use crate::wire::content::texts_of_answer;
use crate::wire::error::GatewayError;
use crate::wire::response_facts::{may_finish, ResponseFacts};
use crate::wire::sse;
use crate::wire::usage::{EventAction, Usage, UsageFields};

/// The most choices one chat request may ask for (OpenAI's documented maximum).
pub const N_MAX: u64 = 128;

/// Reads a request of `endpoint` (an OpenAI one): checks the fields the gateway
/// relies on, counts the prompt, bounds the output, and asks a stream for usage.
pub fn read_call(
    endpoint: Endpoint,
    object: Map<String, Value>,
    counter: &Counter,
    body: Bytes,
) -> Result<Call, GatewayError> {
    // Counted in place: the object moves into a value the counter reads, never copied.
    let request = Value::Object(object);
    let prompt_characters = prompt_characters(&request);
    match endpoint {
        Endpoint::Embeddings => read_embeddings(&request, counter, prompt_characters, body),
        Endpoint::ChatCompletions => read_chat(request, counter, prompt_characters, body),
        Endpoint::Responses => read_responses(&request, counter, prompt_characters, body),
        Endpoint::Messages | Endpoint::CountTokens => unreachable!("an Anthropic endpoint in the OpenAI reader"),
    }
}

/// An embeddings request: its input counted, no output.
fn read_embeddings(
    request: &Value,
    counter: &Counter,
    prompt_characters: u64,
    body: Bytes,
) -> Result<Call, GatewayError> {
    let object = request.as_object().expect("built from an object");
    let input = match object.get("input") {
        Some(input @ (Value::String(_) | Value::Array(_))) => input,
        Some(_) => return Err(GatewayError::invalid("input: must be a string or an array.")),
        None => return Err(GatewayError::invalid("input: Field required.")),
    };
    Ok(Call {
        stream: false,
        input_tokens: counter.openai_embeddings(input),
        prompt_characters,
        output_tokens: 0,
        calibration_sample: None,
        drop_usage_chunk: false,
        upstream_body: body,
        bound_to_send: None,
    })
}

/// A chat completions request: its messages counted per choice, its output
/// bounded per choice, and a stream asked for its usage chunk.
fn read_chat(mut request: Value, counter: &Counter, prompt_characters: u64, body: Bytes) -> Result<Call, GatewayError> {
    let object = request.as_object().expect("built from an object");
    let messages = required_array(object, "messages")?;
    if messages.is_empty() || !messages.iter().all(|m| m.get("role").is_some_and(Value::is_string)) {
        return Err(GatewayError::invalid(
            "messages: must be a non-empty array of objects with a string role.",
        ));
    }
    let stream = optional_bool(object, "stream")?;
    let n = optional_u64(object, "n")?.unwrap_or(1);
    if !(1..=N_MAX).contains(&n) {
        return Err(GatewayError::invalid(format!("n: must be 1..={N_MAX}.")));
    }
    let named = optional_u64(object, "max_completion_tokens")?.or(optional_u64(object, "max_tokens")?);
    let bound = named.unwrap_or(counter.output_default_tokens);
    let tally = counter.openai_chat(&request);
    let wants_usage = match object.get("stream_options") {
        None | Some(Value::Null) => false,
        Some(Value::Object(options)) => optional_bool(options, "include_usage")?,
        Some(_) => return Err(GatewayError::invalid("stream_options: must be an object.")),
    };
    let drop_usage_chunk = stream && !wants_usage;
    let upstream_body = if drop_usage_chunk {
        // The usage chunk is how the gateway learns a stream's usage; the
        // client did not ask for it, so it is removed on the way back.
        let object = request.as_object_mut().expect("built from an object");
        let options = object
            .entry("stream_options")
            .or_insert_with(|| Value::Object(Map::new()));
        if let Value::Object(options) = options {
            options.insert("include_usage".into(), Value::Bool(true));
        }
        Bytes::from(serde_json::to_vec(&request).expect("a JSON object serializes"))
    } else {
        body
    };
    Ok(Call {
        stream,
        // OpenAI counts the prompt once per request and the output per choice;
        // the reservation charges the prompt per choice too, which never under-counts.
        input_tokens: counter.reserve(tally).saturating_mul(n),
        prompt_characters: prompt_characters.saturating_mul(n),
        output_tokens: bound.saturating_mul(n),
        calibration_sample: counter.calibration_sample(tally),
        drop_usage_chunk,
        upstream_body,
        bound_to_send: named.is_none().then_some(bound),
    })
}

/// A Responses API request: its input counted, its output bounded.
fn read_responses(
    request: &Value,
    counter: &Counter,
    prompt_characters: u64,
    body: Bytes,
) -> Result<Call, GatewayError> {
    let object = request.as_object().expect("built from an object");
    match object.get("input") {
        None | Some(Value::String(_) | Value::Array(_)) => {}
        Some(_) => return Err(GatewayError::invalid("input: must be a string or an array.")),
    }
    let stream = optional_bool(object, "stream")?;
    let named = optional_u64(object, "max_output_tokens")?;
    let bound = named.unwrap_or(counter.output_default_tokens);
    let tally = counter.openai_responses(request);
    Ok(Call {
        stream,
        input_tokens: counter.reserve(tally),
        prompt_characters,
        output_tokens: bound,
        calibration_sample: counter.calibration_sample(tally),
        drop_usage_chunk: false,
        upstream_body: body,
        bound_to_send: named.is_none().then_some(bound),
    })
}

/// The output bound fields of OpenAI's requests: an upstream body carries at
/// most the one [`bound_field`] names, never another one left `null`.
const BOUND_FIELDS: [&str; 3] = ["max_completion_tokens", "max_tokens", "max_output_tokens"];

/// The field in which a deployment of wire format `kind` (as
/// `UpstreamConfig::format_of` gives it: Bedrock's and Vertex's OpenAI-format
/// models are `OpenaiCompatible`) reads the output bound of an
/// `endpoint` call, `None` where the gateway never adds one (Anthropic's
/// `max_tokens` is required, embeddings have no output). Chat on OpenAI (and
/// Azure OpenAI, the same kind) takes `max_completion_tokens`: `max_tokens` is
/// deprecated there and refused by the o-series models
/// (<https://platform.openai.com/docs/api-reference/chat/create>); an
/// OpenAI-compatible server (vLLM, Ollama) is sent `max_tokens`, the field they
/// all read (Ollama's compatibility layer documents no other).
pub fn bound_field(endpoint: Endpoint, kind: UpstreamKind) -> Option<&'static str> {
    match (endpoint, kind) {
        (Endpoint::Responses, _) => Some("max_output_tokens"),
        (Endpoint::ChatCompletions, UpstreamKind::Openai | UpstreamKind::Azure) => Some("max_completion_tokens"),
        (Endpoint::ChatCompletions, UpstreamKind::OpenaiCompatible) => Some("max_tokens"),
        _ => None,
    }
}

/// Writes `bound` in `field` of a request `object` that named none (a bound
/// field left `null` is removed, so the upstream reads one bound only).
pub fn set_bound(object: &mut Map<String, Value>, (field, bound): (&str, u64)) {
    for name in BOUND_FIELDS {
        if object.get(name).is_some_and(Value::is_null) {
            object.remove(name);
        }
    }
    object.insert(field.to_owned(), Value::from(bound));
}

/// The usage of a whole (non-stream) answer of `endpoint`, from its JSON bytes.
pub fn usage_of_body(endpoint: Endpoint, body: &[u8]) -> Option<Usage> {
    UsageFields::of_answer(body).map(|fields| usage_of(endpoint, &fields))
}

/// OpenAI's usage: `prompt_tokens` (Responses: `input_tokens`) already holds
/// the cached part (`prompt_tokens_details.cached_tokens` is a share of it) and
/// `completion_tokens` (`output_tokens`) the reasoning part
/// (`completion_tokens_details.reasoning_tokens`), so both are what is billed
/// and counted on tpm as they stand
/// (<https://platform.openai.com/docs/api-reference/chat/object>, `usage`).
fn usage_of(endpoint: Endpoint, usage: &UsageFields) -> Usage {
    let (input_tokens, output_tokens) = match endpoint {
        Endpoint::Responses => (usage.input_tokens, usage.output_tokens),
        _ => (usage.prompt_tokens, usage.completion_tokens),
    };
    Usage {
        input_tokens,
        output_tokens,
        // The cached share is billed at the cache-read price (a budget in money).
        cached_input_tokens: usage.cached_tokens().min(input_tokens),
        ..Usage::default()
    }
}

/// Usage from an OpenAI stream, event by event.
#[derive(Debug)]
pub struct StreamUsage {
    endpoint: Endpoint,
    drop_usage_chunk: bool,
    /// The usage seen, once its event passed.
    pub usage: Option<Usage>,
    /// The Responses API's id, read from the event that carried the usage.
    pub response_id: Option<String>,
    /// The conversation of that response (its `conversation`), when it has one.
    pub conversation: Option<Value>,
    /// Whether a usage with a field that is not a non-negative integer was seen:
    /// the call then keeps its reservation, as the same answer whole would.
    malformed: bool,
    /// What the stream says of its response, read only when the call is traced.
    pub facts: Option<ResponseFacts>,
}

impl StreamUsage {
    /// A reader for a stream of `endpoint`; `drop_usage_chunk` as [`Call`] decided.
    pub fn new(endpoint: Endpoint, drop_usage_chunk: bool) -> Self {
        Self {
            endpoint,
            drop_usage_chunk,
            usage: None,
            response_id: None,
            conversation: None,
            malformed: false,
            facts: None,
        }
    }

    /// Whether this event is parsed for the stream's facts: a chat stream's
    /// first chunk (its id and model) and a chunk that finishes a choice; the
    /// Responses API's come with its usage.
    fn wants_facts(&self, data: &[u8]) -> bool {
        match &self.facts {
            Some(facts) if self.endpoint != Endpoint::Responses => {
                facts.id.is_none() || facts.texts.is_some() || may_finish(data)
            }
            _ => false,
        }
    }

    /// Reads one event: chat's usage chunk (`choices` empty, `usage` set), or the
    /// responses API's final `response.completed` / `.incomplete` / `.failed`.
    pub fn on_event(&mut self, event: &[u8]) -> EventAction {
        let Some(data) = sse::data(event) else {
            return EventAction::Forward;
        };
        // Most chunks carry `"usage":null` or none: parse only those that may
        // hold usage, or the facts of a traced call's response.
        let may_hold_usage = contains(&data, b"\"usage\"");
        if !may_hold_usage && !self.wants_facts(&data) {
            return EventAction::Forward;
        }
        let Ok(value) = serde_json::from_slice::<Value>(&data) else {
            return EventAction::Forward;
        };
        if let Some(facts) = self.facts.as_mut().filter(|_| self.endpoint != Endpoint::Responses) {
            facts.read_chat(&value);
        }
        if !may_hold_usage {
            return EventAction::Forward;
        }
        let usage = match self.endpoint {
            Endpoint::Responses => value.get("response").and_then(|r| r.get("usage")),
            _ => value.get("usage"),
        };
        let Some(usage) = usage.filter(|u| u.is_object()) else {
            return EventAction::Forward;
        };
        let fields = UsageFields::of_value(usage);
        self.malformed |= fields.is_none();
        self.usage = fields
            .filter(|_| !self.malformed)
            .map(|fields| usage_of(self.endpoint, &fields));
        if self.endpoint == Endpoint::Responses {
            let id = value.get("response").and_then(|r| r.get("id")).and_then(Value::as_str);
            self.response_id = id.map(str::to_owned);
            self.conversation = value.get("response").and_then(|r| r.get("conversation")).cloned();
            if let (Some(facts), Some(response)) = (&mut self.facts, value.get("response")) {
                facts.read_id_and_model(response);
                if let Some(status) = response.get("status").and_then(Value::as_str) {
                    facts.push_reason(status);
                }
                if let (Some(texts), Some(output)) = (&mut facts.texts, response.get("output")) {
                    *texts = texts_of_answer(Endpoint::Responses, output);
                }
            }
        }
        let usage_only = value
            .get("choices")
            .and_then(Value::as_array)
            .is_some_and(Vec::is_empty);
        if self.drop_usage_chunk && usage_only {
            EventAction::Drop
        } else {
            EventAction::Forward
        }
    }
}

pub(crate) fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    memchr::memmem::find(haystack, needle).is_some()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Encoding;
    use crate::wire::call::parse_object;
    use serde_json::json;

    #[test]
    fn usage_holds_cached_and_reasoning_tokens_as_billed() {
        // Chat: 1,000 prompt tokens of which 800 cached, 300 completion of which
        // 200 reasoning: 1,300 billed, counted once each.
        let chat = br#"{"usage":{"prompt_tokens":1000,"completion_tokens":300,"total_tokens":1300,
            "prompt_tokens_details":{"cached_tokens":800},"completion_tokens_details":{"reasoning_tokens":200}}}"#;
        let usage = usage_of_body(Endpoint::ChatCompletions, chat).unwrap();
        assert_eq!((usage.total(), usage.billed()), (1_300, 1_300));
        let responses = br#"{"usage":{"input_tokens":1000,"output_tokens":300,
            "input_tokens_details":{"cached_tokens":800},"output_tokens_details":{"reasoning_tokens":200}}}"#;
        let usage = usage_of_body(Endpoint::Responses, responses).unwrap();
        assert_eq!((usage.input_tokens, usage.billed()), (1_000, 1_300));
    }

    #[test]
    fn the_cached_share_of_the_prompt_is_priced_as_a_cache_read() {
        let chat = br#"{"usage":{"prompt_tokens":1000,"completion_tokens":300,
            "prompt_tokens_details":{"cached_tokens":800},"completion_tokens_details":{"reasoning_tokens":200}}}"#;
        let priced = usage_of_body(Endpoint::ChatCompletions, chat).unwrap().priced();
        let expected = ratelimiter::price::Usage {
            input_tokens: 200,
            cache_read_tokens: 800,
            output_tokens: 300,
            ..Default::default()
        };
        assert_eq!(priced, expected, "reasoning stays within the output");
        let responses =
            br#"{"usage":{"input_tokens":1000,"output_tokens":10,"input_tokens_details":{"cached_tokens":600}}}"#;
        let priced = usage_of_body(Endpoint::Responses, responses).unwrap().priced();
        assert_eq!((priced.input_tokens, priced.cache_read_tokens), (400, 600));
        // Details absent or null (OpenAI-compatible servers): every prompt token as input.
        let bare = br#"{"usage":{"prompt_tokens":50,"completion_tokens":5,"prompt_tokens_details":null}}"#;
        let priced = usage_of_body(Endpoint::ChatCompletions, bare).unwrap().priced();
        assert_eq!((priced.input_tokens, priced.cache_read_tokens), (50, 0));
        // A cached share above the prompt (a server's error) is capped at the prompt.
        let odd = br#"{"usage":{"prompt_tokens":5,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":9}}}"#;
        let priced = usage_of_body(Endpoint::ChatCompletions, odd).unwrap().priced();
        assert_eq!((priced.input_tokens, priced.cache_read_tokens), (0, 5));
    }

    fn counter() -> Counter {
        let mut counter = Counter::new(Encoding::O200kBase, crate::counting::model_table::lookup("gpt-4o"));
        counter.output_default_tokens = 4096;
        counter
    }

    fn read(endpoint: Endpoint, body: Value) -> Result<Call, GatewayError> {
        let bytes = Bytes::from(body.to_string());
        read_call(endpoint, parse_object(&bytes).unwrap(), &counter(), bytes)
    }

    #[test]
    fn chat_bounds_and_usage_request() {
        let body = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "n": 2,
            "max_tokens": 10, "stream": true});
        let call = read(Endpoint::ChatCompletions, body.clone()).unwrap();
        assert_eq!(call.output_tokens, 20);
        assert_eq!(call.input_tokens, 2 * counter().openai_chat(&body).total());
        assert!(call.drop_usage_chunk);
        let sent: Value = serde_json::from_slice(&call.upstream_body).unwrap();
        assert_eq!(sent["stream_options"]["include_usage"], true);
        let mut asked = body.clone();
        asked["stream_options"] = json!({"include_usage": true});
        asked["max_completion_tokens"] = json!(7);
        let call = read(Endpoint::ChatCompletions, asked.clone()).unwrap();
        assert!(!call.drop_usage_chunk);
        assert_eq!(call.output_tokens, 14);
        assert_eq!(call.upstream_body, Bytes::from(asked.to_string()));
        let plain = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]});
        assert_eq!(read(Endpoint::ChatCompletions, plain).unwrap().output_tokens, 4096);
    }

    #[test]
    fn a_call_without_a_bound_is_sent_the_bound_it_was_reserved_at() {
        let mut plain = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "n": 3});
        let call = read(Endpoint::ChatCompletions, plain.clone()).unwrap();
        // Per choice, as the field is.
        assert_eq!((call.output_tokens, call.bound_to_send), (3 * 4096, Some(4096)));
        plain["max_tokens"] = json!(9);
        assert_eq!(read(Endpoint::ChatCompletions, plain).unwrap().bound_to_send, None);
        let responses = read(Endpoint::Responses, json!({"model": "m", "input": "hi"})).unwrap();
        assert_eq!(responses.bound_to_send, Some(4096));
        let named = read(
            Endpoint::Responses,
            json!({"model": "m", "input": "hi", "max_output_tokens": 5}),
        );
        assert_eq!(named.unwrap().bound_to_send, None);
        let field = |endpoint, kind| bound_field(endpoint, kind);
        assert_eq!(
            field(Endpoint::ChatCompletions, UpstreamKind::Openai),
            Some("max_completion_tokens")
        );
        assert_eq!(
            field(Endpoint::ChatCompletions, UpstreamKind::OpenaiCompatible),
            Some("max_tokens")
        );
        assert_eq!(
            field(Endpoint::Responses, UpstreamKind::Openai),
            Some("max_output_tokens")
        );
        assert_eq!(field(Endpoint::Embeddings, UpstreamKind::Openai), None);
        let mut object = json!({"model": "m", "max_tokens": null}).as_object().unwrap().clone();
        set_bound(&mut object, ("max_completion_tokens", 64));
        assert_eq!(
            Value::Object(object),
            json!({"model": "m", "max_completion_tokens": 64})
        );
    }

    #[test]
    fn wrong_types_are_400s() {
        for body in [
            json!({"model": "m"}),
            json!({"model": "m", "messages": "hi"}),
            json!({"model": "m", "messages": []}),
            json!({"model": "m", "messages": [{"content": "x"}]}),
            json!({"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": "5"}),
            json!({"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": -1}),
            json!({"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": "yes"}),
            json!({"model": "m", "messages": [{"role": "user", "content": "x"}], "n": 0}),
        ] {
            assert!(read(Endpoint::ChatCompletions, body.clone()).is_err(), "{body}");
        }
        assert!(read(Endpoint::Embeddings, json!({"model": "m"})).is_err());
        assert!(read(Endpoint::Responses, json!({"model": "m", "input": 5})).is_err());
    }

    #[test]
    fn stream_usage_is_read_and_the_extra_chunk_dropped() {
        let mut reader = StreamUsage::new(Endpoint::ChatCompletions, true);
        let chunk = b"data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}],\"usage\":null}\n\n";
        assert_eq!(reader.on_event(chunk), EventAction::Forward);
        assert_eq!(reader.usage, None);
        let usage = b"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":4}}\n\n";
        assert_eq!(reader.on_event(usage), EventAction::Drop);
        assert_eq!(reader.usage.unwrap().total(), 13);
        assert_eq!(reader.on_event(b"data: [DONE]\n\n"), EventAction::Forward);
        let mut kept = StreamUsage::new(Endpoint::ChatCompletions, false);
        assert_eq!(kept.on_event(usage), EventAction::Forward);
        let mut traced = StreamUsage::new(Endpoint::ChatCompletions, true);
        traced.facts = Some(ResponseFacts::default());
        let first =
            b"data: {\"id\":\"c1\",\"model\":\"gpt-4o-x\",\"choices\":[{\"delta\":{},\"finish_reason\":null}]}\n\n";
        let last = b"data: {\"id\":\"c1\",\"choices\":[{\"delta\":{},\"finish_reason\":\"length\"}]}\n\n";
        for event in [&first[..], chunk, last, usage] {
            traced.on_event(event);
        }
        let facts = traced.facts.unwrap();
        assert_eq!(
            (facts.id.as_deref(), facts.model.as_deref()),
            (Some("c1"), Some("gpt-4o-x"))
        );
        assert_eq!(facts.finish_reasons, ["length"]);
        let mut responses = StreamUsage::new(Endpoint::Responses, false);
        responses.facts = Some(ResponseFacts::default());
        let done = b"event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"usage\":{\"input_tokens\":5,\"output_tokens\":6}}}\n\n";
        assert_eq!(responses.on_event(done), EventAction::Forward);
        assert_eq!(responses.usage.unwrap().output_tokens, 6);
        let facts = responses.facts.unwrap();
        assert_eq!((facts.id, facts.finish_reasons), (None, Vec::<String>::new()));
    }

    #[test]
    fn a_malformed_stream_usage_keeps_the_reservation() {
        for field in ["-4", "null", "\"4\""] {
            for endpoint in [Endpoint::ChatCompletions, Endpoint::Responses] {
                let usage = format!(
                    r#"{{"prompt_tokens":9,"completion_tokens":{field},"input_tokens":9,"output_tokens":{field}}}"#
                );
                let event = match endpoint {
                    Endpoint::Responses => {
                        format!("data: {{\"type\":\"response.completed\",\"response\":{{\"usage\":{usage}}}}}\n\n")
                    }
                    _ => format!("data: {{\"choices\":[],\"usage\":{usage}}}\n\n"),
                };
                let mut reader = StreamUsage::new(endpoint, true);
                reader.on_event(event.as_bytes());
                assert_eq!(reader.usage, None, "{endpoint:?} {field}: no usage, not 0");
                assert_eq!(
                    usage_of_body(endpoint, format!(r#"{{"usage":{usage}}}"#).as_bytes()),
                    None
                );
                // A later well-formed usage does not undo it.
                let good = b"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":4}}\n\n";
                reader.on_event(good);
                assert_eq!(reader.usage, None);
            }
        }
    }
}
