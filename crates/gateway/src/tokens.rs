//! Prompt token counting before the call (docs/gateway.md, "Counting").
//!
//! OpenAI models are counted with their own encoding (o200k_base or cl100k_base,
//! embedded in the binary by `bpe-openai`, so counting works offline). Models
//! without a public tokenizer (Claude) and models whose tokenizer is not embedded
//! are counted at one token per UTF-8 byte: every BPE token is at least one byte,
//! so the estimate is never below the provider's count.

use serde_json::Value;

use crate::config::{Encoding, UpstreamKind};

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
/// Tokens reserved per image whose size is unknown: above OpenAI's high-detail
/// maximum for GPT-4o (85 + 170 x 8 tiles = 1,445) and Anthropic's (an image is
/// resized to at most about 1.15 megapixels, width x height / 750 ≈ 1,600 tokens).
pub const IMAGE_TOKENS_DEFAULT: u64 = 1_600;
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

/// How one model's prompts are counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Counter {
    /// The tokenizer.
    pub encoding: Encoding,
    /// Tokens per image part.
    pub image_tokens: u64,
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

impl Counter {
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
    pub fn content(&self, content: &Value) -> u64 {
        match content {
            Value::Array(parts) => parts.iter().map(|part| self.part(part)).sum(),
            other => self.json(other),
        }
    }

