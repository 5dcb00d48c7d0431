//! Prompt token counting before the call (docs/gateway.md, "Counting").
//!
//! OpenAI models are counted with their own encoding (o200k_base or cl100k_base,
//! embedded in the binary by `bpe-openai`, so counting works offline). Models
//! without a public tokenizer (Claude) and models whose tokenizer is not embedded
//! are counted at one token per UTF-8 byte: every BPE token is at least one byte,
//! so the estimate is never below the provider's count; the calibration
//! ([`crate::counting::calibration`]) then scales it to what the provider reports.
//! Images, files, documents, audio and stored context are counted by their
//! provider's rule or a bound of the model ([`crate::counting::model_table`]), never by
//! the JSON text that refers to them.

use std::ops::{Add, AddAssign};
use std::sync::Arc;

use serde_json::Value;

use crate::config::{Encoding, ModelConfig, UpstreamKind};
use crate::counting::calibration::Calibrator;
use crate::counting::images;
use crate::counting::model_table::{self, ModelRow};

/// Tokens the chat format adds per message (`<|start|>role ... <|end|>`), as in
/// OpenAI's cookbook "How to count tokens with tiktoken".
pub const CHAT_TOKENS_PER_MESSAGE: u64 = 3;
/// Tokens a message's `name` field adds beyond its text.
pub const CHAT_TOKENS_PER_NAME: u64 = 1;
/// Tokens that prime the assistant's reply (`<|start|>assistant<|message|>`).
pub const CHAT_REPLY_PRIMING_TOKENS: u64 = 3;
/// Tokens added per tool beyond its JSON text. OpenAI does not document how tools
/// are rendered; the cookbook's measured overheads (7 per function, 12 at the end)
/// stay below this, and the JSON text itself (quotes, braces) counts more tokens
/// than the rendered form: the rule over-counts, never under.
pub const TOOL_OVERHEAD_TOKENS: u64 = 16;
/// Tokens per field of a content part of a kind the gateway does not know,
/// beyond its name and value: the quotes, colon and comma of its JSON text.
pub const PART_FIELD_OVERHEAD_TOKENS: u64 = 3;
/// Tokens Anthropic adds to the system prompt when tools are given (its docs list
/// 313 to 346 for current models); rounded up.
pub const ANTHROPIC_TOOL_SYSTEM_TOKENS: u64 = 512;
/// Tokens per Anthropic message beyond its text in the byte estimate: role markers.
pub const ANTHROPIC_TOKENS_PER_MESSAGE: u64 = 8;

/// Tokens of a chat role in both OpenAI encodings (`system`, `user`,
/// `assistant`, `developer`, `tool` and `function` are one token each in
/// o200k_base and cl100k_base; the tests check it against tiktoken): a role is
/// counted without running the tokenizer, other values of `role` by it.
pub const CHAT_ROLE_TOKENS: u64 = 1;
/// The roles of [`CHAT_ROLE_TOKENS`].
const CHAT_ROLES: [&str; 6] = ["system", "user", "assistant", "developer", "tool", "function"];

/// A prompt's count in two parts: what the tokenizer (or the byte bound)
/// counted, which calibration may scale, and what a rule counted (images,
/// files, stored context), which it never does.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tally {
    /// Tokens of text, by the model's encoding.
    pub text: u64,
    /// Tokens of parts counted by a rule or a bound.
    pub rules: u64,
}

impl Tally {
    /// Text tokens only.
    pub fn text(tokens: u64) -> Self {
        Self { text: tokens, rules: 0 }
    }

    /// Rule-counted tokens only.
    pub fn rule(tokens: u64) -> Self {
        Self { text: 0, rules: tokens }
    }

    /// Both parts together.
    pub fn total(self) -> u64 {
        self.text.saturating_add(self.rules)
    }
}

impl Add for Tally {
    type Output = Tally;
    fn add(self, other: Tally) -> Tally {
        Tally {
            text: self.text.saturating_add(other.text),
            rules: self.rules.saturating_add(other.rules),
        }
    }
}

impl AddAssign for Tally {
    fn add_assign(&mut self, other: Tally) {
        *self = *self + other;
    }
}

impl std::iter::Sum for Tally {
    fn sum<I: Iterator<Item = Tally>>(iter: I) -> Tally {
        iter.fold(Tally::default(), Add::add)
    }
}

