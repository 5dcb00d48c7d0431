//! The error of a scheduler's configuration, below both the configuration and
//! the work classes it checks, so that neither imports the other for it.

/// Why a [`SchedulerConfig`](super::SchedulerConfig) could not be built. The
/// message names the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid scheduler config: {0}")]
pub struct ConfigError(pub String);
