//! The span exporter of OTLP over HTTP with protobuf bodies
//! (<https://opentelemetry.io/docs/specs/otlp/#otlphttp>): each batch encoded
//! straight into its request's bytes ([`super::span_proto`]) and posted by a
//! hyper client that speaks `https://` as well as `http://` (rustls, the
//! gateway's own connector), retried as the OTLP specification asks.
//!
//! The environment's exporter variables are read as the OpenTelemetry
//! specification names them
//! (<https://opentelemetry.io/docs/specs/otel/protocol/exporter/>):
//! `OTEL_EXPORTER_OTLP_{TRACES_,}HEADERS` over the section's headers and
//! `OTEL_EXPORTER_OTLP_{TRACES_,}TIMEOUT`; a value that cannot be read stops
//! the start, named, instead of being ignored.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::header::{CONTENT_TYPE, RETRY_AFTER};
use axum::http::{HeaderName, HeaderValue, Method, StatusCode, Uri};
use gateway::proxy::connector::{https_connector, webpki_roots};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use opentelemetry_http::hyper::HyperClient;
use opentelemetry_http::{Bytes, HttpClient, Request};
use opentelemetry_sdk::error::{OTelSdkError, OTelSdkResult};
use opentelemetry_sdk::trace::{SpanData, SpanExporter};
use opentelemetry_sdk::Resource;

use super::dropped::{OtelDropped, Signal};
use super::span_proto::{encode_request, EncodedResource};

/// How long one export may take, tries and waits included, when no variable
/// sets it: the OTLP exporter specification's default.
pub const TIMEOUT_MS_DEFAULT: u64 = 10_000;
/// Tries after the first for an answer the specification calls retryable
/// (429, 502, 503, 504) or a connection that failed: a collector restarting
/// gets a few seconds; past them the batch is dropped and counted, so that the
/// queue behind it keeps moving.
pub const RETRIES_MAX: u32 = 3;
/// The wait before the first retry, doubled each time up to [`RETRY_DELAY_MAX_MS`].
pub const RETRY_DELAY_FIRST_MS: u64 = 200;
/// The longest wait between tries, and the most of a collector's `Retry-After` honoured.
pub const RETRY_DELAY_MAX_MS: u64 = 5_000;
/// The body's media type for protobuf, as OTLP/HTTP names it.
const PROTOBUF: &str = "application/x-protobuf";

/// Where and how a signal is posted, the environment read.
#[derive(Debug, Clone)]
pub struct HttpSettings {
    /// The signal's full URL (`.../v1/traces`).
    pub endpoint: Uri,
    /// The section's headers, then the environment's over them.
    pub headers: Vec<(HeaderName, HeaderValue)>,
    /// How long one export may take in all.
    pub timeout: Duration,
}