/// How one model's prompts are counted, and the bounds its calls are counted with.
#[derive(Debug, Clone)]
pub struct Counter {
    /// The tokenizer.
    pub encoding: Encoding,
    /// The model's row of the table: its image rule and context window.
    pub row: &'static ModelRow,
    /// Tokens of an image whose size the gateway cannot read (by URL or file
    /// id); default the rule's maximum.
    pub image_tokens: u64,
    /// Tokens of a file, document or audio part: default the context window.
    pub file_tokens: u64,
    /// Tokens of the stored context a Responses call continues: default the
    /// context window.
    pub stored_context_tokens: u64,
    /// The output bound of a call that names none.
    pub output_default_tokens: u64,
    /// The calibration of a byte-counted model; `None` for exact encodings.
    pub calibrator: Option<Arc<Calibrator>>,
}

/// The encoding of a model by its name, for models whose configuration names none:
/// OpenAI's published mapping (tiktoken's `model.py`); Claude and unknown models
/// get the byte estimate.
pub fn default_encoding(kind: UpstreamKind, model: &str) -> Encoding {
    if kind == UpstreamKind::Anthropic {
        return Encoding::Bytes;
    }
    const O200K: [&str; 9] = [
        "gpt-4o",
        "gpt-4.1",
        "gpt-4.5",
        "gpt-5",
        "o1",
        "o3",
        "o4",
        "chatgpt-4o",
        "gpt-oss",
    ];
    const CL100K: [&str; 4] = ["gpt-4", "gpt-3.5", "text-embedding-3", "text-embedding-ada-002"];
    if O200K.iter().any(|p| model.starts_with(p)) {
        Encoding::O200kBase
    } else if CL100K.iter().any(|p| model.starts_with(p)) {
        Encoding::Cl100kBase
    } else {
        Encoding::Bytes
    }
}

/// The counting bounds no call to an Anthropic upstream is counted at: it speaks
/// only the Messages API, whose calls always name `max_tokens` (a call without it
/// is Anthropic's 400, answered before anything is reserved) and never continue
/// context the provider stores (a Responses API feature). Warning of them would
/// ask the operator to set fields that change nothing.
const BOUNDS_UNUSED_BY_ANTHROPIC: [&str; 2] = ["max_output_tokens_default", "stored_context_tokens"];

/// The bounds of parts whose size the gateway cannot read (a file, an image of
/// unknown size, stored context): only calls that send such a part are counted
/// at them.
const PART_BOUNDS: [&str; 3] = ["file_tokens", "image_tokens", "stored_context_tokens"];

/// Whether the operator set the part bound `field` of `model`.
fn part_bound_set(model: &ModelConfig, field: &str) -> bool {
    match field {
        "file_tokens" => model.file_tokens.is_some(),
        "image_tokens" => model.image_tokens.is_some(),
        "stored_context_tokens" => model.stored_context_tokens.is_some(),
        _ => true,
    }
}

/// The output bound of a chat or Responses call without one, for a model whose
/// configuration names none: the model's largest output (its row of the table;
/// a model in no row, the table's largest). Anthropic's API requires
/// `max_tokens` and embeddings have no output, so neither uses it.
pub fn output_default(model: &ModelConfig) -> u64 {
    model
        .max_output_tokens_default
        .unwrap_or_else(|| model_table::lookup(&model.name).max_output_tokens)
}

impl Counter {
    /// The counter of `encoding` with the bounds of `row`, uncalibrated.
    pub fn new(encoding: Encoding, row: &'static ModelRow) -> Self {
        Self {
            encoding,
            row,
            image_tokens: row.image.max_tokens(),
            file_tokens: row.context_window_tokens,
            stored_context_tokens: row.context_window_tokens,
            output_default_tokens: row.max_output_tokens,
            calibrator: None,
        }
    }

    /// The counter of a configured model on an upstream of `kind`: its encoding,
    /// its row, the configuration's bounds where it gives them, and a calibrator
    /// when it is counted by bytes.
    pub fn for_model(kind: UpstreamKind, model: &ModelConfig) -> Self {
        let encoding = model.encoding.unwrap_or_else(|| default_encoding(kind, &model.name));
        let mut counter = Self::new(encoding, model_table::lookup(&model.name));
        counter.image_tokens = model.image_tokens.unwrap_or(counter.image_tokens);
        counter.file_tokens = model.file_tokens.unwrap_or(counter.file_tokens);
        counter.stored_context_tokens = model.stored_context_tokens.unwrap_or(counter.stored_context_tokens);
        counter.output_default_tokens = output_default(model);
        if encoding == Encoding::Bytes {
            counter.calibrator = Some(Arc::new(Calibrator::default()));
        }
        counter
    }

