//! A raw HTTP/1.1 client over `std::net`: it writes whatever bytes a test gives
//! it (invalid UTF-8, lying lengths, half a body) and parses one response.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use serde_json::Value;

use super::WAIT_MAX;

/// The largest response read: every answer of the API is far smaller.
const RESPONSE_BYTES_MAX: usize = 16 * 1024 * 1024;

/// One parsed response.
#[derive(Debug, Clone)]
pub struct Response {
    /// The status code.
    pub status: u16,
    /// Header names (lower case) and values.
    pub headers: Vec<(String, String)>,
    /// The body, de-chunked.
    pub body: Vec<u8>,
}

impl Response {
    /// The first value of header `name` (lower case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }

    /// The body as JSON; panics, showing the body, when it is not.
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("HTTP {} body is not JSON ({e}): {:?}", self.status, self.text()))
    }

    /// The `error` field of a JSON error body; panics when there is none.
    pub fn error(&self) -> String {
        match self.json().get("error") {
            Some(Value::String(error)) => error.clone(),
            _ => panic!("HTTP {} body has no error string: {}", self.status, self.text()),
        }
    }

    /// The body as text, lossily.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The body as JSON, or as a JSON string when it is not JSON (as the
    /// Prometheus text of `/metrics` is not).
    pub fn value(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|_| Value::String(self.text()))
    }
}

/// A connection a test writes to piece by piece.
pub struct Session {
    stream: TcpStream,
    buffered: Vec<u8>,
}

impl Session {
    /// Connects to `addr`; reads wait at most [`WAIT_MAX`]. Panics when it cannot.
    pub fn open(addr: SocketAddr) -> Session {
        Self::connect(addr).expect("connect")
    }

    /// Connects to `addr`; reads wait at most [`WAIT_MAX`].
    pub fn connect(addr: SocketAddr) -> io::Result<Session> {
        let stream = TcpStream::connect(addr)?;
        stream.set_read_timeout(Some(WAIT_MAX))?;
        stream.set_nodelay(true)?;
        Ok(Session {
            stream,
            buffered: Vec::new(),
        })
    }

    /// Writes `bytes` (errors ignored: the server may have closed already).
    pub fn write(&mut self, bytes: &[u8]) {
        let _ = self.stream.write_all(bytes);
        let _ = self.stream.flush();
    }

    /// Reads one response; `Err` when the server closed or stayed silent.
    pub fn read_response(&mut self) -> io::Result<Response> {
        let head_end = loop {
            if let Some(end) = find(&self.buffered, b"\r\n\r\n") {
                break end;
            }
            self.fill()?;
        };
        let head = String::from_utf8_lossy(&self.buffered[..head_end]).into_owned();
        self.buffered.drain(..head_end + 4);
        let mut lines = head.split("\r\n");
        let status_line = lines.next().unwrap_or_default();
        let status = status_line
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, format!("bad status line {status_line:?}")))?;
        let headers: Vec<(String, String)> = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
            .collect();
        let mut response = Response {
            status,
            headers,
            body: Vec::new(),
        };
        response.body = self.read_body(&response)?;
        Ok(response)
    }

    fn read_body(&mut self, response: &Response) -> io::Result<Vec<u8>> {
        if response
            .header("transfer-encoding")
            .is_some_and(|v| v.contains("chunked"))
        {
            return self.read_chunked();
        }
        match response.header("content-length").and_then(|v| v.parse::<usize>().ok()) {
            Some(length) => {
                while self.buffered.len() < length {
                    self.fill()?;
                }
                Ok(self.buffered.drain(..length).collect())
            }
            None => {
                while self.fill().is_ok() {}
                Ok(std::mem::take(&mut self.buffered))
            }
        }
    }

    fn read_chunked(&mut self) -> io::Result<Vec<u8>> {
        let mut body = Vec::new();
        loop {
            let line_end = loop {
                if let Some(end) = find(&self.buffered, b"\r\n") {
                    break end;
                }
                self.fill()?;
            };
            let size_text = String::from_utf8_lossy(&self.buffered[..line_end]).into_owned();
            let size = usize::from_str_radix(size_text.split(';').next().unwrap_or("").trim(), 16)
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
            self.buffered.drain(..line_end + 2);
            while self.buffered.len() < size + 2 {
                self.fill()?;
            }
            body.extend(self.buffered.drain(..size));
            self.buffered.drain(..2);
            if size == 0 {
                return Ok(body);
            }
        }
    }

    fn fill(&mut self) -> io::Result<()> {
        let mut chunk = [0u8; 16 * 1024];
        let read = self.stream.read(&mut chunk)?;
        if read == 0 {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "the server closed"));
        }
        if self.buffered.len() + read > RESPONSE_BYTES_MAX {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "response too large"));
        }
        self.buffered.extend_from_slice(&chunk[..read]);
        Ok(())
    }

    /// Waits at most `wait` for the start of a response: `None` when nothing
    /// came, else the response or why there is none (the server closed).
    pub fn poll_response(&mut self, wait: Duration) -> Option<io::Result<Response>> {
        if self.buffered.is_empty() {
            self.stream.set_read_timeout(Some(wait)).expect("read timeout");
            let filled = self.fill();
            self.stream.set_read_timeout(Some(WAIT_MAX)).expect("read timeout");
            match filled {
                Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => return None,
                Err(e) => return Some(Err(e)),
                Ok(()) => {}
            }
        }
        Some(self.read_response())
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// Writes `bytes` on a fresh connection and reads one response.
pub fn exchange(addr: SocketAddr, bytes: &[u8]) -> io::Result<Response> {
    let mut session = Session::connect(addr)?;
    session.write(bytes);
    session.read_response()
}

/// A request with a correct `content-length`, `connection: close` and the
/// bearer `token` when given.
pub fn request_bytes(method: &str, path: &str, token: Option<&str>, body: &[u8]) -> Vec<u8> {
    let mut head = format!("{method} {path} HTTP/1.1\r\nhost: test\r\nconnection: close\r\n");
    if let Some(token) = token {
        head.push_str(&format!("authorization: Bearer {token}\r\n"));
    }
    if !body.is_empty() {
        head.push_str("content-type: application/json\r\n");
    }
    head.push_str(&format!("content-length: {}\r\n\r\n", body.len()));
    let mut bytes = head.into_bytes();
    bytes.extend_from_slice(body);
    bytes
}

/// One request on a fresh connection; panics when there is no response.
pub fn request(addr: SocketAddr, method: &str, path: &str, token: Option<&str>, body: &[u8]) -> Response {
    exchange(addr, &request_bytes(method, path, token, body))
        .unwrap_or_else(|e| panic!("{method} {path}: no response: {e}"))
}

/// One request with a JSON body that must be answered 200, the shape of most
/// tests' setup steps (define a limit, reserve, complete); returns the answer.
pub fn ok(addr: SocketAddr, method: &str, path: &str, token: &str, body: &Value) -> Response {
    let answer = request(addr, method, path, Some(token), body.to_string().as_bytes());
    assert_eq!(answer.status, 200, "{method} {path}: {}", answer.text());
    answer
}
