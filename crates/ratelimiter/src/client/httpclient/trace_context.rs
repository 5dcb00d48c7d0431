//! The caller's W3C trace context on the client's requests (docs/client-library.md,
//! "Tracing"): a `traceparent` (and `tracestate`) the caller gives for a scope
//! of its code, sent with every request [`super::HttpClient`] makes within it,
//! retries included, so that `ratelimiterd`'s span of the reserve or complete
//! joins the caller's trace. No tracing library is needed: the caller passes
//! the header its own tracer wrote (<https://www.w3.org/TR/trace-context/#traceparent-header>).

use std::future::Future;

use hyper::header::HeaderValue;

use super::config::HttpClientError;

/// The longest `tracestate` passed on: the W3C specification's bound on what a
/// vendor must propagate (<https://www.w3.org/TR/trace-context/#tracestate-limits>).
pub const TRACESTATE_BYTES_MAX: usize = 512;

/// A valid `traceparent` and, optionally, its `tracestate`.
#[derive(Debug, Clone)]
pub struct TraceContext {
    traceparent: HeaderValue,
    tracestate: Option<HeaderValue>,
}

tokio::task_local! {
    /// The trace context of the scope a request is made in.
    static CURRENT: TraceContext;
}

impl TraceContext {
    /// The context of `traceparent` (`00-<32 hex>-<16 hex>-<2 hex>`, ids not all
    /// zero) and `tracestate` (printable ASCII, at most [`TRACESTATE_BYTES_MAX`]
    /// bytes); a malformed one is refused, never sent.
    pub fn new(traceparent: &str, tracestate: Option<&str>) -> Result<Self, HttpClientError> {
        check_traceparent(traceparent)?;
        let tracestate = match tracestate {
            Some(state) if state.len() > TRACESTATE_BYTES_MAX => {
                return Err(HttpClientError(format!(
                    "tracestate is longer than {TRACESTATE_BYTES_MAX} bytes"
                )))
            }
            Some(state) => Some(
                HeaderValue::from_str(state)
                    .map_err(|_| HttpClientError("tracestate must be printable ASCII".to_owned()))?,
            ),
            None => None,
        };
        Ok(Self {
            traceparent: HeaderValue::from_str(traceparent).expect("checked: hex and dashes"),
            tracestate,
        })
    }
}

/// Runs `future` with `context` sent on each request the client makes in it.
///
/// ```no_run
/// # async fn example(client: ratelimiter::httpclient::HttpClient, request: ratelimiter::ReserveRequest)
/// # -> Result<(), Box<dyn std::error::Error>> {
/// use ratelimiter::httpclient::{with_trace_context, TraceContext};
/// use ratelimiter::Limiter;
///
/// let context = TraceContext::new("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", None)?;
/// let outcome = with_trace_context(context, client.reserve(&request)).await?;
/// # Ok(())
/// # }
/// ```
pub async fn with_trace_context<F: Future>(context: TraceContext, future: F) -> F::Output {
    CURRENT.scope(context, future).await
}

/// The headers of the current scope's trace context, if any.
pub(super) fn current() -> Option<(HeaderValue, Option<HeaderValue>)> {
    CURRENT.try_with(|c| (c.traceparent.clone(), c.tracestate.clone())).ok()
}

/// A version-00 `traceparent`: four dash-separated fields of 2, 32, 16 and 2
/// lowercase hex digits, neither id all zeros.
fn check_traceparent(value: &str) -> Result<(), HttpClientError> {
    let fields: Vec<&str> = value.split('-').collect();
    let hex =
        |s: &str, len: usize| s.len() == len && s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    let zero = |s: &str| s.bytes().all(|b| b == b'0');
    let valid = matches!(fields.as_slice(), [version, trace, parent, flags]
        if *version == "00" && hex(trace, 32) && hex(parent, 16) && hex(flags, 2) && !zero(trace) && !zero(parent));
    if valid {
        Ok(())
    } else {
        Err(HttpClientError(
            "traceparent must be 00-<32 lowercase hex>-<16 lowercase hex>-<2 hex>, ids not all zero".to_owned(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn only_a_well_formed_context_is_taken() {
        assert!(TraceContext::new(PARENT, Some("vendor=x")).is_ok());
        for bad in [
            "",
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\r\nx: y",
        ] {
            assert!(TraceContext::new(bad, None).is_err(), "{bad:?}");
        }
        assert!(TraceContext::new(PARENT, Some("a\nb")).is_err());
        let long = "a=".to_owned() + &"b".repeat(TRACESTATE_BYTES_MAX);
        assert!(TraceContext::new(PARENT, Some(&long)).is_err());
    }

    #[tokio::test]
    async fn the_context_holds_within_its_scope_only() {
        assert!(current().is_none());
        let context = TraceContext::new(PARENT, None).unwrap();
        let inside = with_trace_context(context, async { current() }).await;
        assert_eq!(inside.unwrap().0, PARENT);
        assert!(current().is_none());
    }
}
