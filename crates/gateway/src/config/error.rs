//! Why the `gateway:` section cannot be used: the one error of every check of
//! the section, naming the entry. Below every entry's module, which all report it.

/// Why the `gateway:` section cannot be used; the message names the entry.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("gateway.{entry}: {message}")]
pub struct GatewayConfigError {
    /// The entry, such as `models[2].upstream`.
    pub entry: String,
    /// What is wrong.
    pub message: String,
}

/// The error of `entry` (its path in the section, such as `models[0].rpm`),
/// saying what is wrong with it.
pub(super) fn invalid(entry: impl Into<String>, message: impl Into<String>) -> GatewayConfigError {
    GatewayConfigError {
        entry: entry.into(),
        message: message.into(),
    }
}
