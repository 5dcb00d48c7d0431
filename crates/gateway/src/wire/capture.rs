//! What the answer scan ([`super::usage_scan`]) keeps as it reads: a
//! top-level key being read, a top-level value captured whole when small, and
//! the reading of a captured string; and where a string's plain bytes end.

/// The longest key compared with `usage`, `id` and `conversation`; longer keys
/// are skipped unread.
pub const KEY_BYTES_MAX: usize = 12;

/// A top-level key being read, up to [`KEY_BYTES_MAX`] bytes, held without an allocation.
#[derive(Debug, Clone, Copy, Default)]
pub struct KeyBytes {
    bytes: [u8; KEY_BYTES_MAX],
    len: usize,
}

impl KeyBytes {
    /// Appends `byte`; false when the key is longer than any compared.
    pub fn push(&mut self, byte: u8) -> bool {
        let Some(slot) = self.bytes.get_mut(self.len) else {
            return false;
        };
        *slot = byte;
        self.len += 1;
        true
    }

    /// Appends `run`; false when the key grows longer than any compared.
    pub fn extend(&mut self, run: &[u8]) -> bool {
        let Some(slots) = self.bytes.get_mut(self.len..self.len + run.len()) else {
            return false;
        };
        slots.copy_from_slice(run);
        self.len += run.len();
        true
    }

    /// The key's bytes so far.
    pub fn as_slice(&self) -> &[u8] {
        &self.bytes[..self.len]
    }
}

/// Bytes reserved for a captured value when its key is met: the usual `id`,
/// `conversation` or `usage` fits without the buffer growing byte by byte.
pub const CAPTURE_BYTES_FIRST: usize = 256;

/// One top-level value kept whole when small, by its key.
#[derive(Debug)]
pub struct Capture {
    key: &'static [u8],
    bytes_max: usize,
    key_matches: bool,
    /// Whether its value is being read.
    pub active: bool,
    bytes: Vec<u8>,
    seen: u32,
    too_long: bool,
}

impl Capture {
    /// A capture of the top-level value of `key`, of at most `bytes_max` bytes.
    pub fn new(key: &'static [u8], bytes_max: usize) -> Self {
        Self {
            key,
            bytes_max,
            key_matches: false,
            active: false,
            bytes: Vec::new(),
            seen: 0,
            too_long: false,
        }
    }

    /// A top-level key was read (`None`: one too long or escaped).
    pub fn on_key(&mut self, key: Option<&[u8]>) {
        self.key_matches = key == Some(self.key);
    }

    /// The key's value starts: read when the key was this capture's.
    pub fn on_colon(&mut self) {
        if self.key_matches {
            self.seen += 1;
            self.active = true;
            self.bytes.clear();
            self.bytes.reserve(CAPTURE_BYTES_FIRST.min(self.bytes_max));
        }
    }

    /// Keeps `byte` of the value being read, within the bound.
    pub fn keep(&mut self, byte: u8) {
        self.keep_run(std::slice::from_ref(&byte));
    }

    /// Keeps the bytes of `run` of the value being read, within the bound: a
    /// value past it reads as none.
    pub fn keep_run(&mut self, run: &[u8]) {
        if !self.active {
            return;
        }
        let room = self.bytes_max.saturating_sub(self.bytes.len());
        let kept = run.len().min(room);
        self.bytes.extend_from_slice(&run[..kept]);
        if kept < run.len() {
            self.too_long = true;
        }
    }

    /// The top-level value ended.
    pub fn end_value(&mut self) {
        self.active = false;
        self.key_matches = false;
    }

    /// The value's bytes when the key came once and its value fit.
    pub fn value(&self) -> Option<&[u8]> {
        (self.seen == 1 && !self.too_long).then_some(self.bytes.as_slice())
    }
}

/// The text of a captured JSON value when it is a string: its bytes between
/// the quotes when they hold no escape and no control character (an id, a
/// model: nearly always), else as `serde_json` reads it; `None` for another value.
pub fn json_string(value: &[u8]) -> Option<String> {
    let trimmed = value.trim_ascii();
    if let [b'"', inner @ .., b'"'] = trimmed {
        let plain = inner.iter().all(|&b| b >= 0x20 && b != b'"' && b != b'\\');
        if let (true, Ok(text)) = (plain, std::str::from_utf8(inner)) {
            return Some(text.to_owned());
        }
    }
    serde_json::from_slice::<String>(value).ok()
}

/// The bytes a string holds from the start of `rest` before its next quote or
/// escape (all of `rest` when neither comes). The first few bytes are looked
/// at one by one: most strings an answer's scan meets are keys and ids of a
/// few bytes, which end before a vector search would have started.
pub fn string_run_len(rest: &[u8]) -> usize {
    const LOOKED_AT_FIRST: usize = 16;
    let head = &rest[..rest.len().min(LOOKED_AT_FIRST)];
    if let Some(end) = head.iter().position(|&b| b == b'"' || b == b'\\') {
        return end;
    }
    let tail = &rest[head.len()..];
    head.len() + memchr::memchr2(b'"', b'\\', tail).unwrap_or(tail.len())
}