    /// The bounds of this counter, by their field, that are larger than a token
    /// limit of `model` on its own (a tier-1 `tpm` below a context window): a
    /// call using one can never be admitted. The gateway logs them at start, so
    /// that the operator sets the field to what the tenants send. Left out: a
    /// bound that no call to an upstream of `kind` is counted at (the operator
    /// has nothing to set, `BOUNDS_UNUSED_BY_ANTHROPIC`), and a part's bound
    /// the operator did not set (`PART_BOUNDS`): only calls that send such a
    /// part meet it, and their 400 names the field (`admission::admit`), so a
    /// model configured with its limits alone starts without a warning.
    pub fn bounds_above_limits(&self, model: &ModelConfig, kind: UpstreamKind) -> Vec<(&'static str, u64, u64)> {
        let input_limit = model.limits.published.tpm.or(model.limits.published.input_tpm);
        let output_limit = model.limits.published.tpm.or(model.limits.published.output_tpm);
        let bounds = [
            ("file_tokens", self.file_tokens, input_limit),
            ("stored_context_tokens", self.stored_context_tokens, input_limit),
            ("image_tokens", self.image_tokens, input_limit),
            ("max_output_tokens_default", self.output_default_tokens, output_limit),
        ];
        bounds
            .into_iter()
            .filter_map(|(field, tokens, limit)| Some((field, tokens, limit?)))
            .filter(|(field, _, _)| kind != UpstreamKind::Anthropic || !BOUNDS_UNUSED_BY_ANTHROPIC.contains(field))
            .filter(|(field, _, _)| !PART_BOUNDS.contains(field) || part_bound_set(model, field))
            .filter(|(_, tokens, limit)| tokens > limit)
            .collect()
    }

    /// The tokens reserved for a prompt counted `tally`: the text calibrated
    /// (byte-counted models), the rules' parts as counted, the whole at most the
    /// model's context window, which no accepted prompt exceeds.
    pub fn reserve(&self, tally: Tally) -> u64 {
        let text = self.calibrator.as_ref().map_or(tally.text, |c| c.apply(tally.text));
        text.saturating_add(tally.rules).min(self.row.context_window_tokens)
    }

    /// The byte count a call gives the calibration when the provider reports its
    /// usage: only an all-text prompt of a calibrated model, whose whole count
    /// the provider's report is comparable with.
    pub fn calibration_sample(&self, tally: Tally) -> Option<u64> {
        (self.calibrator.is_some() && tally.rules == 0).then_some(tally.text)
    }

    /// Tokens of `text` in this counter's encoding.
    pub fn text(&self, text: &str) -> u64 {
        let count = match self.encoding {
            Encoding::O200kBase => bpe_openai::o200k_base().count(text),
            Encoding::Cl100kBase => bpe_openai::cl100k_base().count(text),
            Encoding::Bytes => text.len(),
        };
        u64::try_from(count).expect("usize fits u64")
    }

    /// Tokens of a JSON value that is not plain text (tool calls, schemas): its
    /// compact JSON text, which holds every token the provider renders and more.
    pub fn json(&self, value: &Value) -> u64 {
        match value {
            Value::String(text) => self.text(text),
            Value::Null => 0,
            other => self.text(&other.to_string()),
        }
    }

    /// A content field: a string, or an array of parts (text, image, other).
    pub fn content(&self, content: &Value) -> Tally {
        match content {
            Value::Array(parts) => parts.iter().map(|part| self.part(part)).sum(),
            other => Tally::text(self.json(other)),
        }
    }

    fn part(&self, part: &Value) -> Tally {
        let kind = part.get("type").and_then(Value::as_str).unwrap_or("");
        match kind {
            "text" | "input_text" | "output_text" => Tally::text(part.get("text").map_or(0, |t| self.json(t))),
            "image_url" | "input_image" | "image" => Tally::rule(self.image(part)),
            // OpenAI's chat `file` and `input_audio`, Responses' `input_file`:
            // bounded per part, whatever their reference's text.
            "file" | "input_file" | "input_audio" => Tally::rule(self.file_tokens),
            "document" => self.document(part),
            _ => self.fields(part),
        }
    }