impl HttpSettings {
    /// The settings of `signal` (`TRACES` or `METRICS`) posted to `endpoint`
    /// with the section's `headers`, the variables `env` reads over them.
    pub fn read(
        signal: &str,
        endpoint: &str,
        headers: &BTreeMap<String, String>,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Self, String> {
        let env = |name: &str| env(name).filter(|v| !v.trim().is_empty());
        let endpoint: Uri = (endpoint.parse()).map_err(|e| format!("telemetry: the endpoint `{endpoint}`: {e}"))?;
        let mut merged: BTreeMap<String, String> = headers.clone();
        for var in [
            "OTEL_EXPORTER_OTLP_HEADERS".to_owned(),
            format!("OTEL_EXPORTER_OTLP_{signal}_HEADERS"),
        ] {
            if let Some(value) = env(&var) {
                merged.extend(parse_headers(&value).map_err(|m| format!("{var}: {m}"))?);
            }
        }
        let headers = (merged.into_iter())
            .map(|(name, value)| header(&name, &value).map_err(|e| format!("telemetry: {e}")))
            .collect::<Result<_, _>>()?;
        let mut timeout_ms = TIMEOUT_MS_DEFAULT;
        for var in [
            "OTEL_EXPORTER_OTLP_TIMEOUT".to_owned(),
            format!("OTEL_EXPORTER_OTLP_{signal}_TIMEOUT"),
        ] {
            if let Some(value) = env(&var) {
                timeout_ms = (value.trim().parse::<u64>().ok().filter(|ms| *ms > 0))
                    .ok_or_else(|| format!("{var}: `{value}` is not a positive number of milliseconds"))?;
            }
        }
        for var in [
            "OTEL_EXPORTER_OTLP_COMPRESSION".to_owned(),
            format!("OTEL_EXPORTER_OTLP_{signal}_COMPRESSION"),
        ] {
            match env(&var) {
                Some(value) if !value.trim().eq_ignore_ascii_case("none") => {
                    return Err(format!(
                        "{var}: `{value}` is not supported: exports are sent uncompressed (`none`)"
                    ))
                }
                _ => {}
            }
        }
        Ok(Self {
            endpoint,
            headers,
            timeout: Duration::from_millis(timeout_ms),
        })
    }
}

/// `key=value` pairs separated by commas, each value percent-decoded, as the
/// specification writes `OTEL_EXPORTER_OTLP_HEADERS`; a pair without `=` or
/// with an empty key is refused. The values are never echoed: they hold keys.
fn parse_headers(value: &str) -> Result<Vec<(String, String)>, String> {
    let mut pairs = Vec::new();
    for (n, pair) in value.split(',').map(str::trim).filter(|p| !p.is_empty()).enumerate() {
        let Some((key, value)) = pair.split_once('=') else {
            return Err(format!("entry {} is not `key=value`", n + 1));
        };
        let key = key.trim();
        if key.is_empty() {
            return Err(format!("entry {} has no key", n + 1));
        }
        let value =
            percent_decode(value.trim()).ok_or_else(|| format!("the value of `{key}` is not percent-encoded UTF-8"))?;
        pairs.push((key.to_owned(), value));
    }
    Ok(pairs)
}

/// `%XX` sequences decoded; `None` when one is cut short or the result is not UTF-8.
fn percent_decode(value: &str) -> Option<String> {
    let bytes = value.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut at = 0;
    while at < bytes.len() {
        if bytes[at] == b'%' {
            let hex = std::str::from_utf8(bytes.get(at + 1..at + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            at += 3;
        } else {
            out.push(bytes[at]);
            at += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// A header as sent, refused when HTTP cannot carry it: the error names it,
/// never shows its value, and is prefixed by the caller with where it came from.
pub fn header(name: &str, value: &str) -> Result<(HeaderName, HeaderValue), String> {
    let header_name = HeaderName::from_bytes(name.as_bytes()).map_err(|_| format!("`{name}` is not a header name"))?;
    let value = HeaderValue::from_str(value).map_err(|_| format!("the value of `{name}` is not printable ASCII"))?;
    Ok((header_name, value))
}

/// The HTTP client of the exports: `https://` (rustls, Mozilla's roots, as the
/// gateway dials providers) and `http://`; each request bounded by `timeout`.
pub fn https_client(timeout: Duration) -> HyperClient<HttpsConnector<HttpConnector>> {
    HyperClient::new(https_connector(webpki_roots()), timeout, None)
}

/// The span exporter: encodes each batch and posts it.
pub struct OtlpHttpSpans {
    client: Arc<dyn HttpClient>,
    settings: Arc<HttpSettings>,
    resource: EncodedResource,
    /// The encoder's working room and the room of the next body, kept between batches.
    buffers: Mutex<(Vec<u8>, Vec<u8>)>,
    /// Where spans a collector accepted only in part are counted.
    dropped: Arc<OtelDropped>,
}

impl std::fmt::Debug for OtlpHttpSpans {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OtlpHttpSpans")
            .field("endpoint", &self.settings.endpoint)
            .finish()
    }
}

impl OtlpHttpSpans {
    /// Spans posted by `client` as `settings` say; rejected ones counted in `dropped`.
    pub fn new(client: Arc<dyn HttpClient>, settings: HttpSettings, dropped: Arc<OtelDropped>) -> Self {
        Self {
            client,
            settings: Arc::new(settings),
            resource: EncodedResource::default(),
            buffers: Mutex::new((Vec::new(), Vec::new())),
            dropped,
        }
    }

    /// `batch`'s request body.
    fn body(&self, batch: &[SpanData]) -> Bytes {
        let mut buffers = self.buffers.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let (scratch, out) = &mut *buffers;
        encode_request(batch, &self.resource, scratch, out);
        // The request's bytes handed over whole, a buffer of the same room left
        // for the next batch: a batch is tens of kilobytes, copied for nothing.
        let room = out.capacity();
        Bytes::from(std::mem::replace(out, Vec::with_capacity(room)))
    }
}

impl SpanExporter for OtlpHttpSpans {
    fn export(&self, batch: Vec<SpanData>) -> impl std::future::Future<Output = OTelSdkResult> + Send {
        let body = self.body(&batch);
        drop(batch);
        let (client, settings, dropped) = (self.client.clone(), self.settings.clone(), self.dropped.clone());
        async move {
            let answer = post_with_retries(client.as_ref(), &settings, body).await?;
            if let Some((rejected, why)) = partial_success(&answer) {
                dropped.count(
                    Signal::Traces,
                    rejected,
                    &format!("the collector rejected spans: {why}"),
                );
            }
            Ok(())
        }
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.resource = EncodedResource::new(resource);
    }
}

/// Posts `body`, retrying what the specification calls retryable, within the
/// settings' timeout; the answer's body when the collector took it.
async fn post_with_retries(
    client: &dyn HttpClient,
    settings: &HttpSettings,
    body: Bytes,
) -> Result<Bytes, OTelSdkError> {
    let deadline = tokio::time::Instant::now() + settings.timeout;
    let mut delay = Duration::from_millis(RETRY_DELAY_FIRST_MS);
    let mut tries = 0;
    loop {
        tries += 1;
        let request = request(settings, body.clone())?;
        let sent = tokio::time::timeout_at(deadline, client.send_bytes(request)).await;
        let (failure, wait) = match sent {
            Err(_) => return Err(OTelSdkError::Timeout(settings.timeout)),
            Ok(Ok(answer)) if answer.status().is_success() => return Ok(answer.into_body()),
            Ok(Ok(answer)) => {
                let status = answer.status();
                let failure = format!("the collector answered {status}");
                if !retryable(status) {
                    return Err(OTelSdkError::InternalFailure(failure));
                }
                (failure, retry_after(answer.headers().get(RETRY_AFTER)).unwrap_or(delay))
            }
            Ok(Err(e)) => (format!("the collector could not be reached: {e}"), delay),
        };
        if tries > RETRIES_MAX || tokio::time::Instant::now() + wait >= deadline {
            return Err(OTelSdkError::InternalFailure(failure));
        }
        tokio::time::sleep(wait).await;
        delay = (delay * 2).min(Duration::from_millis(RETRY_DELAY_MAX_MS));
    }
}

/// One try's request.
fn request(settings: &HttpSettings, body: Bytes) -> Result<Request<Bytes>, OTelSdkError> {
    let mut request = Request::builder()
        .method(Method::POST)
        .uri(settings.endpoint.clone())
        .header(CONTENT_TYPE, PROTOBUF)
        .body(body)
        .map_err(|e| OTelSdkError::InternalFailure(format!("the export request: {e}")))?;
    for (name, value) in &settings.headers {
        request.headers_mut().insert(name.clone(), value.clone());
    }
    Ok(request)
}

/// Whether OTLP/HTTP says to try again after `status`
/// (<https://opentelemetry.io/docs/specs/otlp/#retryable-response-codes>).
fn retryable(status: StatusCode) -> bool {
    matches!(status.as_u16(), 429 | 502 | 503 | 504)
}

/// A `Retry-After` of whole seconds, at most [`RETRY_DELAY_MAX_MS`].
fn retry_after(value: Option<&HeaderValue>) -> Option<Duration> {
    let seconds: u64 = value?.to_str().ok()?.trim().parse().ok()?;
    Some(Duration::from_secs(seconds).min(Duration::from_millis(RETRY_DELAY_MAX_MS)))
}

/// An `ExportTraceServiceResponse`'s `partial_success`: the spans the
/// collector rejected and why, when it rejected any.
fn partial_success(answer: &[u8]) -> Option<(u64, String)> {
    let partial = field(answer, 1)?;
    let rejected = varint_field(partial, 1).filter(|n| *n > 0)?;
    let why = field(partial, 2)
        .and_then(|m| std::str::from_utf8(m).ok())
        .unwrap_or("no reason given");
    Some((rejected, why.to_owned()))
}

/// The last length-delimited field `number` of a message (protobuf's last-one-wins).
fn field(message: &[u8], number: u64) -> Option<&[u8]> {
    last(message, number, |value| match value {
        Wire::Len(bytes) => Some(bytes),
        _ => None,
    })
}

/// The last varint field `number` of a message.
fn varint_field(message: &[u8], number: u64) -> Option<u64> {
    last(message, number, |value| match value {
        Wire::Varint(v) => Some(v),
        _ => None,
    })
}

/// The last field `number` of a message that `pick` takes.
fn last<'a, T>(message: &'a [u8], number: u64, pick: impl Fn(Wire<'a>) -> Option<T>) -> Option<T> {
    let mut found = None;
    walk(message, |n, value| {
        if n == number {
            found = pick(value).or(found.take());
        }
    })?;
    found
}

/// A field's value as the walk reads it.
enum Wire<'a> {
    Varint(u64),
    Len(&'a [u8]),
    Other,
}

/// Calls `each` with every field of `message`; `None` when it is not protobuf.
fn walk<'a>(mut message: &'a [u8], mut each: impl FnMut(u64, Wire<'a>)) -> Option<()> {
    while !message.is_empty() {
        let key = read_varint(&mut message)?;
        let value = match key & 7 {
            0 => Wire::Varint(read_varint(&mut message)?),
            1 => Wire::Other.skip(&mut message, 8)?,
            2 => {
                let len = usize::try_from(read_varint(&mut message)?).ok()?;
                let (bytes, rest) = (message.get(..len)?, message.get(len..)?);
                message = rest;
                Wire::Len(bytes)
            }
            5 => Wire::Other.skip(&mut message, 4)?,
            _ => return None,
        };
        each(key >> 3, value);
    }
    Some(())
}

impl Wire<'_> {
    /// Skips a fixed-size value of `len` bytes.
    fn skip(self, message: &mut &[u8], len: usize) -> Option<Self> {
        *message = message.get(len..)?;
        Some(self)
    }
}

/// Reads a varint off the front of `message`.
fn read_varint(message: &mut &[u8]) -> Option<u64> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let (&byte, rest) = message.split_first()?;
        *message = rest;
        value |= u64::from(byte & 0x7f) << shift;
        if byte < 0x80 {
            return Some(value);
        }
    }
    None
}

#[cfg(test)]
#[path = "otlp_http_tests.rs"]
mod tests;
