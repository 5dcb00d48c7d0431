//! The `directory:` section: how the gateway's tenants and keys made through
//! the admin API are kept (docs/gateway.md, "Tenants and keys").

use serde::Deserialize;

use super::checks::check_range;

/// The default days a revoked or expired key stays listed: thirty, time
/// enough to see why an application's key stopped working.
pub const KEY_RETENTION_DAYS_DEFAULT: u64 = 30;
/// The longest retention that may be configured: ten years, the longest
/// life a key may be given.
pub const KEY_RETENTION_DAYS_LIMIT: u64 = 3_650;
/// Milliseconds in a day.
const DAY_MS: u64 = 86_400_000;

/// The `directory:` section.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DirectorySection {
    /// Days a key stays listed (and counted toward the bound on keys) after
    /// it was revoked, expired or its tenant deleted; then it is forgotten,
    /// for good. 0: forgotten at the next sweep.
    pub key_retention_days: u64,
}

impl Default for DirectorySection {
    fn default() -> Self {
        Self {
            key_retention_days: KEY_RETENTION_DAYS_DEFAULT,
        }
    }
}

impl DirectorySection {
    /// Checks the section; the error is the entry and what is wrong.
    pub fn validate(&self) -> Result<(), (String, String)> {
        check_range(self.key_retention_days, 0, KEY_RETENTION_DAYS_LIMIT)
            .map_err(|m| ("directory.key_retention_days".to_owned(), m))
    }

    /// The directory's options of this section.
    pub fn options(&self) -> ratelimiter::directory::DirectoryOptions {
        ratelimiter::directory::DirectoryOptions {
            key_retention_ms: self.key_retention_days * DAY_MS,
            ..Default::default()
        }
    }
}
