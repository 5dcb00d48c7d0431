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
//!
//! The top-level `id` and `conversation` are kept the same way, bounded by
//! [`ID_BYTES_MAX`] and [`CONVERSATION_BYTES_MAX`]: the Responses API's id and
//! the conversation it belongs to, which the gateway remembers for the tenant
//! it answered (`proxy/response_ids.rs`).
//!
//! When the call is traced ([`UsageScanner::with_facts`]), the answer's
//! `model`, its finish reasons and its error type are read the same way, for
//! the try's span ([`super::response_facts`]).

use super::capture::{json_string, string_run_len, Capture, KeyBytes, CAPTURE_BYTES_FIRST};
use super::content::CONTENT_BYTES_MAX;
use super::response_facts::{ChoicesReasons, ResponseFacts, FACT_BYTES_MAX};

/// The largest `usage` value kept: the providers' are a few hundred bytes.
pub const USAGE_BYTES_MAX: usize = 64 * 1024;
/// The largest `id` value kept (quotes included): the providers' ids are tens
/// of bytes; a longer one reads as no id.
pub const ID_BYTES_MAX: usize = 256;
/// The largest `conversation` value kept: `{"id":"conv_..."}` is tens of bytes;
/// a longer one reads as no conversation.
pub const CONVERSATION_BYTES_MAX: usize = 512;
/// The largest top-level `error` value kept, for its `type`: the providers'
/// error objects are a few hundred bytes; a larger one reads as no type.
pub const ERROR_BYTES_MAX: usize = 4 * 1024;
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
    /// The key being read at depth 1, `None` when too long or escaped: in
    /// place, since every top-level key of every answer passes through it.
    key: Option<KeyBytes>,
    key_is_usage: bool,
    capturing: bool,
    captured: Vec<u8>,
    usage_seen: u32,
    /// The same for the top-level `id`, bounded by [`ID_BYTES_MAX`].
    id: Capture,
    /// The same for the top-level `conversation`, bounded by [`CONVERSATION_BYTES_MAX`].
    conversation: Capture,
    /// What the answer says of itself, read only when the call is traced.
    facts: Option<Box<FactCaptures>>,
    /// Whether anything keeps the bytes of the current top-level value (the
    /// usage, a capture, a fact): set where a value starts and ends, so that
    /// the bytes of values nothing reads cost one test.
    keeping: bool,
}

/// The top-level values read for [`ResponseFacts`]: `model`, Anthropic's
/// `stop_reason`, the Responses API's `status`, an error's `error`, and the
/// finish reasons inside `choices`.
#[derive(Debug)]
struct FactCaptures {
    model: Capture,
    stop_reason: Capture,
    status: Capture,
    error: Capture,
    key_is_choices: bool,
    in_choices: bool,
    /// Whether any capture is reading a value: every byte of the answer passes
    /// through [`Self::keep`], nearly all of them outside the few values read.
    any_active: bool,
    choices: ChoicesReasons,
    /// The answer's content value (`choices`, `output` or `content`), kept
    /// only when the operator opted in to message content.
    content: Option<[Capture; 3]>,
}

impl FactCaptures {
    fn new() -> Self {
        Self {
            model: Capture::new(b"model", FACT_BYTES_MAX),
            stop_reason: Capture::new(b"stop_reason", FACT_BYTES_MAX),
            status: Capture::new(b"status", FACT_BYTES_MAX),
            error: Capture::new(b"error", ERROR_BYTES_MAX),
            key_is_choices: false,
            in_choices: false,
            any_active: false,
            choices: ChoicesReasons::default(),
            content: None,
        }
    }

    /// Runs `f` on every capture: a plain loop, as it runs for every top-level
    /// key and every byte of a value read.
    fn each_capture(&mut self, mut f: impl FnMut(&mut Capture)) {
        f(&mut self.model);
        f(&mut self.stop_reason);
        f(&mut self.status);
        f(&mut self.error);
        if let Some(content) = &mut self.content {
            content.iter_mut().for_each(f);
        }
    }

    fn on_key(&mut self, key: Option<&[u8]>) {
        self.key_is_choices = key == Some(&b"choices"[..]);
        self.each_capture(|c| c.on_key(key));
    }

    fn on_colon(&mut self) {
        self.in_choices = self.key_is_choices;
        let mut any_active = false;
        self.each_capture(|c| {
            c.on_colon();
            any_active |= c.active;
        });
        self.any_active = any_active;
    }

    /// Whether a string's bytes matter to a fact: a value kept, or a
    /// choice's key or finish reason.
    fn reads_strings(&self) -> bool {
        self.any_active || (self.in_choices && self.choices.reads_strings())
    }

    fn keep(&mut self, byte: u8) {
        if self.in_choices {
            self.choices.byte(byte);
        }
        if self.any_active {
            self.each_capture(|c| c.keep(byte));
        }
    }

