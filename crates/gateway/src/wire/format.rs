//! The one dispatch on the wire format: what differs between OpenAI's API and
//! Anthropic's, for a call of one endpoint, chosen here and nowhere else: how
//! its request is read, how the usage of its whole answer and of its stream's
//! events is read, which upstreams serve it, and the list of models.

use axum::http::HeaderMap;
use bytes::Bytes;
use serde_json::{json, Map, Value};

use super::call::{Call, Endpoint};
use super::error::{Format, GatewayError};
use super::response_facts::ResponseFacts;
use super::usage::{EventAction, Usage};
use super::{anthropic, openai};
use crate::config::UpstreamKind;
use crate::counting::tokens::Counter;

impl Endpoint {
    /// The call of `object` (the request `body`, parsed), counted by `counter`.
    pub fn read_call(self, object: Map<String, Value>, counter: &Counter, body: Bytes) -> Result<Call, GatewayError> {
        match self.format() {
            Format::OpenAi => openai::read_call(self, object, counter, body),
            Format::Anthropic => anthropic::read_call(object, counter, body),
        }
    }

    /// The usage of a whole answer's `body`, if it reports one.
    pub fn usage_of_body(self, body: &[u8]) -> Option<Usage> {
        match self.format() {
            Format::OpenAi => openai::usage_of_body(self, body),
            Format::Anthropic => anthropic::usage_of_body(body),
        }
    }

    /// The reader of a streamed answer's usage; `drop_usage_chunk` as [`Call`] decided.
    pub fn stream_usage(self, drop_usage_chunk: bool) -> StreamUsage {
        match self.format() {
            Format::OpenAi => StreamUsage::OpenAi(openai::StreamUsage::new(self, drop_usage_chunk)),
            Format::Anthropic => StreamUsage::Anthropic(anthropic::StreamUsage::default()),
        }
    }
}

impl Format {
    /// The format of answers to paths that belong to neither provider:
    /// Anthropic's SDKs send `anthropic-version` on every call.
    pub fn of_headers(headers: &HeaderMap) -> Format {
        if headers.contains_key("anthropic-version") {
            Format::Anthropic
        } else {
            Format::OpenAi
        }
    }

    /// The body of `GET /v1/models` listing `entries` (each model's name and
    /// the upstream that serves it), in this format's shape.
    pub fn models_list<'a>(self, entries: impl Iterator<Item = (&'a String, &'a str)>) -> Value {
        match self {
            Format::OpenAi => {
                let data: Vec<_> = entries
                    .map(|(id, owner)| json!({"id": id, "object": "model", "created": 0, "owned_by": owner}))
                    .collect();
                json!({"object": "list", "data": data})
            }
            Format::Anthropic => {
                let data: Vec<_> = entries
                    .map(|(id, _)| json!({"id": id, "type": "model", "display_name": id, "created_at": "1970-01-01T00:00:00Z"}))
                    .collect();
                let first = data.first().and_then(|m| m["id"].as_str().map(str::to_owned));
                let last = data.last().and_then(|m| m["id"].as_str().map(str::to_owned));
                json!({"data": data, "has_more": false, "first_id": first, "last_id": last})
            }
        }
    }

    /// Whether a deployment whose wire format is `kind` (as
    /// `UpstreamConfig::format_of` gives it) speaks this format (an
    /// OpenAI-compatible server speaks OpenAI's).
    pub fn is_spoken_by(self, kind: UpstreamKind) -> bool {
        match self {
            Format::OpenAi => kind.is_openai(),
            Format::Anthropic => kind == UpstreamKind::Anthropic,
        }
    }
}

/// How a stream's usage is read, per provider.
#[derive(Debug)]
pub enum StreamUsage {
    /// OpenAI's chat and responses streams.
    OpenAi(openai::StreamUsage),
    /// Anthropic's Messages streams.
    Anthropic(anthropic::StreamUsage),
}

impl StreamUsage {
    /// Reads one whole event: whether it goes on to the client.
    pub fn on_event(&mut self, event: &[u8]) -> EventAction {
        match self {
            StreamUsage::OpenAi(reader) => reader.on_event(event),
            StreamUsage::Anthropic(reader) => reader.on_event(event),
        }
    }

    /// The Responses API's id, read with the final usage (OpenAI only).
    pub fn response_id(&self) -> Option<&str> {
        match self {
            StreamUsage::OpenAi(reader) => reader.response_id.as_deref(),
            StreamUsage::Anthropic(_) => None,
        }
    }

    /// The conversation of that response, read with it (OpenAI only).
    pub fn conversation(&self) -> Option<&serde_json::Value> {
        match self {
            StreamUsage::OpenAi(reader) => reader.conversation.as_ref(),
            StreamUsage::Anthropic(_) => None,
        }
    }

    /// This reader reading the stream's [`ResponseFacts`] too (a traced call).
    pub fn with_facts(mut self) -> Self {
        match &mut self {
            StreamUsage::OpenAi(reader) => reader.facts = Some(ResponseFacts::default()),
            StreamUsage::Anthropic(reader) => reader.facts = Some(ResponseFacts::default()),
        }
        self
    }

    /// This reader reading the stream's facts and its text (the operator
    /// opted in to message content).
    pub fn with_content(self) -> Self {
        let mut reader = self.with_facts();
        match &mut reader {
            StreamUsage::OpenAi(r) => r.facts.iter_mut().for_each(|f| f.texts = Some(Vec::new())),
            StreamUsage::Anthropic(r) => r.facts.iter_mut().for_each(|f| f.texts = Some(Vec::new())),
        }
        reader
    }

    /// What the stream said of its response, when read ([`StreamUsage::with_facts`]).
    pub fn facts(&self) -> Option<&ResponseFacts> {
        match self {
            StreamUsage::OpenAi(reader) => reader.facts.as_ref(),
            StreamUsage::Anthropic(reader) => reader.facts.as_ref(),
        }
    }

    /// The final usage, once the stream ended normally.
    pub fn final_usage(&self) -> Option<Usage> {
        match self {
            StreamUsage::OpenAi(reader) => reader.usage,
            StreamUsage::Anthropic(reader) => reader.final_usage(),
        }
    }
}
