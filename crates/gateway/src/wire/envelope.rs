//! How a call is wrapped for its upstream (docs/gateway.md, "Upstreams"): the
//! client's body as the provider wants it, and the answer's stream back in the
//! client's framing. The one place a kind's envelope is chosen from the
//! upstream and the model, so that a new kind adds match arms here and in
//! `proxy::upstream::Upstream::path_of`, nothing in the forwarding.

use axum::http::HeaderMap;
use bytes::Bytes;
use serde_json::{Map, Value};

use crate::config::{UpstreamConfig, UpstreamKind};
use crate::wire::event_stream::{self, EventStreamReframer};

/// The `anthropic_version` of a Claude body on Bedrock
/// (<https://docs.aws.amazon.com/bedrock/latest/userguide/model-parameters-anthropic-claude-messages-request-response.html>).
pub const BEDROCK_ANTHROPIC_VERSION: &str = "bedrock-2023-05-31";
/// The `anthropic_version` of a Claude body on Vertex AI
/// (<https://docs.anthropic.com/en/api/claude-on-vertex-ai>).
pub const VERTEX_ANTHROPIC_VERSION: &str = "vertex-2023-10-16";

/// The wrapping of one deployment's calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Envelope {
    /// The body as the client's API has it (only `model` and the output bound
    /// rewritten by the deployment), the answer as the upstream sends it.
    Plain,
    /// Claude on Bedrock (`InvokeModel`): the Messages body without `model`
    /// (it is in the path) and `stream` (the path says it), with Bedrock's
    /// `anthropic_version` and the client's `anthropic-beta` as
    /// `anthropic_beta`; the stream in AWS event-stream frames.
    BedrockMessages,
    /// Claude on Vertex AI (`rawPredict`, `streamRawPredict`): the Messages
    /// body without `model` (it is in the path), with Vertex's
    /// `anthropic_version`; `stream` stays, as Anthropic's streaming example
    /// on Vertex sends it (<https://docs.anthropic.com/en/api/claude-on-vertex-ai>);
    /// the stream is Anthropic's server-sent events.
    VertexMessages,
}

impl Envelope {
    /// The envelope of calls to `model` (the name sent upstream) on `upstream`.
    pub fn of(upstream: &UpstreamConfig, model: &str) -> Self {
        match (upstream.kind, upstream.format_of(model)) {
            (UpstreamKind::Bedrock, UpstreamKind::Anthropic) => Envelope::BedrockMessages,
            (UpstreamKind::Vertex, UpstreamKind::Anthropic) => Envelope::VertexMessages,
            _ => Envelope::Plain,
        }
    }

    /// Whether [`Envelope::wrap`] changes the body: when not, a body with
    /// nothing else to rewrite is sent as received, unparsed.
    pub fn rewrites_body(self) -> bool {
        match self {
            Envelope::Plain => false,
            Envelope::BedrockMessages | Envelope::VertexMessages => true,
        }
    }

    /// Rewrites the request `object` (already holding the deployment's model
    /// and bound) into the provider's body; `forwarded` are the client's
    /// request headers the upstream is passed (its `forward_headers`), of
    /// which a provider may want some in the body.
    pub fn wrap(self, object: &mut Map<String, Value>, forwarded: &HeaderMap) {
        match self {
            Envelope::Plain => {}
            Envelope::BedrockMessages => {
                object.remove("model");
                object.remove("stream");
                let version = Value::String(BEDROCK_ANTHROPIC_VERSION.to_owned());
                object.insert("anthropic_version".to_owned(), version);
                let betas: Vec<Value> = (forwarded.get_all("anthropic-beta").iter())
                    .filter_map(|v| v.to_str().ok())
                    .flat_map(|v| v.split(','))
                    .map(str::trim)
                    .filter(|beta| !beta.is_empty())
                    .map(|beta| Value::String(beta.to_owned()))
                    .collect();
                if !betas.is_empty() {
                    object.insert("anthropic_beta".to_owned(), Value::Array(betas));
                }
            }
            Envelope::VertexMessages => {
                object.remove("model");
                let version = Value::String(VERTEX_ANTHROPIC_VERSION.to_owned());
                object.insert("anthropic_version".to_owned(), version);
            }
        }
    }

    /// The reader that turns a streamed answer's bytes into the client's
    /// server-sent events.
    pub fn reframer(self) -> Reframer {
        match self {
            Envelope::Plain | Envelope::VertexMessages => Reframer::Sse,
            Envelope::BedrockMessages => Reframer::AwsEventStream(Box::default()),
        }
    }
}

