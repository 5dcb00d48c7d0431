//! The fault switch that makes the simulator fail on demand (`POST /sim/faults`,
//! docs/provider-sim.md): what a fault does, the body that arms one, and the
//! answers a fault gives in place of the provider's.

use axum::body::{Body, Bytes};
use axum::http::{HeaderValue, StatusCode};
use axum::response::Response;
use serde::Deserialize;

use crate::sim::errors::{error, retry_headers, Wire};

/// The most calls one armed fault may cover: a bound on a counter set over HTTP.
pub const FAULT_COUNT_MAX: u64 = 1_000_000;
/// The longest retry hint a status fault may carry: one day.
pub const FAULT_RETRY_AFTER_MS_MAX: u64 = 86_400_000;
/// The longest a fault may be armed for by time: one hour.
pub const FAULT_FOR_MS_MAX: u64 = 3_600_000;
/// The most events a stream emits before a `drop` fault cuts it.
pub const FAULT_AFTER_EVENTS_MAX: u64 = 1_000_000;

/// What an armed fault does to the calls it covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case", tag = "mode")]
pub enum FaultMode {
    /// Answer this status (4xx or 5xx) in the provider's error shape; a 429 carries
    /// `retry_after_ms` as `retry-after-ms` and `retry-after`.
    Status {
        /// The HTTP status.
        status: u16,
        /// The retry hint of a 429.
        #[serde(default)]
        retry_after_ms: u64,
    },
    /// Accept the call and never answer: the caller's timeout must end it.
    Hang,
    /// Streams: emit `after_events` events, then cut the connection without the
    /// stream's end. Other calls: cut it before the body.
    Drop {
        /// Events sent before the cut.
        #[serde(default)]
        after_events: u64,
    },
}

/// The body of `POST /sim/faults` (unknown fields are ignored: serde cannot deny
/// them beside a flattened field).
#[derive(Debug, Clone, Deserialize)]
pub struct FaultRequest {
    /// What to do.
    #[serde(flatten)]
    pub mode: FaultMode,
    /// How many of the next model calls it covers (with `for_ms`: at most).
    #[serde(default)]
    pub count: Option<u64>,
    /// Covers every model call for this long from now (a provider failing for a
    /// while): the benchmark of a pool's failover arms one deployment this way.
    #[serde(default)]
    pub for_ms: Option<u64>,
    /// Only calls for this model; all models when absent.
    #[serde(default)]
    pub model: Option<String>,
}

/// A fault armed by `POST /sim/faults`, taken by the calls it covers.
#[derive(Debug, Clone)]
pub(crate) struct ArmedFault {
    /// What it does.
    pub(crate) mode: FaultMode,
    /// The calls it still covers.
    pub(crate) left: u64,
    /// `Some`: the fault ends then, whatever is left.
    pub(crate) until: Option<std::time::Instant>,
    /// Only calls for this model; all models when `None`.
    pub(crate) model: Option<String>,
}

/// The answer to a fault that ends the call before it reaches the ledger, or
/// `None` for `drop` on a stream (the stream applies it).
pub async fn fault_response(wire: Wire, mode: FaultMode) -> Option<Response> {
    match mode {
        FaultMode::Status { status, retry_after_ms } => {
            let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            let mut response = error(wire, status, format!("simulated fault: status {}", status.as_u16()));
            if status == StatusCode::TOO_MANY_REQUESTS {
                retry_headers(response.headers_mut(), retry_after_ms.max(1));
            }
            Some(response)
        }
        FaultMode::Hang => std::future::pending().await,
        FaultMode::Drop { .. } => None,
    }
}

/// A call that is not streamed, cut before its body (the fault `drop`); OpenAI's
/// answers carry their JSON content type first.
pub(crate) fn dropped(wire: Wire) -> Response {
    let mut response = Response::new(dropped_body(Vec::new()));
    if wire == Wire::Openai {
        response
            .headers_mut()
            .insert("content-type", HeaderValue::from_static("application/json"));
    }
    response
}

/// The body that cuts the connection after `chunks` (the fault `drop`).
pub fn dropped_body(chunks: Vec<Bytes>) -> Body {
    let cut = std::io::Error::new(std::io::ErrorKind::ConnectionAborted, "simulated drop");
    let items = chunks.into_iter().map(Ok).chain(std::iter::once(Err(cut)));
    Body::from_stream(futures_util::stream::iter(items))
}
