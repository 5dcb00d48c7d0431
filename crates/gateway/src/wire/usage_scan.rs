//! The `usage` of a whole (non-stream) answer, read as its bytes pass to the
//! client (docs/gateway.md, "Forwarding"): no answer is held in memory to be
//! parsed, so a 100 MB embeddings answer costs the gateway a chunk at a time.
//!
//! The scanner follows the JSON's structure byte by byte (strings, escapes and
//! nesting) and keeps only the value of the top-level `usage` key, bounded by
//! [`USAGE_BYTES_MAX`]; that value is parsed once the document has ended. Any
//! doubt (an answer cut short, two `usage` keys, a key written with escapes, a
//! `usage` value larger than the bound) reads as no usage: the call then keeps
//! its whole reservation, never less than the provider counted.

/// The largest `usage` value kept: the providers' are a few hundred bytes.
pub const USAGE_BYTES_MAX: usize = 64 * 1024;
/// The longest key compared with `usage`; longer keys are skipped unread.
const KEY_BYTES_MAX: usize = 8;
/// The deepest nesting followed; a deeper answer reads as no usage.
const DEPTH_MAX: u32 = 10_000;

/// Where the scanner is at the top level of the answer's object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Top {
    /// Before the document's first byte.
    Start,
    /// Inside the top-level object, where a key may come.
    ExpectKey,
    /// After a key, before its `:`.
    ExpectColon,
    /// Inside a value of the top-level object.
    Value,
    /// The top-level object has closed.
    Done,
    /// Not an object, or broken: no usage.
    Failed,
}

/// Reads the top-level `usage` value of a JSON object fed in chunks.
#[derive(Debug)]
pub struct UsageScanner {
    top: Top,
    depth: u32,
    in_string: bool,
    escape: bool,
    /// The key being read at depth 1, `None` when too long or escaped.
    key: Option<Vec<u8>>,
    key_is_usage: bool,
    capturing: bool,
    captured: Vec<u8>,
    usage_seen: u32,
}

impl Default for UsageScanner {
    fn default() -> Self {
        Self {
            top: Top::Start,
            depth: 0,
            in_string: false,
            escape: false,
            key: None,
            key_is_usage: false,
            capturing: false,
            captured: Vec::new(),
            usage_seen: 0,
        }
    }
}

impl UsageScanner {
    /// Reads the next bytes of the answer.
    pub fn push(&mut self, chunk: &[u8]) {
        for &byte in chunk {
            if matches!(self.top, Top::Failed) {
                return;
            }
            self.byte(byte);
        }
    }

    fn byte(&mut self, byte: u8) {
        if self.in_string {
            self.string_byte(byte);
            return;
        }
        match byte {
            b' ' | b'\t' | b'\n' | b'\r' => self.keep(byte),
            b'"' => {
                self.in_string = true;
                if self.depth == 1 && self.top == Top::ExpectKey {
                    self.key = Some(Vec::new());
                } else {
                    self.value_byte(byte);
                }
            }
            b'{' | b'[' => {
                if self.top == Top::Start {
                    self.top = if byte == b'{' { Top::ExpectKey } else { Top::Failed };
                    self.depth = 1;
                    return;
                }
                self.value_byte(byte);
                self.depth += 1;
                if self.depth > DEPTH_MAX {
                    self.top = Top::Failed;
                }
            }
            b'}' | b']' if self.depth == 1 => {
                self.end_value();
                self.depth = 0;
                self.top = if byte == b'}' { Top::Done } else { Top::Failed };
            }
            b'}' | b']' => {
                self.value_byte(byte);
                self.depth = self.depth.saturating_sub(1);
            }
            b',' if self.depth == 1 => {
                self.end_value();
                self.top = Top::ExpectKey;
            }
            b':' if self.depth == 1 && self.top == Top::ExpectColon => {
                self.top = Top::Value;
                if self.key_is_usage {
                    self.usage_seen += 1;
                    self.capturing = true;
                    self.captured.clear();
                }
            }
            _ => self.value_byte(byte),
        }
    }