/// Turns an upstream stream's bytes, as they arrive, into server-sent events
/// (the gateway's usage reading and the client both read those).
#[derive(Debug)]
pub enum Reframer {
    /// The upstream already sends server-sent events: passed through.
    Sse,
    /// Bedrock's AWS event-stream frames, each chunk re-emitted as an
    /// Anthropic event.
    AwsEventStream(Box<EventStreamReframer>),
}

impl Reframer {
    /// Whether an answer with these headers is a stream this reframer reads.
    pub fn is_stream(&self, headers: &HeaderMap) -> bool {
        let content_type = (headers.get("content-type")).and_then(|v| v.to_str().ok());
        match self {
            Reframer::Sse => content_type.is_some_and(|v| v.starts_with("text/event-stream")),
            Reframer::AwsEventStream(_) => content_type.is_some_and(|v| v.starts_with(event_stream::CONTENT_TYPE)),
        }
    }

    /// The server-sent-event bytes of the upstream's `data`, read so far.
    pub fn push(&mut self, data: Bytes) -> Result<Bytes, String> {
        match self {
            Reframer::Sse => Ok(data),
            Reframer::AwsEventStream(reframer) => reframer.push(&data),
        }
    }

    /// Whether the client's answer needs its `content-type` set to
    /// `text/event-stream` (the upstream framed it otherwise).
    pub fn changes_content_type(&self) -> bool {
        match self {
            Reframer::Sse => false,
            Reframer::AwsEventStream(_) => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn upstream(yaml: &str) -> UpstreamConfig {
        serde_yaml::from_str(yaml).unwrap()
    }

    #[test]
    fn claude_on_bedrock_moves_model_and_stream_out_and_its_version_and_betas_in() {
        let bedrock = upstream("{name: b, kind: bedrock, region: us-east-1}");
        let envelope = Envelope::of(&bedrock, "us.anthropic.claude-sonnet-4-5-20250929-v1:0");
        assert_eq!(envelope, Envelope::BedrockMessages);
        assert!(envelope.rewrites_body());
        let mut object = serde_json::json!({"model": "m", "stream": true, "max_tokens": 5, "messages": []});
        let object = object.as_object_mut().unwrap();
        let mut headers = HeaderMap::new();
        headers.append("anthropic-beta", "a-1, b-2".parse().unwrap());
        headers.append("anthropic-beta", "c-3".parse().unwrap());
        envelope.wrap(object, &headers);
        assert_eq!(
            Value::Object(object.clone()),
            serde_json::json!({"max_tokens": 5, "messages": [], "anthropic_version": "bedrock-2023-05-31",
                "anthropic_beta": ["a-1", "b-2", "c-3"]})
        );
        let mut plain = serde_json::json!({"max_tokens": 5});
        envelope.wrap(plain.as_object_mut().unwrap(), &HeaderMap::new());
        assert!(plain.get("anthropic_beta").is_none(), "no beta: no field");
    }

    #[test]
    fn claude_on_vertex_moves_model_out_keeps_stream_and_puts_its_version_in() {
        let vertex = upstream("{name: v, kind: vertex, region: us-east5, project: p}");
        let envelope = Envelope::of(&vertex, "claude-sonnet-4-5@20250929");
        assert_eq!(envelope, Envelope::VertexMessages);
        assert!(envelope.rewrites_body());
        let mut object = serde_json::json!({"model": "m", "stream": true, "max_tokens": 5, "messages": [],
            "anthropic_version": "2023-06-01"});
        let object = object.as_object_mut().unwrap();
        envelope.wrap(object, &HeaderMap::new());
        assert_eq!(
            Value::Object(object.clone()),
            serde_json::json!({"stream": true, "max_tokens": 5, "messages": [], "anthropic_version": "vertex-2023-10-16"})
        );
        assert_eq!(Envelope::of(&vertex, "google/gemini-2.5-flash"), Envelope::Plain);
    }

    #[test]
    fn other_models_and_kinds_are_sent_plain() {
        let bedrock = upstream("{name: b, kind: bedrock, region: us-east-1}");
        assert_eq!(Envelope::of(&bedrock, "openai.gpt-oss-120b-1:0"), Envelope::Plain);
        let anthropic = upstream("{name: a, kind: anthropic, base_url: \"https://x\"}");
        assert_eq!(Envelope::of(&anthropic, "claude-sonnet-4-5"), Envelope::Plain);
        assert!(!Envelope::Plain.rewrites_body());
    }
}
