//! Server-sent events, split as they arrive (docs/gateway.md, "Forwarding").
//!
//! The gateway needs each event whole (to read usage, and to drop the usage chunk
//! it asked an OpenAI upstream for) and nothing more: a split on the blank line
//! that ends an event, over the bytes already received, forwards every event the
//! moment its last byte arrives. No SSE crate is needed for that, and none would
//! be faster than one scan for `\n\n`.

use bytes::{Bytes, BytesMut};

/// The longest event kept while waiting for its end: a stream whose event grows
/// past it is cut (the upstream is broken or hostile), bounding memory per call.
pub const EVENT_BYTES_MAX: usize = 16 * 1024 * 1024;

/// Why an event stream cannot be split.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("an event grew past {EVENT_BYTES_MAX} bytes")]
pub struct EventTooLong;

/// Splits a byte stream into whole events, each with its terminating blank line.
#[derive(Debug, Default)]
pub struct Splitter {
    pending: BytesMut,
}

impl Splitter {
    /// Adds `chunk` and returns the events it completes, in order.
    pub fn push(&mut self, chunk: &[u8]) -> Result<Vec<Bytes>, EventTooLong> {
        self.pending.extend_from_slice(chunk);
        let mut events = Vec::new();
        while let Some(end) = event_end(&self.pending) {
            events.push(self.pending.split_to(end).freeze());
        }
        if self.pending.len() > EVENT_BYTES_MAX {
            return Err(EventTooLong);
        }
        Ok(events)
    }

    /// What is left when the stream ends: an event without its blank line, if any.
    pub fn finish(&mut self) -> Option<Bytes> {
        (!self.pending.is_empty()).then(|| self.pending.split().freeze())
    }
}

/// The end (exclusive) of the first whole event: after `\n\n`, `\r\n\r\n` or `\r\r`.
fn event_end(buffer: &[u8]) -> Option<usize> {
    let mut i = 0;
    while i + 1 < buffer.len() {
        match (buffer[i], buffer[i + 1]) {
            (b'\n', b'\n') | (b'\r', b'\r') => return Some(i + 2),
            (b'\r', b'\n') if buffer.get(i + 2..i + 4) == Some(b"\r\n") => return Some(i + 4),
            _ => i += 1,
        }
    }
    None
}

/// The event's `event:` name, if any.
pub fn name(event: &[u8]) -> Option<&[u8]> {
    lines(event)
        .find_map(|line| line.strip_prefix(b"event:"))
        .map(trim_space)
}

/// The event's data: its `data:` lines joined by `\n`.
pub fn data(event: &[u8]) -> Option<Vec<u8>> {
    let mut out: Option<Vec<u8>> = None;
    for line in lines(event) {
        if let Some(value) = line.strip_prefix(b"data:") {
            let value = value.strip_prefix(b" ").unwrap_or(value);
            match &mut out {
                Some(data) => {
                    data.push(b'\n');
                    data.extend_from_slice(value);
                }
                None => out = Some(value.to_vec()),
            }
        }
    }
    out
}

fn lines(event: &[u8]) -> impl Iterator<Item = &[u8]> {
    event
        .split(|b| *b == b'\n' || *b == b'\r')
        .filter(|line| !line.is_empty())
}

fn trim_space(value: &[u8]) -> &[u8] {
    value.strip_prefix(b" ").unwrap_or(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_are_released_as_soon_as_they_end() {
        let mut splitter = Splitter::default();
        assert!(splitter.push(b"event: a\ndata: {\"x\"").unwrap().is_empty());
        let events = splitter.push(b":1}\n\ndata: [DONE]\n").unwrap();
        assert_eq!(events, vec![Bytes::from_static(b"event: a\ndata: {\"x\":1}\n\n")]);
        assert_eq!(name(&events[0]), Some(&b"a"[..]));
        assert_eq!(data(&events[0]).unwrap(), b"{\"x\":1}");
        assert_eq!(
            splitter.push(b"\n").unwrap(),
            vec![Bytes::from_static(b"data: [DONE]\n\n")]
        );
        assert_eq!(splitter.finish(), None);
        splitter.push(b"data: cut").unwrap();
        assert_eq!(splitter.finish(), Some(Bytes::from_static(b"data: cut")));
    }

    #[test]
    fn crlf_events_and_multi_line_data() {
        let mut splitter = Splitter::default();
        let events = splitter.push(b"data: a\r\ndata: b\r\n\r\ndata: c\n\n").unwrap();
        assert_eq!(events.len(), 2);
        assert_eq!(data(&events[0]).unwrap(), b"a\nb");
        assert_eq!(data(&events[1]).unwrap(), b"c");
        assert_eq!(splitter.finish(), None);
    }

    #[test]
    fn an_endless_event_is_refused() {
        let mut splitter = Splitter::default();
        let chunk = vec![b'x'; EVENT_BYTES_MAX / 2 + 1];
        assert!(splitter.push(&chunk).is_ok());
        assert_eq!(splitter.push(&chunk), Err(EventTooLong));
    }
}