    fn part(&self, part: &Value) -> u64 {
        let kind = part.get("type").and_then(Value::as_str).unwrap_or("");
        match kind {
            "text" | "input_text" | "output_text" => part.get("text").map_or(0, |t| self.json(t)),
            "image_url" | "input_image" | "image" => self.image_tokens,
            _ => self.json(part),
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
    pub fn openai_chat(&self, body: &Value) -> u64 {
        let mut tokens = CHAT_REPLY_PRIMING_TOKENS;
        for message in body.get("messages").and_then(Value::as_array).into_iter().flatten() {
            tokens += CHAT_TOKENS_PER_MESSAGE;
            for (field, value) in message.as_object().into_iter().flatten() {
                tokens += match field.as_str() {
                    "content" => self.content(value),
                    "role" => self.role(value),
                    "name" => self.json(value) + CHAT_TOKENS_PER_NAME,
                    _ => self.json(value),
                };
            }
        }
        tokens + self.tools(body.get("tools")) + self.tools(body.get("functions")) + self.extras(body)
    }

    /// OpenAI responses: `instructions`, then `input` as text or as items counted
    /// like chat messages.
    pub fn openai_responses(&self, body: &Value) -> u64 {
        let mut tokens = CHAT_REPLY_PRIMING_TOKENS + body.get("instructions").map_or(0, |v| self.json(v));
        match body.get("input") {
            Some(Value::Array(items)) => {
                for item in items {
                    tokens += CHAT_TOKENS_PER_MESSAGE;
                    for (field, value) in item.as_object().into_iter().flatten() {
                        tokens += match field.as_str() {
                            "content" => self.content(value),
                            "type" => 0,
                            _ => self.json(value),
                        };
                    }
                }
            }
            Some(other) => tokens += CHAT_TOKENS_PER_MESSAGE + self.json(other),
            None => {}
        }
        tokens + self.tools(body.get("tools")) + self.extras(body)
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
    /// and the tools with the system prompt tool use adds.
    pub fn anthropic_messages(&self, body: &Value) -> u64 {
        let mut tokens = body.get("system").map_or(0, |s| self.content(s));
        for message in body.get("messages").and_then(Value::as_array).into_iter().flatten() {
            tokens += ANTHROPIC_TOKENS_PER_MESSAGE + message.get("content").map_or(0, |c| self.content(c));
        }
        if let Some(tools) = body.get("tools").and_then(Value::as_array) {
            if !tools.is_empty() {
                tokens += ANTHROPIC_TOOL_SYSTEM_TOKENS + self.tools(body.get("tools"));
            }
        }
        tokens
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
mod tests {
    use super::*;
    use serde_json::json;

    fn o200k() -> Counter {
        Counter {
            encoding: Encoding::O200kBase,
            image_tokens: IMAGE_TOKENS_DEFAULT,
        }
    }

    #[test]
    fn texts_match_tiktoken_on_both_encodings() {
        let corpus = [
            "",
            "Hello, world!",
            "the cat sat on the mat",
            "  leading spaces and trailing \n\n",
            "def f(x):\n    return x ** 2  # square\n",
            "日本語のテキストと emoji 🎉🎉 mixed",
            "1234567890 3.14159 -42 0xdeadbeef",
            "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
        ];
        let o200k_ref = tiktoken_rs::o200k_base().unwrap();
        let cl100k_ref = tiktoken_rs::cl100k_base().unwrap();
        let cl100k = Counter {
            encoding: Encoding::Cl100kBase,
            image_tokens: 0,
        };
        for text in corpus {
            assert_eq!(
                o200k().text(text),
                o200k_ref.encode_ordinary(text).len() as u64,
                "{text:?}"
            );
            assert_eq!(
                cl100k.text(text),
                cl100k_ref.encode_ordinary(text).len() as u64,
                "{text:?}"
            );
        }
    }

    #[test]
    fn standard_roles_are_one_token_in_both_encodings() {
        let encodings = [tiktoken_rs::o200k_base().unwrap(), tiktoken_rs::cl100k_base().unwrap()];
        for role in CHAT_ROLES {
            for encoding in &encodings {
                assert_eq!(encoding.encode_ordinary(role).len() as u64, CHAT_ROLE_TOKENS, "{role}");
            }
        }
        let c = o200k();
        assert_eq!(c.role(&json!("user")), CHAT_ROLE_TOKENS);
        assert_eq!(c.role(&json!("moderator")), c.text("moderator"));
    }

    #[test]
    fn prompt_characters_are_the_prompts_text() {
        let chat = json!({"messages": [{"role": "system", "content": "ab"},
            {"role": "user", "content": [{"type": "text", "text": "日本"}, {"type": "image_url", "image_url": {"url": "x"}}]}]});
        assert_eq!(prompt_characters(&chat), 4);
        let responses = json!({"instructions": "abc", "input": [{"role": "user", "content": "de"}]});
        assert_eq!(prompt_characters(&responses), 5);
        assert_eq!(prompt_characters(&json!({"input": ["ab", "c", [1, 2]]})), 3);
    }

    #[test]
    fn chat_counts_follow_the_cookbook() {
        // The cookbook's figure for this conversation on gpt-4o is 3 + per message
        // (3 + role + content) with the name's extra token.
        let body = json!({"model": "gpt-4o", "messages": [
            {"role": "system", "content": "You are helpful."},
            {"role": "user", "name": "bob", "content": "Hi"},
        ]});
        let c = o200k();
        let expected = 3
            + (3 + c.text("system") + c.text("You are helpful."))
            + (3 + c.text("user") + c.text("bob") + 1 + c.text("Hi"));
        assert_eq!(c.openai_chat(&body), expected);
    }

    #[test]
    fn images_and_tools_are_counted_conservatively() {
        let c = o200k();
        let plain = json!({"messages": [{"role": "user", "content": [{"type": "text", "text": "look"}]}]});
        let image = json!({"messages": [{"role": "user", "content": [
            {"type": "text", "text": "look"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]});
        assert_eq!(c.openai_chat(&image), c.openai_chat(&plain) + IMAGE_TOKENS_DEFAULT);
        let tool = json!({"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}});
        let with_tool = json!({"messages": plain["messages"], "tools": [tool]});
        assert_eq!(
            c.openai_chat(&with_tool),
            c.openai_chat(&plain) + c.json(&tool) + TOOL_OVERHEAD_TOKENS
        );
    }

    #[test]
    fn embeddings_are_exact() {
        let c = o200k();
        assert_eq!(c.openai_embeddings(&json!("hello world")), 2);
        assert_eq!(c.openai_embeddings(&json!(["hello", "hello world"])), 3);
        assert_eq!(c.openai_embeddings(&json!([1, 2, 3])), 3);
        assert_eq!(c.openai_embeddings(&json!([[1, 2], [3]])), 3);
    }

    #[test]
    fn the_claude_estimate_is_never_below_any_bpe_count() {
        let bytes = Counter {
            encoding: Encoding::Bytes,
            image_tokens: IMAGE_TOKENS_DEFAULT,
        };
        let body = json!({"system": "Be brief.", "messages": [{"role": "user", "content": "Count me: 日本語"}]});
        let estimate = bytes.anthropic_messages(&body);
        assert!(estimate >= o200k().anthropic_messages(&body));
        assert_eq!(estimate, 9 + 8 + "Count me: 日本語".len() as u64);
    }

    #[test]
    fn encodings_follow_the_model_name() {
        assert_eq!(
            default_encoding(UpstreamKind::Openai, "gpt-4o-mini"),
            Encoding::O200kBase
        );
        assert_eq!(
            default_encoding(UpstreamKind::Openai, "gpt-4-turbo"),
            Encoding::Cl100kBase
        );
        assert_eq!(
            default_encoding(UpstreamKind::Openai, "text-embedding-3-small"),
            Encoding::Cl100kBase
        );
        assert_eq!(
            default_encoding(UpstreamKind::OpenaiCompatible, "llama-3"),
            Encoding::Bytes
        );
        assert_eq!(default_encoding(UpstreamKind::Anthropic, "gpt-4o"), Encoding::Bytes);
    }
}
