//! One client request, read and checked before anything is reserved: which
//! endpoint, which model, the tokens it can use at most, and the body sent upstream.

use bytes::Bytes;
use serde_json::Value;

use crate::wire::error::{Format, GatewayError};

/// The endpoints the gateway limits and forwards.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// OpenAI `POST /v1/chat/completions`.
    ChatCompletions,
    /// OpenAI `POST /v1/embeddings`.
    Embeddings,
    /// OpenAI `POST /v1/responses`.
    Responses,
    /// Anthropic `POST /v1/messages`.
    Messages,
    /// Anthropic `POST /v1/messages/count_tokens`: forwarded, not limited.
    CountTokens,
}

impl Endpoint {
    /// The path, the same upstream as here.
    pub fn path(self) -> &'static str {
        match self {
            Endpoint::ChatCompletions => "/v1/chat/completions",
            Endpoint::Embeddings => "/v1/embeddings",
            Endpoint::Responses => "/v1/responses",
            Endpoint::Messages => "/v1/messages",
            Endpoint::CountTokens => "/v1/messages/count_tokens",
        }
    }

    /// The provider whose API the endpoint belongs to.
    pub fn format(self) -> Format {
        match self {
            Endpoint::ChatCompletions | Endpoint::Embeddings | Endpoint::Responses => Format::OpenAi,
            Endpoint::Messages | Endpoint::CountTokens => Format::Anthropic,
        }
    }

    /// The name in metrics and logs.
    pub fn label(self) -> &'static str {
        match self {
            Endpoint::ChatCompletions => "chat_completions",
            Endpoint::Embeddings => "embeddings",
            Endpoint::Responses => "responses",
            Endpoint::Messages => "messages",
            Endpoint::CountTokens => "count_tokens",
        }
    }
}

/// A checked request: what it may use and what is sent upstream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    /// Whether the client asked for a stream.
    pub stream: bool,
    /// The prompt's tokens, counted (OpenAI) or estimated (Claude); reserved on the
    /// input side.
    pub input_tokens: u64,
    /// The characters of the prompt's text (`tokens::prompt_characters`), times
    /// the choices like `input_tokens`: OpenAI's and Azure's admission estimate
    /// is taken from them; 0 for Anthropic, whose rules count tokens only.
    pub prompt_characters: u64,
    /// The most output tokens: the output bound times the number of choices.
    pub output_tokens: u64,
    /// The byte count of an all-text prompt of a calibrated model
    /// (`tokens::Counter::calibration_sample`): compared with the provider's
    /// count when the call ends.
    pub calibration_sample: Option<u64>,
    /// Whether the stream's usage chunk, asked for by the gateway, is kept from the client.
    pub drop_usage_chunk: bool,
    /// The body sent upstream: the client's, unchanged unless the gateway had to
    /// ask for usage.
    pub upstream_body: Bytes,
    /// The output bound per choice the gateway adds to the body it sends when the
    /// request names none: the model's default, which the call was reserved at,
    /// so that the provider writes no more than was held (docs/gateway.md,
    /// "Budgets and spend"). `None` when the request names its bound.
    pub bound_to_send: Option<u64>,
}

/// The request's JSON object, or a 400 naming what is wrong.
pub fn parse_object(body: &[u8]) -> Result<serde_json::Map<String, Value>, GatewayError> {
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(object)) => Ok(object),
        Ok(_) => Err(GatewayError::invalid("The request body must be a JSON object.")),
        Err(e) => Err(GatewayError::invalid(format!(
            "We could not parse the JSON body of your request: {e}"
        ))),
    }
}

/// The `model` field, or a 400 when it is missing or not a string.
pub fn model_name(object: &serde_json::Map<String, Value>) -> Result<&str, GatewayError> {
    match object.get("model") {
        Some(Value::String(model)) if !model.is_empty() => Ok(model),
        Some(Value::String(_)) | None => Err(GatewayError::invalid("model: you must provide a model parameter.")),
        Some(_) => Err(GatewayError::invalid("model: must be a string.")),
    }
}

/// An optional non-negative integer field.
pub fn optional_u64(object: &serde_json::Map<String, Value>, field: &str) -> Result<Option<u64>, GatewayError> {
    match object.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(value) => value
            .as_u64()
            .map(Some)
            .ok_or_else(|| GatewayError::invalid(format!("{field}: must be a non-negative integer."))),
    }
}

/// An optional boolean field, false when absent.
pub fn optional_bool(object: &serde_json::Map<String, Value>, field: &str) -> Result<bool, GatewayError> {
    match object.get(field) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(value)) => Ok(*value),
        Some(_) => Err(GatewayError::invalid(format!("{field}: must be a boolean."))),
    }
}

/// A required array field.
pub fn required_array<'a>(
    object: &'a serde_json::Map<String, Value>,
    field: &str,
) -> Result<&'a Vec<Value>, GatewayError> {
    match object.get(field) {
        Some(Value::Array(items)) => Ok(items),
        None => Err(GatewayError::invalid(format!("{field}: Field required."))),
        Some(_) => Err(GatewayError::invalid(format!("{field}: must be an array."))),
    }
}
