//! Per-tenant caps on calls open and calls waiting (docs/gateway.md, "Slow and
//! stalled clients"), so one tenant cannot fill the server's connection table or
//! a model's queue for the others.
//!
//! A call is open from its authentication to the last byte of its answer (a
//! stream included): over HTTP/1.1 that is one connection busy with the tenant's
//! call. An idle kept-alive connection belongs to no tenant yet; it is closed
//! after `client_header_timeout_ms` and counted by the server's `connections_max`.

use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::Body;
use bytes::Bytes;

use crate::wire::error::{ErrorKind, GatewayError};

/// The retry hint of a call refused by a tenant cap: a call of the tenant's
/// typically ends within a second or two.
pub const CAP_RETRY_AFTER_MS: u64 = 1_000;

/// One tenant's counters and caps (calls without a tenant share one).
#[derive(Debug)]
pub struct TenantCaps {
    /// Which configuration entry sets the caps, for the 429's message.
    entry: String,
    connections_max: usize,
    queued_max: usize,
    open: AtomicUsize,
    waiting: AtomicUsize,
}

/// One slot of a counter, given back when dropped.
#[derive(Debug)]
pub struct Held {
    caps: Arc<TenantCaps>,
    waiting: bool,
}

impl Drop for Held {
    fn drop(&mut self) {
        let counter = if self.waiting {
            &self.caps.waiting
        } else {
            &self.caps.open
        };
        counter.fetch_sub(1, Ordering::AcqRel);
    }
}

impl TenantCaps {
    /// The caps of the tenant configured at `entry` (`tenants[acme]`).
    pub fn new(entry: String, connections_max: usize, queued_max: usize) -> Self {
        assert!(connections_max > 0 && queued_max > 0, "validated caps");
        Self {
            entry,
            connections_max,
            queued_max,
            open: AtomicUsize::new(0),
            waiting: AtomicUsize::new(0),
        }
    }

    /// Calls open now.
    pub fn open_now(&self) -> usize {
        self.open.load(Ordering::Acquire)
    }

    /// Calls waiting now.
    pub fn waiting_now(&self) -> usize {
        self.waiting.load(Ordering::Acquire)
    }

    /// Takes an open-call slot, or a 429 naming the cap.
    pub fn open(self: &Arc<Self>) -> Result<Held, GatewayError> {
        self.take(false, self.connections_max, "connections_max", "calls open")
    }

    /// Takes a waiting slot, or a 429 naming the cap.
    pub fn wait(self: &Arc<Self>) -> Result<Held, GatewayError> {
        self.take(true, self.queued_max, "queued_max", "calls waiting in a queue")
    }

    fn take(self: &Arc<Self>, waiting: bool, max: usize, field: &str, what: &str) -> Result<Held, GatewayError> {
        let counter = if waiting { &self.waiting } else { &self.open };
        let taken = counter.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < max).then_some(n + 1));
        if taken.is_err() {
            let message = format!(
                "This tenant already has {max} {what}, its cap ({} {field}); retry when one ends.",
                self.entry
            );
            return Err(GatewayError::new(ErrorKind::RateLimited { budget: false }, message)
                .with_header("retry-after-ms", CAP_RETRY_AFTER_MS.to_string())
                .with_header("retry-after", CAP_RETRY_AFTER_MS.div_ceil(1000).to_string()));
        }
        Ok(Held {
            caps: self.clone(),
            waiting,
        })
    }
}

/// A response body that holds a slot until the body is done or dropped: the
/// call stays open for as long as its answer streams.
pub struct HoldingBody {
    inner: Body,
    _held: Held,
}

impl HoldingBody {
    /// `inner`, holding `held`.
    pub fn wrap(inner: Body, held: Held) -> Body {
        Body::new(Self { inner, _held: held })
    }
}

impl hyper::body::Body for HoldingBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cap_refuses_past_its_number_and_frees_on_drop() {
        let caps = Arc::new(TenantCaps::new("tenants[acme]".into(), 2, 1));
        let a = caps.open().unwrap();
        let _b = caps.open().unwrap();
        let error = caps.open().unwrap_err();
        assert_eq!(error.status(), 429);
        assert!(
            error.message.contains("tenants[acme] connections_max"),
            "{}",
            error.message
        );
        drop(a);
        let _c = caps.open().unwrap();
        let w = caps.wait().unwrap();
        assert!(caps.wait().unwrap_err().message.contains("queued_max"));
        drop(w);
        assert_eq!((caps.open_now(), caps.waiting_now()), (2, 0));
    }
}
