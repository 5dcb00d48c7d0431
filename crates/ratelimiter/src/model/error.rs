//! Operating errors of limiters and backends. Denials are not errors: they are
//! [`crate::wire::Denial`]s inside an `Ok` outcome.

use crate::model::key::LimitKey;

/// An error from a [`crate::Limiter`] or [`crate::Backend`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LimiterError {
    /// A requirement or actual names a key that has no definition (HTTP 404).
    #[error("unknown_limit_key: {0}")]
    UnknownKey(LimitKey),
    /// The request is well-formed JSON but wrong for this lease or limit, such as
    /// an actual for a key the lease did not reserve (HTTP 400).
    #[error("invalid_request: {0}")]
    InvalidRequest(String),
    /// The request conflicts with existing state, such as a kind change or a lease
    /// id reused with other requirements (HTTP 409).
    #[error("conflict: {0}")]
    Conflict(String),
    /// The backend did not answer or its answer is unknown; retry with the same
    /// lease id after the hint (HTTP 503).
    #[error("backend_unavailable")]
    Unavailable {
        /// When to retry, in ms.
        retry_after_ms: u64,
    },
    /// The lease table has no room for this caller's lease: the caller holds
    /// its whole share of it, or the table is full of leases still in force
    /// (docs/memory-backend.md, "Shares of the lease table"). Nothing was
    /// reserved and the lease id is not burnt: retry it after the hint, once
    /// some of the caller's leases completed (HTTP 429).
    #[error("too_many_leases: {message}")]
    TooManyLeases {
        /// When to retry, in ms.
        retry_after_ms: u64,
        /// Which bound was reached, for the caller.
        message: String,
    },
    /// The backend answered with something unexpected. The detail is for logs,
    /// never for response bodies (HTTP 500).
    #[error("backend_error: {0}")]
    Backend(String),
}

impl From<crate::model::definition::DefinitionError> for LimiterError {
    /// An out-of-range field is a bad request; a kind change conflicts with
    /// the existing limit.
    fn from(error: crate::model::definition::DefinitionError) -> Self {
        match error {
            crate::model::definition::DefinitionError::Invalid(message) => LimiterError::InvalidRequest(message),
            kind_change @ crate::model::definition::DefinitionError::KindChange { .. } => {
                LimiterError::Conflict(kind_change.to_string())
            }
        }
    }
}