    /// A part of a kind the gateway does not know, field by field: its `content`
    /// as content (a tool result's images are images), the rest as JSON text.
    fn fields(&self, part: &Value) -> Tally {
        let Value::Object(fields) = part else {
            return Tally::text(self.json(part));
        };
        fields
            .iter()
            .map(|(name, value)| {
                let value = match name.as_str() {
                    "content" => self.content(value),
                    _ => Tally::text(self.json(value)),
                };
                value + Tally::text(self.text(name) + PART_FIELD_OVERHEAD_TOKENS)
            })
            .sum()
    }

    /// An Anthropic `document`: a plain-text source by its text, any other
    /// (PDF, file, URL) by the file bound; its title and context as text.
    fn document(&self, part: &Value) -> Tally {
        let source = part.get("source");
        let body = match source.and_then(|s| s.get("type")).and_then(Value::as_str) {
            Some("text") => Tally::text(source.and_then(|s| s.get("data")).map_or(0, |d| self.json(d))),
            Some("content") => source
                .and_then(|s| s.get("content"))
                .map_or_else(Tally::default, |c| self.content(c)),
            _ => Tally::rule(self.file_tokens),
        };
        let notes = ["title", "context"]
            .iter()
            .filter_map(|f| part.get(*f))
            .map(|v| self.json(v));
        body + Tally::text(notes.sum())
    }

    /// An image part: its size read from the bytes it carries when it carries
    /// them, else the unknown-size bound, by the model's rule.
    fn image(&self, part: &Value) -> u64 {
        // OpenAI chat: {"image_url": {"url", "detail"}}; Responses: {"image_url":
        // "...", "detail"}; Anthropic: {"source": {"type": "base64", "data"}}.
        let nested = part.get("image_url").filter(|v| v.is_object());
        let url = nested
            .and_then(|v| v.get("url"))
            .or(part.get("image_url"))
            .and_then(Value::as_str);
        let detail = nested
            .and_then(|v| v.get("detail"))
            .or(part.get("detail"))
            .and_then(Value::as_str);
        let source = part.get("source");
        let size = match url {
            Some(url) => images::data_url_size(url),
            None if source.and_then(|s| s.get("type")).and_then(Value::as_str) == Some("base64") => source
                .and_then(|s| s.get("data"))
                .and_then(Value::as_str)
                .and_then(images::base64_size),
            None => None,
        };
        match size {
            Some(size) => self.row.image.tokens(Some(size), detail == Some("low")),
            None if detail == Some("low") => self.row.image.tokens(None, true).min(self.image_tokens),
            None => self.image_tokens,
        }
    }

    /// A message's `role`: a known role's tokens without the tokenizer.
    fn role(&self, role: &Value) -> u64 {
        match role {
            Value::String(name) if self.encoding != Encoding::Bytes && CHAT_ROLES.contains(&name.as_str()) => {
                CHAT_ROLE_TOKENS
            }
            other => self.json(other),
        }
    }

    /// OpenAI chat: every message's fields plus the format's overhead, tools and
    /// response format by their JSON text.
    pub fn openai_chat(&self, body: &Value) -> Tally {
        let mut tally = Tally::text(CHAT_REPLY_PRIMING_TOKENS);
        for message in body.get("messages").and_then(Value::as_array).into_iter().flatten() {
            tally += Tally::text(CHAT_TOKENS_PER_MESSAGE);
            for (field, value) in message.as_object().into_iter().flatten() {
                tally += match field.as_str() {
                    "content" => self.content(value),
                    "role" => Tally::text(self.role(value)),
                    "name" => Tally::text(self.json(value) + CHAT_TOKENS_PER_NAME),
                    _ => Tally::text(self.json(value)),
                };
            }
        }
        let tools = self.tools(body.get("tools")) + self.tools(body.get("functions"));
        tally + Tally::text(tools + self.extras(body))
    }

