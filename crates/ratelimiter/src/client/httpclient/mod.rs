//! The remote [`Limiter`](crate::Limiter) (docs/client-library.md, "Distributed mode: the HTTP client"):
//! reserve and complete over HTTP against `ratelimiterd`, plus the admin calls its
//! operator CLI needs.
//!
//! Connections are kept alive and reused. Every request has a timeout. A request that
//! times out, cannot connect, or is answered 503 is retried a bounded number of times
//! with the very same body, hence the same lease id, so a retry can never reserve twice
//! (docs/lease-ids.md, "Rules for callers"). Plain HTTP/1.1 only: put a TLS proxy in
//! front when the network needs it.
//!
//! # Failover
//!
//! The client may list several servers of one fleet (servers sharing their state
//! through one TigerBeetle cluster, so any of them can take any request). Each
//! call starts on the client's preferred server, at first the first listed. A
//! retry goes to the next server in the list, wrapping around, with the same body:
//! Reserve and Complete are idempotent by lease id and an admin `PUT` defines the
//! same state wherever it lands, so a retry elsewhere is as safe as a retry on the
//! same server. Moving on to a server not yet tried in this call does not wait;
//! coming back to one already tried (a single server, or a full round without an
//! answer) waits the server's `retry_after_ms` hint or the backoff, capped by
//! `retry_wait_ms_max`. `retries_max` bounds the retries of a call in total, across
//! servers. The server that answers (anything but a 503) becomes the preferred
//! one for every later call of the client and its clones, so a dead server costs
//! one failed attempt, not one per call. Answers other than a 503 (allowed,
//! denied, 4xx, other 5xx) are returned at once and never tried elsewhere.

mod config;
mod remote;
#[cfg(test)]
mod tests;
mod trace_context;

pub use config::{
    HttpClientConfig, HttpClientError, POOL_IDLE_PER_HOST_MAX, RESPONSE_BYTES_MAX, RETRIES_MAX_LIMIT, SERVERS_MAX,
};
pub use remote::HttpClient;
pub use trace_context::{with_trace_context, TraceContext, TRACESTATE_BYTES_MAX};
