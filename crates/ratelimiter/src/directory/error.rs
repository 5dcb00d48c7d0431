//! Why a change of the directory of tenants and keys was refused.

/// Why a directory change or read failed. Every refusal changes nothing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DirectoryError {
    /// A field is invalid; the message names it (an HTTP 400).
    #[error("{field}: {message}")]
    Invalid {
        /// The field, as the API names it (`rpm`, `models[2]`).
        field: String,
        /// What is wrong with it.
        message: String,
    },
    /// No live tenant has this name (an HTTP 404).
    #[error("unknown tenant {0}")]
    UnknownTenant(String),
    /// No key has this id (an HTTP 404).
    #[error("unknown key {0}")]
    UnknownKey(String),
    /// A tenant of this name exists (an HTTP 409).
    #[error("a tenant named {0} exists")]
    Exists(String),
    /// The change conflicts with the record's state: a tenant of the
    /// configuration changed through the API, a revoked key rotated, or
    /// another server changed the same record at the same instant (an HTTP 409).
    #[error("{0}")]
    Conflict(String),
    /// The directory holds as many records as it may (an HTTP 409).
    #[error("{0}")]
    Full(String),
    /// The store could not be written: nothing changed (an HTTP 500). The
    /// reason is short and without paths; the detail goes to the log.
    #[error("the directory could not be written ({reason}); nothing changed")]
    NotPersisted {
        /// The operating system's reason, without paths.
        reason: String,
        /// The whole error, for the log.
        detail: String,
    },
    /// The shared store did not answer, or its answer is unknown (an HTTP
    /// 503): the change may or may not have landed; reading it back says.
    #[error("the directory's store is unavailable")]
    Unavailable {
        /// When to retry.
        retry_after_ms: u64,
    },
}

impl DirectoryError {
    /// An invalid `field`.
    pub fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        DirectoryError::Invalid {
            field: field.into(),
            message: message.into(),
        }
    }
}
