//! A traced call's message content in the OpenTelemetry GenAI conventions'
//! JSON shapes (docs/observability.md, "Message content"), recorded only when the
//! operator opts in: `gen_ai.input.messages` from the request,
//! `gen_ai.output.messages` from the answer's text. The shapes are the
//! conventions' input and output message schemas
//! (<https://github.com/open-telemetry/semantic-conventions/blob/v1.37.0/docs/gen-ai/gen-ai-input-messages.json>,
//! `gen-ai-output-messages.json`): `[{"role", "parts": [{"type": "text", "content"}]}]`,
//! output messages with their `finish_reason`.
//!
//! Only text is recorded: a part of another type (an image, a file, a tool
//! call) keeps its `type` and none of its data. Each attribute is bounded by
//! [`CONTENT_BYTES_MAX`].

use serde_json::{json, Value};

use super::call::Endpoint;

/// The largest `gen_ai.input.messages` or `gen_ai.output.messages` value, in
/// bytes: a span exporter's batch holds up to 2,048 spans, and collectors
/// refuse attributes past tens of kilobytes; the latest messages are kept,
/// the text of one too long for the bound cut.
pub const CONTENT_BYTES_MAX: usize = 16 * 1024;

/// The most choices whose text is kept: OpenAI's `n` is at most 128.
pub const CHOICES_MAX: usize = 128;

/// The request's messages of a call to `endpoint` (`body`: its JSON), in the
/// conventions' input shape; `None` when it has none (embeddings) or is not JSON.
pub fn input_messages(endpoint: Endpoint, body: &[u8]) -> Option<String> {
    let request: Value = serde_json::from_slice(body).ok()?;
    let mut messages = Vec::new();
    let system = match endpoint {
        Endpoint::Messages => request.get("system"),
        Endpoint::Responses => request.get("instructions"),
        _ => None,
    };
    if let Some(system) = system {
        messages.push(message("system", parts(system)));
    }
    let listed = match endpoint {
        Endpoint::ChatCompletions | Endpoint::Messages => request.get("messages"),
        Endpoint::Responses => request.get("input"),
        _ => None,
    }?;
    match listed {
        Value::String(text) => messages.push(message("user", vec![text_part(text)])),
        Value::Array(items) => {
            for item in items {
                let role = item.get("role").and_then(Value::as_str).unwrap_or("user");
                messages.push(message(role, parts(item.get("content").unwrap_or(&Value::Null))));
            }
        }
        _ => return None,
    }
    Some(bounded(messages))
}

/// The answer's text of each choice with its finish reason, in the
/// conventions' output shape.
pub fn output_messages(texts: &[String], reasons: &[String]) -> String {
    let messages = texts.iter().enumerate().map(|(i, text)| {
        let mut message = message("assistant", vec![text_part(text)]);
        if let Some(reason) = reasons.get(i) {
            message["finish_reason"] = json!(reason);
        }
        message
    });
    bounded(messages.collect())
}

/// The text of each choice of a whole answer's content value: OpenAI chat's
/// `choices` (`[].message.content`), the Responses API's `output`
/// (`[].content[].text`) or Anthropic's `content` (`[].text`).
pub fn texts_of_answer(endpoint: Endpoint, content: &Value) -> Vec<String> {
    let items = content.as_array().map(Vec::as_slice).unwrap_or_default();
    match endpoint {
        Endpoint::ChatCompletions => (items.iter())
            .map(|choice| text_of(choice.get("message").and_then(|m| m.get("content"))))
            .collect(),
        Endpoint::Responses => {
            let text: String = (items.iter()).map(|item| text_of(item.get("content"))).collect();
            vec![text]
        }
        _ => vec![text_of(Some(content))],
    }
}

/// Appends `text` to choice `index` of `texts`, within [`CONTENT_BYTES_MAX`] in all.
pub fn append_text(texts: &mut Vec<String>, index: usize, text: &str) {
    let used: usize = texts.iter().map(String::len).sum();
    if used.saturating_add(text.len()) > CONTENT_BYTES_MAX || index >= CHOICES_MAX {
        return;
    }
    if texts.len() <= index {
        texts.resize(index + 1, String::new());
    }
    texts[index].push_str(text);
}

/// The text of a content value: a string, or the `text` of each of its parts.
fn text_of(content: Option<&Value>) -> String {
    match content {
        Some(Value::String(text)) => text.clone(),
        Some(Value::Array(parts)) => (parts.iter())
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect(),
        _ => String::new(),
    }
}

/// A message of `role` with `parts`.
fn message(role: &str, parts: Vec<Value>) -> Value {
    json!({"role": role, "parts": parts})
}