    /// Keeps a run of a string's plain bytes as [`Self::keep`] would each.
    fn keep_run(&mut self, run: &[u8]) {
        if self.in_choices {
            self.choices.string_run(run);
        }
        if self.any_active {
            self.each_capture(|c| c.keep_run(run));
        }
    }

    fn end_value(&mut self) {
        self.key_is_choices = false;
        self.in_choices = false;
        self.any_active = false;
        self.each_capture(Capture::end_value);
    }

    /// The facts read, with `id` the scanner's.
    fn facts(&self, id: Option<String>) -> ResponseFacts {
        let string = |capture: &Capture| json_string(capture.value()?).filter(|s| s.len() <= FACT_BYTES_MAX);
        let mut facts = ResponseFacts {
            id,
            model: string(&self.model),
            ..ResponseFacts::default()
        };
        let (stop_reason, status) = (string(&self.stop_reason), string(&self.status));
        for reason in (self.choices.reasons.iter().map(String::as_str))
            .chain(stop_reason.as_deref())
            .chain(status.as_deref())
        {
            facts.push_reason(reason);
        }
        if let Some(error) = self
            .error
            .value()
            .and_then(|v| serde_json::from_slice::<serde_json::Value>(v).ok())
        {
            facts.read_error(&error);
        }
        facts
    }
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
            id: Capture::new(b"id", ID_BYTES_MAX),
            conversation: Capture::new(b"conversation", CONVERSATION_BYTES_MAX),
            facts: None,
            keeping: false,
        }
    }
}

impl UsageScanner {
    /// A scanner that reads the answer's [`ResponseFacts`] too.
    pub fn with_facts() -> Self {
        Self {
            facts: Some(Box::new(FactCaptures::new())),
            ..Self::default()
        }
    }

    /// A scanner that reads the answer's facts and its content value
    /// (`choices`, `output` or `content`, each up to twice
    /// [`CONTENT_BYTES_MAX`], for its escapes).
    pub fn with_content() -> Self {
        let mut facts = FactCaptures::new();
        let bound = 2 * CONTENT_BYTES_MAX;
        facts.content = Some([b"choices".as_slice(), b"output", b"content"].map(|key| Capture::new(key, bound)));
        Self {
            facts: Some(Box::new(facts)),
            ..Self::default()
        }
    }

    /// The answer's content value, once the whole object has been read, when
    /// the scanner was made [`UsageScanner::with_content`] and the value fit.
    pub fn content(&self) -> Option<serde_json::Value> {
        let whole = self.top == Top::Done && !self.in_string;
        let captures = self.facts.as_ref().filter(|_| whole)?.content.as_ref()?;
        let value = captures.iter().find_map(|c| c.value().filter(|v| !v.is_empty()))?;
        serde_json::from_slice(value).ok()
    }

    /// Reads the next bytes of the answer.
    pub fn push(&mut self, chunk: &[u8]) {
        self.push_bytes(chunk, true);
    }

    /// Reads `chunk`; with `skip`, the inside of a string that nothing reads
    /// (most of an answer: its text, and every key and value below the top
    /// level but those read) passes in one search for its next quote or
    /// escape, as byte by byte it would change nothing.
    fn push_bytes(&mut self, chunk: &[u8], skip: bool) {
        let mut at = 0;
        while let Some(&byte) = chunk.get(at) {
            if matches!(self.top, Top::Failed) {
                return;
            }
            if skip && self.passes_unkept() {
                let next = self.pass_unkept(chunk, at);
                if next > at {
                    at = next;
                    continue;
                }
            }
            if skip && self.in_string && !self.escape {
                let rest = &chunk[at..];
                let run = string_run_len(rest);
                if run > 0 {
                    if !self.string_unread() {
                        self.string_run(&rest[..run]);
                    }
                    at += run;
                    continue;
                }
            }
            self.byte(byte);
            at += 1;
        }
    }

    /// Whether the scanner is inside a top-level value, between its strings,
    /// that nothing keeps but the finish reasons' reader of `choices`: there
    /// only the nesting changes anything, and that reader's bytes.
    fn passes_unkept(&self) -> bool {
        let only_choices = || {
            !self.capturing
                && !self.id.active
                && !self.conversation.active
                && self.facts.as_ref().is_some_and(|f| f.in_choices && !f.any_active)
        };
        self.top == Top::Value && !self.in_string && self.depth >= 1 && (!self.keeping || only_choices())
    }

