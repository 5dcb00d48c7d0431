//! The names a replay's calls carry: the simulated provider and its model, as
//! they appear in limit keys and in requests. A leaf, so that the run, the
//! limit definitions and the strategies all read them from below.

/// The provider name in limit keys and requests.
pub const PROVIDER: &str = "sim";
/// The model name in limit keys and requests.
pub const MODEL: &str = "sim-model";