/// A text part.
fn text_part(text: &str) -> Value {
    json!({"type": "text", "content": text})
}

/// The parts of a content value: its text as text parts, any other part by its type only.
fn parts(content: &Value) -> Vec<Value> {
    match content {
        Value::String(text) => vec![text_part(text)],
        Value::Array(items) => (items.iter())
            .map(|part| match part.get("text").and_then(Value::as_str) {
                Some(text) => text_part(text),
                None => json!({"type": part.get("type").and_then(Value::as_str).unwrap_or("unknown")}),
            })
            .collect(),
        _ => Vec::new(),
    }
}

/// `messages` as JSON within [`CONTENT_BYTES_MAX`]: the latest that fit, and
/// of one message alone too long, its text cut on a character boundary.
fn bounded(messages: Vec<Value>) -> String {
    let mut kept: Vec<Value> = Vec::new();
    let mut used = 2;
    for message in messages.into_iter().rev() {
        let len = message.to_string().len() + 1;
        if used + len <= CONTENT_BYTES_MAX {
            used += len;
            kept.push(message);
        } else if kept.is_empty() {
            kept.push(cut(message, CONTENT_BYTES_MAX - used));
            break;
        } else {
            break;
        }
    }
    kept.reverse();
    Value::Array(kept).to_string()
}

/// `message` with its text parts cut so that its JSON fits in `room` bytes.
fn cut(mut message: Value, room: usize) -> Value {
    let overhead = {
        let mut bare = message.clone();
        for part in bare["parts"].as_array_mut().into_iter().flatten() {
            if part.get("content").is_some() {
                part["content"] = json!("");
            }
        }
        bare.to_string().len()
    };
    // Escapes may double a character's length in JSON: keep half the room.
    let mut left = room.saturating_sub(overhead) / 2;
    for part in message["parts"].as_array_mut().into_iter().flatten() {
        if let Some(text) = part.get("content").and_then(Value::as_str) {
            let mut end = text.len().min(left);
            while !text.is_char_boundary(end) {
                end -= 1;
            }
            left -= end;
            part["content"] = json!(text[..end]);
        }
    }
    message
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_requests_messages_take_the_conventions_shape() {
        let chat = json!({"messages": [{"role": "system", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "image_url", "image_url": {"url": "data:x"}}]}]});
        let got: Value =
            serde_json::from_str(&input_messages(Endpoint::ChatCompletions, chat.to_string().as_bytes()).unwrap())
                .unwrap();
        assert_eq!(
            got,
            json!([{"role": "system", "parts": [{"type": "text", "content": "be brief"}]},
            {"role": "user", "parts": [{"type": "text", "content": "hi"}, {"type": "image_url"}]}])
        );
        let anthropic = json!({"system": "be brief", "messages": [{"role": "user", "content": "hi"}]});
        let got: Value =
            serde_json::from_str(&input_messages(Endpoint::Messages, anthropic.to_string().as_bytes()).unwrap())
                .unwrap();
        assert_eq!(got[0]["role"], "system");
        assert_eq!(got[1]["parts"][0]["content"], "hi");
        let responses = json!({"input": "hello"});
        let got = input_messages(Endpoint::Responses, responses.to_string().as_bytes()).unwrap();
        assert_eq!(got, r#"[{"parts":[{"content":"hello","type":"text"}],"role":"user"}]"#);
        assert_eq!(input_messages(Endpoint::Embeddings, br#"{"input":"x"}"#), None);
    }

    #[test]
    fn the_content_is_bounded_latest_first() {
        let long = "é".repeat(CONTENT_BYTES_MAX);
        let messages = [
            json!({"role": "user", "content": "first"}),
            json!({"role": "user", "content": long}),
        ];
        let body = json!({"messages": messages}).to_string();
        let got = input_messages(Endpoint::ChatCompletions, body.as_bytes()).unwrap();
        assert!(got.len() <= CONTENT_BYTES_MAX, "{}", got.len());
        let got: Value = serde_json::from_str(&got).unwrap();
        assert_eq!(got.as_array().unwrap().len(), 1, "the latest message, cut");
        let out = output_messages(&["a".repeat(10)], &["stop".to_owned()]);
        assert_eq!(
            out,
            r#"[{"finish_reason":"stop","parts":[{"content":"aaaaaaaaaa","type":"text"}],"role":"assistant"}]"#
        );
        let mut texts = Vec::new();
        append_text(&mut texts, 1, "b");
        append_text(&mut texts, 0, "a");
        append_text(&mut texts, 0, &"x".repeat(CONTENT_BYTES_MAX));
        assert_eq!(texts, ["a", "b"]);
    }
}