    /// Passes the bytes of such a value from `at`, following only its nesting
    /// and handing each byte to the finish reasons' reader when in `choices`,
    /// up to a string's quote, a byte that may end the value (`,`, `}` or `]`
    /// at the top level) or nesting past [`DEPTH_MAX`], each left to
    /// [`Self::byte`]; returns where it stopped. Byte by byte, every other
    /// byte would do just that: most of an answer's choices pass here.
    fn pass_unkept(&mut self, chunk: &[u8], mut at: usize) -> usize {
        debug_assert!(self.passes_unkept());
        let mut choices = (self.facts.as_mut()).filter(|f| f.in_choices).map(|f| &mut f.choices);
        let mut depth = self.depth;
        while let Some(&byte) = chunk.get(at) {
            match byte {
                b'"' => break,
                b'{' | b'[' if depth >= DEPTH_MAX => break,
                b'{' | b'[' => depth += 1,
                b'}' | b']' | b',' if depth == 1 => break,
                b'}' | b']' => depth -= 1,
                _ => {}
            }
            if let Some(choices) = choices.as_mut() {
                choices.byte(byte);
            }
            at += 1;
        }
        self.depth = depth;
        at
    }

    /// Reads `run`, bytes of a string that are neither its closing quote nor an
    /// escape, as [`Self::string_byte`] reads each of them, in one copy per
    /// reader: keys, ids and usage are mostly such runs.
    fn string_run(&mut self, run: &[u8]) {
        debug_assert!(self.in_string && !self.escape && !run.contains(&b'"') && !run.contains(&b'\\'));
        let in_key = self.key.is_some() || (self.depth == 1 && self.top == Top::ExpectKey);
        if in_key {
            if let Some(key) = &mut self.key {
                if !key.extend(run) {
                    self.key = None;
                }
            }
            return;
        }
        if self.depth == 0 {
            // A string before the object opens: not an object.
            self.top = Top::Failed;
            return;
        }
        if !self.keeping {
            return;
        }
        self.id.keep_run(run);
        self.conversation.keep_run(run);
        if let Some(facts) = &mut self.facts {
            facts.keep_run(run);
        }
        if self.capturing {
            if self.captured.len() + run.len() > USAGE_BYTES_MAX {
                self.top = Top::Failed;
                return;
            }
            self.captured.extend_from_slice(run);
        }
    }

    /// Whether the scanner is inside a string whose bytes but its quote and
    /// escapes change nothing: not a top-level key, no value being kept, no
    /// fact reading it.
    fn string_unread(&self) -> bool {
        let in_key = self.key.is_some() || (self.depth == 1 && self.top == Top::ExpectKey);
        self.in_string
            && !self.escape
            && !in_key
            && !self.capturing
            && !self.id.active
            && !self.conversation.active
            && self.facts.as_ref().is_none_or(|facts| !facts.reads_strings())
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
                    self.key = Some(KeyBytes::default());
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
                    self.captured.reserve(CAPTURE_BYTES_FIRST);
                }
                self.id.on_colon();
                self.conversation.on_colon();
                if let Some(facts) = &mut self.facts {
                    facts.on_colon();
                }
                self.keeping = self.capturing
                    || self.id.active
                    || self.conversation.active
                    || self.facts.as_ref().is_some_and(|f| f.any_active || f.in_choices);
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
                let key = self.key.take();
                let key = key.as_ref().map(KeyBytes::as_slice);
                self.key_is_usage = key == Some(&b"usage"[..]);
                self.id.on_key(key);
                self.conversation.on_key(key);
                if let Some(facts) = &mut self.facts {
                    facts.on_key(key);
                }
                self.top = Top::ExpectColon;
                return;
            }
        } else if in_key {
            if let Some(key) = &mut self.key {
                if !key.push(byte) {
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

    /// Every byte of every value passes here: what reads none of them costs a
    /// test of a flag.
    #[inline]
    fn keep(&mut self, byte: u8) {
        if !self.keeping {
            return;
        }
        self.id.keep(byte);
        self.conversation.keep(byte);
        if let Some(facts) = &mut self.facts {
            facts.keep(byte);
        }
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
        self.keeping = false;
        self.key_is_usage = false;
        self.id.end_value();
        self.conversation.end_value();
        if let Some(facts) = &mut self.facts {
            facts.end_value();
        }
    }

    /// What the answer said of itself, once the whole object has been read,
    /// when the scanner was made [`UsageScanner::with_facts`].
    pub fn response_facts(&self) -> Option<ResponseFacts> {
        let whole = self.top == Top::Done && !self.in_string;
        let facts = self.facts.as_ref().filter(|_| whole)?;
        Some(facts.facts(self.id()))
    }

    /// The top-level `id` when it is a string, once the whole object has been
    /// read; `None` when in doubt, as for the usage.
    pub fn id(&self) -> Option<String> {
        let whole = self.top == Top::Done && !self.in_string;
        if !whole {
            return None;
        }
        json_string(self.id.value()?)
    }

    /// The top-level `conversation` (`null` or absent: none), once the whole
    /// object has been read; `None` when in doubt.
    pub fn conversation(&self) -> Option<serde_json::Value> {
        let whole = self.top == Top::Done && !self.in_string;
        if !whole {
            return None;
        }
        serde_json::from_slice(self.conversation.value()?).ok()
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
#[path = "usage_scan_tests.rs"]
mod tests;