    fn string_byte(&mut self, byte: u8) {
        let in_key = self.key.is_some() || (self.depth == 1 && self.top == Top::ExpectKey);
        if self.escape {
            self.escape = false;
        } else if byte == b'\\' {
            self.escape = true;
            // An escaped key is never taken for `usage`.
            if in_key {
                self.key = None;
            }
        } else if byte == b'"' {
            self.in_string = false;
            if in_key {
                self.key_is_usage = self.key.take().is_some_and(|k| k == b"usage");
                self.top = Top::ExpectColon;
                return;
            }
        } else if in_key {
            if let Some(key) = &mut self.key {
                if key.len() < KEY_BYTES_MAX {
                    key.push(byte);
                } else {
                    self.key = None;
                }
            }
            return;
        }
        if !in_key {
            self.value_byte(byte);
        }
    }

    fn value_byte(&mut self, byte: u8) {
        if self.depth == 0 {
            // Bytes before the object opens or after it closed: not an object.
            self.top = Top::Failed;
            return;
        }
        self.keep(byte);
    }

    fn keep(&mut self, byte: u8) {
        if !self.capturing {
            return;
        }
        if self.captured.len() >= USAGE_BYTES_MAX {
            self.top = Top::Failed;
            return;
        }
        self.captured.push(byte);
    }

    fn end_value(&mut self) {
        self.capturing = false;
        self.key_is_usage = false;
    }

    /// The `usage` value's bytes, once the whole object has been read; `None`
    /// when in doubt (see the module's documentation).
    pub fn finish(&self) -> Option<&[u8]> {
        let whole = self.top == Top::Done && !self.in_string;
        (whole && self.usage_seen == 1).then_some(self.captured.as_slice())
    }

    /// The answer as far as [`crate::wire::usage::UsageFields::of_answer`] reads it:
    /// `{"usage":<value>}`, for the provider's own conversion to usage.
    pub fn answer(&self) -> Option<Vec<u8>> {
        let value = self.finish()?;
        let mut answer = Vec::with_capacity(value.len() + 10);
        answer.extend_from_slice(b"{\"usage\":");
        answer.extend_from_slice(value);
        answer.push(b'}');
        Some(answer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::usage::UsageFields;

    fn scan(chunks: &[&[u8]]) -> Option<UsageFields> {
        let mut scanner = UsageScanner::default();
        for chunk in chunks {
            scanner.push(chunk);
        }
        UsageFields::of_answer(&scanner.answer()?)
    }

    #[test]
    fn the_top_level_usage_is_read_across_chunks() {
        let body = br#"{"id":"x","data":[{"embedding":[0.1,-2e3],"usage":{"prompt_tokens":99}}],
            "text":"a \"usage\": {\"prompt_tokens\": 5} }","usage" : {"prompt_tokens":9,"total_tokens":9}}"#;
        for split in 0..body.len() {
            let fields = scan(&[&body[..split], &body[split..]]).expect("read");
            assert_eq!(fields.prompt_tokens, 9, "split at {split}");
        }
        let bytes: Vec<&[u8]> = body.chunks(1).collect();
        assert_eq!(scan(&bytes).unwrap().prompt_tokens, 9);
    }

    #[test]
    fn doubt_reads_as_no_usage() {
        for body in [
            &br#"{"usage":{"prompt_tokens":9}"#[..],
            br#"{"usage":{"prompt_tokens":9},"usage":{"prompt_tokens":1}}"#,
            br#"{"usag\u0065":{"prompt_tokens":9}}"#,
            br#"[{"usage":{"prompt_tokens":9}}]"#,
            br#"{"usage":{"prompt_tokens":9}} trailing"#,
            br#"{"choices":[]}"#,
            b"not json",
        ] {
            assert_eq!(scan(&[body]), None, "{}", String::from_utf8_lossy(body));
        }
        let huge = format!(
            r#"{{"usage":{{"pad":"{}","prompt_tokens":9}}}}"#,
            "x".repeat(USAGE_BYTES_MAX)
        );
        assert_eq!(scan(&[huge.as_bytes()]), None);
    }
}
