//! What a shutdown left undone.

/// The jobs a shutdown did not let finish, by job id, so the caller can run them
/// elsewhere. Every one of their handles resolved with the matching error.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ShutdownReport {
    /// Jobs whose call never started ([`super::JobError::NotRun`]), in submit order
    /// for those still queued, then in the order running attempts ended.
    pub not_run: Vec<String>,
    /// Jobs whose call was running at the deadline and was stopped
    /// ([`super::JobError::Aborted`]).
    pub aborted: Vec<String>,
}