    /// OpenAI responses: `instructions`, then `input` as text or as items counted
    /// like chat messages, and the stored context the call continues
    /// (`previous_response_id`, `conversation`, a stored `prompt`, an
    /// `item_reference`) at the model's stored-context bound each.
    pub fn openai_responses(&self, body: &Value) -> Tally {
        let instructions = body.get("instructions").map_or(0, |v| self.json(v));
        let mut tally = Tally::text(CHAT_REPLY_PRIMING_TOKENS + instructions);
        match body.get("input") {
            Some(Value::Array(items)) => {
                for item in items {
                    if item.get("type").and_then(Value::as_str) == Some("item_reference") {
                        tally += Tally::rule(self.stored_context_tokens);
                        continue;
                    }
                    tally += Tally::text(CHAT_TOKENS_PER_MESSAGE);
                    for (field, value) in item.as_object().into_iter().flatten() {
                        tally += match field.as_str() {
                            // A function call's output may be parts, images among them.
                            "content" | "output" => self.content(value),
                            "type" => Tally::default(),
                            _ => Tally::text(self.json(value)),
                        };
                    }
                }
            }
            Some(other) => tally += Tally::text(CHAT_TOKENS_PER_MESSAGE + self.json(other)),
            None => {}
        }
        let continues = ["previous_response_id", "conversation", "prompt"]
            .iter()
            .filter(|field| body.get(**field).is_some_and(|v| !v.is_null()))
            .count() as u64;
        tally += Tally::rule(self.stored_context_tokens.saturating_mul(continues));
        // A stored prompt's variables are substituted into it: text or parts.
        if let Some(Value::Object(variables)) = body.get("prompt").and_then(|p| p.get("variables")) {
            tally += variables
                .values()
                .map(|v| self.content(&Value::Array(vec![v.clone()])))
                .sum::<Tally>();
        }
        tally + Tally::text(self.tools(body.get("tools")) + self.extras(body))
    }

    /// OpenAI embeddings, exactly: each text's tokens, or the length of each
    /// pre-tokenized input.
    pub fn openai_embeddings(&self, input: &Value) -> u64 {
        match input {
            Value::String(text) => self.text(text),
            Value::Array(items) if items.iter().all(Value::is_number) => items.len() as u64,
            Value::Array(items) => items.iter().map(|item| self.openai_embeddings(item)).sum(),
            other => self.json(other),
        }
    }

    /// Anthropic messages: the byte estimate of the system prompt, every message,
    /// and the tools with the system prompt tool use adds; images and documents
    /// by their rules.
    pub fn anthropic_messages(&self, body: &Value) -> Tally {
        let mut tally = body.get("system").map_or_else(Tally::default, |s| self.content(s));
        for message in body.get("messages").and_then(Value::as_array).into_iter().flatten() {
            tally += Tally::text(ANTHROPIC_TOKENS_PER_MESSAGE);
            tally += message.get("content").map_or_else(Tally::default, |c| self.content(c));
        }
        if let Some(tools) = body.get("tools").and_then(Value::as_array) {
            if !tools.is_empty() {
                tally += Tally::text(ANTHROPIC_TOOL_SYSTEM_TOKENS + self.tools(body.get("tools")));
            }
        }
        tally
    }

    fn tools(&self, tools: Option<&Value>) -> u64 {
        let tools = tools.and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
        tools.iter().map(|tool| self.json(tool) + TOOL_OVERHEAD_TOKENS).sum()
    }

    /// Fields the provider renders into the prompt besides messages and tools.
    fn extras(&self, body: &Value) -> u64 {
        ["response_format", "text", "tool_choice", "prediction"]
            .iter()
            .filter_map(|field| body.get(*field))
            .filter(|v| v.is_object())
            .map(|v| self.json(v))
            .sum()
    }
}

/// The characters of a request's prompt text, as OpenAI estimates a prompt at
/// admission (docs/provider-profiles.md, "OpenAI"): every message's `content`
/// text (a string, or its text parts), a responses request's `instructions`
/// and `input`, an embeddings request's `input` strings. Images, tools and
/// other fields are counted by tokens only.
pub fn prompt_characters(body: &Value) -> u64 {
    let messages = body.get("messages").and_then(Value::as_array).into_iter().flatten();
    let contents = messages.filter_map(|m| m.get("content"));
    let mut characters: u64 = contents.map(text_characters).sum();
    characters += body.get("instructions").map_or(0, text_characters);
    characters += match body.get("input") {
        Some(Value::Array(items)) => (items.iter())
            .map(|item| {
                item.get("content")
                    .map_or_else(|| text_characters(item), text_characters)
            })
            .sum(),
        Some(other) => text_characters(other),
        None => 0,
    };
    characters
}

/// The characters of a text value: a string, or the text parts of an array.
fn text_characters(value: &Value) -> u64 {
    let count = |text: &str| u64::try_from(text.chars().count()).expect("usize fits u64");
    match value {
        Value::String(text) => count(text),
        Value::Array(parts) => (parts.iter())
            .map(|part| match part {
                Value::String(text) => count(text),
                _ => part.get("text").and_then(Value::as_str).map_or(0, count),
            })
            .sum(),
        _ => 0,
    }
}

#[cfg(test)]
#[path = "tokens_tests.rs"]
mod tests;
