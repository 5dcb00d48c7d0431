//! What an answer says of itself, for the try's CLIENT span (docs/observability.md):
//! the response's id, the model that served it, why each choice finished, and
//! the provider's error type of an error answer. Read on the way, by the usage
//! readers that already go through the answer ([`super::usage_scan`] over a
//! whole answer, the stream readers over the events they parse), and only when
//! the call is traced: no answer is parsed twice.
//!
//! The shapes read:
//! - OpenAI chat (<https://platform.openai.com/docs/api-reference/chat/object>):
//!   top-level `id`, `model`, `choices[].finish_reason`; a stream's chunks carry
//!   the same (<https://platform.openai.com/docs/api-reference/chat-streaming/streaming>).
//! - OpenAI Responses (<https://platform.openai.com/docs/api-reference/responses/object>):
//!   `id`, `model`, and `status` (`completed`, `incomplete`, `failed`) as the
//!   finish reason; a stream's `response.completed` event holds the response.
//! - Anthropic Messages (<https://docs.anthropic.com/en/api/messages>): `id`,
//!   `model`, `stop_reason`; a stream's `message_start` has the id and model,
//!   its `message_delta` the `delta.stop_reason`.
//! - Errors: OpenAI's `{"error": {"type": ...}}`
//!   (<https://platform.openai.com/docs/guides/error-codes>) and Anthropic's
//!   `{"type": "error", "error": {"type": ...}}`
//!   (<https://docs.anthropic.com/en/api/errors>): the `type` of the top-level `error`.

use serde_json::Value;

use super::content::append_text;

/// The most finish reasons kept: one per choice, and a call asks at most
/// OpenAI's `n` of 128 choices; more would only grow the span.
pub const FINISH_REASONS_MAX: usize = 128;
/// The longest id, model, finish reason or error type kept (quotes
/// included); the providers' are tens of bytes, a longer one reads as none.
pub const FACT_BYTES_MAX: usize = 256;

/// What an answer said of itself; each `None` (or empty) when it did not say.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ResponseFacts {
    /// The response's id (`chatcmpl-...`, `resp_...`, `msg_...`).
    pub id: Option<String>,
    /// The model that served the answer, as the provider names it.
    pub model: Option<String>,
    /// Why each choice finished (`stop`, `length`, `end_turn`, ...), in order.
    pub finish_reasons: Vec<String>,
    /// The provider's error type of an error answer (`rate_limit_error`, ...).
    pub error_type: Option<String>,
    /// The text of each choice, read only when the operator opted in to
    /// message content (`Some` then, from the start).
    pub texts: Option<Vec<String>>,
}

impl ResponseFacts {
    /// Whether the answer said nothing of itself.
    pub fn is_empty(&self) -> bool {
        self.id.is_none() && self.model.is_none() && self.finish_reasons.is_empty() && self.error_type.is_none()
    }

    /// Keeps `reason` as a choice's finish reason, within the bounds.
    pub fn push_reason(&mut self, reason: &str) {
        if self.finish_reasons.len() < FINISH_REASONS_MAX && reason.len() <= FACT_BYTES_MAX {
            self.finish_reasons.push(reason.to_owned());
        }
    }

    /// Reads `id` and `model` from `object` (a response, a message, a chunk),
    /// each only when the object carries it.
    pub fn read_id_and_model(&mut self, object: &Value) {
        if let Some(id) = short_string(object.get("id")) {
            self.id = Some(id);
        }
        if let Some(model) = short_string(object.get("model")) {
            self.model = Some(model);
        }
    }

    /// Reads an OpenAI chat object or chunk: its id, model and the finish
    /// reason of each choice that has one, and a chunk's text when content is read.
    pub fn read_chat(&mut self, object: &Value) {
        self.read_id_and_model(object);
        let choices = object.get("choices").and_then(Value::as_array).into_iter().flatten();
        for (position, choice) in choices.enumerate() {
            if let Some(reason) = choice.get("finish_reason").and_then(Value::as_str) {
                self.push_reason(reason);
            }
            let text = choice
                .get("delta")
                .and_then(|d| d.get("content"))
                .and_then(Value::as_str);
            if let (Some(texts), Some(text)) = (&mut self.texts, text) {
                let index = choice
                    .get("index")
                    .and_then(Value::as_u64)
                    .map_or(position, |i| i as usize);
                append_text(texts, index, text);
            }
        }
    }

    /// Reads the provider's error type from a top-level `error` value.
    pub fn read_error(&mut self, error: &Value) {
        self.error_type = short_string(error.get("type"));
    }
}

/// A string value no longer than [`FACT_BYTES_MAX`].
pub fn short_string(value: Option<&Value>) -> Option<String> {
    value
        .and_then(Value::as_str)
        .filter(|s| s.len() <= FACT_BYTES_MAX)
        .map(str::to_owned)
}

/// Whether an OpenAI chat chunk's `data` may finish a choice: it carries a
/// `"finish_reason"` whose value is not `null`. Only such chunks are parsed
/// for their reason; the others (every token's) pass unread.
pub fn may_finish(data: &[u8]) -> bool {
    const KEY: &[u8] = b"\"finish_reason\"";
    let mut rest = data;
    while let Some(at) = find(rest, KEY) {
        rest = &rest[at + KEY.len()..];
        let value = rest
            .iter()
            .position(|b| !matches!(b, b' ' | b'\t' | b'\n' | b'\r' | b':'));
        if let Some(start) = value {
            if rest[start] != b'n' {
                return true;
            }
        }
    }
    false
}

