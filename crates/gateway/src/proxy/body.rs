//! The bodies the gateway reads whole: a client's request, within its size
//! limit and the client body timeout, and an upstream's small answer.

use std::time::Duration;

use axum::body::Body;
use axum::http::HeaderMap;
use bytes::Bytes;
use http_body_util::BodyExt;

use super::forward::upstream_error;
use super::upstream::UpstreamError;
use crate::wire::error::{ErrorKind, GatewayError};

/// The largest answer read whole from an upstream (`count_tokens`' small answers;
/// every other answer is passed on as it arrives).
pub const RESPONSE_BYTES_MAX: usize = 64 * 1024 * 1024;

/// Why a body could not be read whole.
#[derive(Debug)]
pub enum BodyError {
    /// It is longer than the limit.
    TooLarge,
    /// It did not end within the timeout.
    TimedOut,
    /// Its connection failed.
    Failed(String),
}

/// `body` whole, within `limit` bytes and `timeout` from the first poll to its
/// last byte: the one reader of a whole body, for a client's request and an
/// upstream's small answer alike.
pub async fn read_whole<B>(body: B, limit: usize, timeout: Duration) -> Result<Bytes, BodyError>
where
    B: hyper::body::Body<Data = Bytes>,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let collect = http_body_util::Limited::new(body, limit).collect();
    match ready_or_timeout(collect, timeout).await {
        Ok(Ok(collected)) => Ok(collected.to_bytes()),
        Ok(Err(e)) if e.downcast_ref::<http_body_util::LengthLimitError>().is_some() => Err(BodyError::TooLarge),
        Ok(Err(e)) => Err(BodyError::Failed(e.to_string())),
        Err(_) => Err(BodyError::TimedOut),
    }
}

/// The request's whole body, within `limit` bytes and `timeout` from its first
/// byte to its last (a client trickling its body holds a connection and a tenant
/// slot no longer than that).
pub async fn read_body(
    headers: &HeaderMap,
    body: Body,
    limit: usize,
    timeout: Duration,
) -> Result<Bytes, GatewayError> {
    let too_large = || {
        GatewayError::new(
            ErrorKind::TooLarge,
            format!("The request body is larger than {limit} bytes."),
        )
    };
    let declared = headers
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(too_large());
    }
    read_whole(body, limit, timeout).await.map_err(|e| match e {
        BodyError::TooLarge => too_large(),
        BodyError::TimedOut => GatewayError::new(
            ErrorKind::ClientTimeout,
            format!("The request body did not arrive within {} ms.", timeout.as_millis()),
        ),
        BodyError::Failed(e) => GatewayError::invalid(format!("The request body could not be read: {e}")),
    })
}

/// An upstream's whole answer, within [`RESPONSE_BYTES_MAX`] and `timeout`.
pub async fn read_upstream_body(body: hyper::body::Incoming, timeout: Duration) -> Result<Bytes, GatewayError> {
    read_whole(body, RESPONSE_BYTES_MAX, timeout).await.map_err(|e| {
        upstream_error(match e {
            BodyError::TooLarge => UpstreamError::Failed("length limit exceeded".to_owned()),
            BodyError::TimedOut => UpstreamError::Timeout,
            BodyError::Failed(e) => UpstreamError::Failed(e),
        })
    })
}

/// `future` bounded by `timeout`, with no timer for a future that is ready when
/// first polled (a small answer's body arrives with its headers, in the same
/// read): a timer is armed only for one that has to wait.
async fn ready_or_timeout<F: std::future::Future>(
    future: F,
    timeout: Duration,
) -> Result<F::Output, tokio::time::error::Elapsed> {
    let mut future = std::pin::pin!(future);
    if let Some(output) = futures_util::FutureExt::now_or_never(future.as_mut()) {
        return Ok(output);
    }
    tokio::time::timeout(timeout, future).await
}
