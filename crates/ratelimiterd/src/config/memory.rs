//! The `memory:` section: the memory backend's bounds (its leases and the lease
//! ids it remembers) and how its live state is saved beside the registry.

use serde::Deserialize;

use super::checks::check_range;

/// The `memory:` section: the memory backend's bounds.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MemorySection {
    /// Live leases kept for reconciliation; a lease is never pushed out while
    /// a hold of it is in force (ratelimiter::MemoryConfig::leases_max).
    pub leases_max: usize,
    /// The share of `leases_max` one client token may hold, in percent
    /// (1..=100); beyond it its reserves are answered 429 `too_many_leases`.
    pub lease_share_percent: u8,
    /// Settled (completed or evicted) lease ids remembered so that a retry of
    /// their reserve is answered allowed at the original time, reserving nothing;
    /// about 53 bytes each, allocated at startup.
    pub settled_leases_max: usize,
    /// Denied lease ids remembered so that a retry with one stays denied.
    pub failed_leases_max: usize,
    /// How often the live state (units held, leases, settled and denied ids)
    /// is saved beside the registry, so a SIGKILL loses at most the grants of
    /// the last interval; 0 saves only on a graceful stop. Otherwise
    /// [`SNAPSHOT_INTERVAL_MS_MIN`]..=[`SNAPSHOT_INTERVAL_MS_LIMIT`].
    pub snapshot_interval_ms: u64,
    /// What a start does when the snapshot file is damaged.
    pub damaged_snapshot: DamagedSnapshotPolicy,
}

/// What the server does at start when its memory snapshot is damaged
/// (unreadable as a whole snapshot: torn, flipped bits, another format).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DamagedSnapshotPolicy {
    /// Move the file aside as `<file>.damaged-<unix ms>`, log an error naming
    /// both, count it in `ratelimiterd_memory_snapshot_damaged_total`, and
    /// serve with nothing held: availability first, since the provider's own
    /// limits still bound the over-admission (docs/server.md, "Restarts (memory backend)").
    #[default]
    StartFresh,
    /// Refuse to start, naming the file and the two ways on: for deployments
    /// where forgetting a window of spend (a daily budget) is worse than an outage.
    Refuse,
}

/// How often the memory backend's live state is saved by default: a SIGKILL
/// then loses at most a second of grants, and a snapshot of 100,000 live
/// leases pauses reserves for a few ms (BENCHMARKS.md, "Memory snapshots").
pub const SNAPSHOT_INTERVAL_MS_DEFAULT: u64 = 1_000;
/// The shortest snapshot interval (besides 0, off): each snapshot copies the
/// whole live state under the lock, so shorter intervals would spend a large
/// share of the lock on copies at 100,000 live leases.
pub const SNAPSHOT_INTERVAL_MS_MIN: u64 = 100;
/// The longest snapshot interval: an hour of grants is the most a SIGKILL may lose.
pub const SNAPSHOT_INTERVAL_MS_LIMIT: u64 = 3_600_000;

/// The most leases, settled or failed lease ids that may be configured: at most
/// about 200 bytes each, so at most a few GiB.
pub const MEMORY_ENTRIES_MAX_LIMIT: usize = 20_000_000;

impl Default for MemorySection {
    fn default() -> Self {
        Self {
            leases_max: ratelimiter::memory::LEASES_MAX_DEFAULT,
            lease_share_percent: ratelimiter::memory::LEASE_SHARE_PERCENT_DEFAULT,
            settled_leases_max: ratelimiter::memory::SETTLED_LEASES_MAX_DEFAULT,
            failed_leases_max: ratelimiter::memory::FAILED_LEASES_MAX_DEFAULT,
            snapshot_interval_ms: SNAPSHOT_INTERVAL_MS_DEFAULT,
            damaged_snapshot: DamagedSnapshotPolicy::StartFresh,
        }
    }
}

impl MemorySection {
    /// Checks every bound of the section: each within what the backend can
    /// allocate. The error is the entry (`memory.<field>`) and what is wrong.
    pub fn validate(&self) -> Result<(), (String, String)> {
        let invalid = |entry: &str, message: String| (entry.to_owned(), message);
        check_range(self.leases_max as u64, 1, MEMORY_ENTRIES_MAX_LIMIT as u64)
            .map_err(|m| invalid("memory.leases_max", m))?;
        check_range(self.lease_share_percent.into(), 1, 100).map_err(|m| invalid("memory.lease_share_percent", m))?;
        let settled_max = MEMORY_ENTRIES_MAX_LIMIT.min(ratelimiter::memory::SETTLED_LEASES_MAX_LIMIT);
        check_range(self.settled_leases_max as u64, 2, settled_max as u64)
            .map_err(|m| invalid("memory.settled_leases_max", m))?;
        check_range(self.failed_leases_max as u64, 1, MEMORY_ENTRIES_MAX_LIMIT as u64)
            .map_err(|m| invalid("memory.failed_leases_max", m))?;
        if self.snapshot_interval_ms != 0 {
            check_range(
                self.snapshot_interval_ms,
                SNAPSHOT_INTERVAL_MS_MIN,
                SNAPSHOT_INTERVAL_MS_LIMIT,
            )
            .map_err(|m| invalid("memory.snapshot_interval_ms", format!("0 (off) or {m}")))?;
        }
        Ok(())
    }
}