/// The position of `needle` in `haystack`.
fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    memchr::memmem::find(haystack, needle)
}

/// Reads the finish reasons out of the bytes of an OpenAI answer's top-level
/// `choices` value as they pass, without keeping the value: the reason of
/// each choice object (`[{..., "finish_reason": "stop"}, ...]`).
#[derive(Debug, Default)]
pub struct ChoicesReasons {
    /// Nesting within the value: 1 inside the array, 2 inside a choice.
    depth: u32,
    in_string: bool,
    escape: bool,
    /// The string being read at a choice's level, while short enough.
    string: Vec<u8>,
    string_too_long: bool,
    /// The last string at a choice's level was `finish_reason`, a `:` may follow.
    key_is_reason: bool,
    /// After `"finish_reason":`, the value's string is the reason.
    reading_reason: bool,
    /// The reasons read, in order.
    pub reasons: Vec<String>,
}

impl ChoicesReasons {
    /// Whether the bytes inside a string matter here: at a choice's level,
    /// where its keys and finish reason are.
    pub fn reads_strings(&self) -> bool {
        self.depth == 2
    }

    /// Reads the next byte of the `choices` value.
    pub fn byte(&mut self, byte: u8) {
        if self.in_string {
            self.string_byte(byte);
            return;
        }
        match byte {
            b'"' => {
                self.in_string = true;
                self.string.clear();
                self.string_too_long = false;
            }
            b'{' | b'[' => {
                self.depth += 1;
                self.key_is_reason = false;
                self.reading_reason = false;
            }
            b'}' | b']' => {
                self.depth = self.depth.saturating_sub(1);
                self.reading_reason = false;
            }
            b':' if self.depth == 2 && self.key_is_reason => {
                self.key_is_reason = false;
                self.reading_reason = true;
            }
            b' ' | b'\t' | b'\n' | b'\r' => {}
            _ => {
                // `null`, a number, a `,`: no reason here.
                self.key_is_reason = false;
                self.reading_reason = false;
            }
        }
    }

    /// Reads `run`, bytes inside a string that are neither a quote nor an
    /// escape, as [`Self::byte`] reads each of them.
    pub fn string_run(&mut self, run: &[u8]) {
        if !self.in_string || self.escape {
            run.iter().for_each(|&b| self.byte(b));
            return;
        }
        if self.depth != 2 || self.string_too_long {
            return;
        }
        let room = FACT_BYTES_MAX - self.string.len();
        if run.len() > room {
            self.string.extend_from_slice(&run[..room]);
            self.string_too_long = true;
        } else {
            self.string.extend_from_slice(run);
        }
    }

    fn string_byte(&mut self, byte: u8) {
        if self.escape {
            self.escape = false;
            // An escaped string is never taken for the key or a reason.
            self.string_too_long = true;
            return;
        }
        match byte {
            b'\\' => self.escape = true,
            b'"' => {
                self.in_string = false;
                if self.depth != 2 || self.string_too_long {
                    self.key_is_reason = false;
                    self.reading_reason = false;
                } else if self.reading_reason {
                    self.reading_reason = false;
                    if self.reasons.len() < FINISH_REASONS_MAX {
                        self.reasons.push(String::from_utf8_lossy(&self.string).into_owned());
                    }
                } else {
                    self.key_is_reason = self.string == b"finish_reason";
                }
            }
            _ => self.string_run(std::slice::from_ref(&byte)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_reasons_of_each_choice_are_read_byte_by_byte() {
        let choices =
            br#"[{"index":0,"message":{"content":"finish_reason","finish_reason":"x"},"finish_reason":"stop"},
            {"index":1, "finish_reason" : "length"},{"index":2,"finish_reason":null},{"finish_reason":"a\"b"}]"#;
        let mut reader = ChoicesReasons::default();
        for &byte in choices.iter() {
            reader.byte(byte);
        }
        assert_eq!(reader.reasons, ["stop", "length"]);
    }

    #[test]
    fn a_chunk_may_finish_only_with_a_reason_that_is_not_null() {
        assert!(!may_finish(br#"{"choices":[{"delta":{},"finish_reason":null}]}"#));
        assert!(!may_finish(br#"{"choices":[{"delta":{}}]}"#));
        assert!(may_finish(br#"{"choices":[{"delta":{},"finish_reason": "stop"}]}"#));
        let mut facts = ResponseFacts::default();
        facts.read_chat(&json!({"id": "c", "model": "m", "choices": [{"finish_reason": "stop"}, {}]}));
        assert_eq!(
            (
                facts.id.as_deref(),
                facts.model.as_deref(),
                facts.finish_reasons.as_slice()
            ),
            (Some("c"), Some("m"), &["stop".to_owned()][..])
        );
        facts.read_error(&json!({"type": "rate_limit_error", "message": "slow down"}));
        assert_eq!(facts.error_type.as_deref(), Some("rate_limit_error"));
        let long = "x".repeat(FACT_BYTES_MAX + 1);
        assert_eq!(short_string(Some(&json!(long))), None);
    }
}
