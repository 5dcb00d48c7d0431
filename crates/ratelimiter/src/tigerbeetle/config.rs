//! The TigerBeetle backend's settings: the `tigerbeetle:` block of the server's
//! configuration (docs/server.md, "Configuration") plus the bounds the backend
//! needs to stay safe under load. Validated on construction, so a running backend never
//! sees a nonsensical value.

use serde::Deserialize;

/// TigerBeetle's own limit on the events of one request (8,189 transfers of 128
/// bytes in a 1 MiB message). A `--development` cluster accepts fewer; the client
/// library splits nothing, so the submitter keeps batches under what is configured.
pub const BATCH_EVENTS_LIMIT: u32 = 8_189;
/// The most replicas of a cluster TigerBeetle supports.
pub const REPLICAS_MAX: usize = 6;
/// The smallest batch: a work item (one lease's chain) is never split, and
/// Complete sends up to two transfers for each of 32 requirements.
pub const BATCH_EVENTS_MIN: u32 = 64;
/// The most client sessions of one server. A 0.16 replica answers at most 8 +
/// `--limit-pipeline-requests` sessions at once (32 with production defaults;
/// measured: the 33rd session's requests never complete), and every server of a
/// fleet shares that budget, so one server never needs more.
pub const SESSIONS_MAX: u32 = 32;
/// The longest flush interval: waiting longer than this to fill a batch would be
/// a latency bug rather than a throughput gain.
pub const FLUSH_INTERVAL_MICROS_MAX: u64 = 1_000_000;
/// The longest a caller may be asked to wait for TigerBeetle before its answer is
/// treated as unknown (503).
pub const REQUEST_TIMEOUT_MS_MAX: u64 = 60_000;
/// The most queued work items the submitter may be configured to hold.
pub const QUEUE_DEPTH_MAX: u32 = 1_000_000;
/// The most leases whose metadata may be kept for Complete.
pub const LEASE_CACHE_MAX: u32 = 10_000_000;

/// How reservations reach TigerBeetle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SubmitMode {
    /// The backend's submitter concatenates the chains of many requests into one
    /// `create_transfers` per session (docs/tigerbeetle-backend.md, "The submitter").
    Batching,
    /// Every request sends its own chain; the client library coalesces the
    /// requests queued on one session by itself.
    Direct,
}

/// The raw settings as written in YAML; [`TigerBeetleConfig::new`] validates them.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ConfigFields {
    /// The cluster id: a u128 written as a decimal string (YAML integers are too
    /// narrow for it).
    pub cluster_id: String,
    /// Replica addresses in cluster order, `host:port` or a bare port.
    pub addresses: Vec<String>,
    /// How many client sessions to open. A session has one request in flight at
    /// a time, so this bounds TigerBeetle round trips in flight. One is the
    /// default (BENCHMARKS.md, "TigerBeetle backend"): while its batch is out,
    /// the next one fills, and a replica spends far less per reservation on a
    /// few large batches than on many small ones. More sessions overlap round
    /// trips, which only pays where commit latency is I/O rather than CPU.
    pub sessions: u32,
    /// The most transfers in one batch of the submitter. The YAML key is
    /// `max_batch_events`, as in docs/server.md, "Configuration".
    #[serde(rename = "max_batch_events", alias = "batch_events_max")]
    pub batch_events_max: u32,
    /// How long the submitter waits to fill a batch once it holds one work item
    /// and a session is free. 0 (the default) is adaptive: it waits only while
    /// items arrive more often than half the cluster's round trip (at most
    /// 2 ms), so an idle or saturated server sends at once and a fleet
    /// server's share of a load still leaves in full batches.
    pub flush_interval_micros: u64,
    /// The submit mode: `batching` (the backend's submitter) or `direct`.
    pub submit_mode: SubmitMode,
    /// How long a caller waits for TigerBeetle before getting a 503 (outcome unknown).
    pub request_timeout_ms: u64,
    /// The most work items queued for the submitter (or requests outstanding in
    /// direct mode); past it, requests are answered 503 at once.
    pub queue_depth_max: u32,
    /// The most leases whose metadata is kept for Complete (docs/tigerbeetle-backend.md,
    /// "The lease cache"): completed ones are dropped first, then live ones
    /// whose holds all ended; a reserve finding only leases in force is refused.
    pub lease_cache_max: u32,
    /// The share of `lease_cache_max` one owner ([`crate::LeaseOwner`]: a
    /// client token, a gateway tenant) may hold in live leases, in percent, as
    /// the memory backend's `lease_share_percent`: past it, its reserves are
    /// refused with [`crate::LimiterError::TooManyLeases`].
    pub lease_share_percent: u8,
}

impl Default for ConfigFields {
    fn default() -> Self {
        Self {
            cluster_id: "0".to_owned(),
            addresses: vec!["127.0.0.1:3000".to_owned()],
            sessions: 1,
            batch_events_max: 8_000,
            flush_interval_micros: 0,
            submit_mode: SubmitMode::Batching,
            request_timeout_ms: 5_000,
            queue_depth_max: 65_536,
            lease_cache_max: 1_000_000,
            lease_share_percent: crate::memory::LEASE_SHARE_PERCENT_DEFAULT,
        }
    }
}

/// Why settings were rejected: the field, so a config error can name its entry.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("tigerbeetle config: {field}: {message}")]
pub struct ConfigError {
    /// The offending field of the `tigerbeetle:` block.
    pub field: &'static str,
    /// What is wrong with it.
    pub message: String,
}

/// Validated backend settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TigerBeetleConfig {
    fields: ConfigFields,
    cluster_id: u128,
}

impl TigerBeetleConfig {
    /// Validates `fields`.
    pub fn new(fields: ConfigFields) -> Result<Self, ConfigError> {
        let bad = |field: &'static str, message: String| Err(ConfigError { field, message });
        let Ok(cluster_id) = fields.cluster_id.trim().parse::<u128>() else {
            return bad("cluster_id", format!("{:?} is not a decimal u128", fields.cluster_id));
        };
        if fields.addresses.is_empty() || fields.addresses.len() > REPLICAS_MAX {
            let count = fields.addresses.len();
            return bad(
                "addresses",
                format!("must list 1..={REPLICAS_MAX} replicas, got {count}"),
            );
        }
        if let Some(a) = fields.addresses.iter().find(|a| a.is_empty() || a.contains([',', ' '])) {
            return bad(
                "addresses",
                format!("{a:?} must be host:port or a port, without commas or spaces"),
            );
        }
        let ranges: [(&'static str, u64, u64, u64); 7] = [
            ("sessions", fields.sessions.into(), 1, SESSIONS_MAX.into()),
            // A work item is one lease's chain: at most 32 requirements, and
            // Complete sends at most two transfers per requirement.
            (
                "max_batch_events",
                fields.batch_events_max.into(),
                BATCH_EVENTS_MIN.into(),
                BATCH_EVENTS_LIMIT.into(),
            ),
            (
                "flush_interval_micros",
                fields.flush_interval_micros,
                0,
                FLUSH_INTERVAL_MICROS_MAX,
            ),
            (
                "request_timeout_ms",
                fields.request_timeout_ms,
                1,
                REQUEST_TIMEOUT_MS_MAX,
            ),
            (
                "queue_depth_max",
                fields.queue_depth_max.into(),
                1,
                QUEUE_DEPTH_MAX.into(),
            ),
            (
                "lease_cache_max",
                fields.lease_cache_max.into(),
                1,
                LEASE_CACHE_MAX.into(),
            ),
            ("lease_share_percent", fields.lease_share_percent.into(), 1, 100),
        ];
        for (field, value, min, max) in ranges {
            if !(min..=max).contains(&value) {
                return bad(field, format!("must be {min}..={max}, got {value}"));
            }
        }
        Ok(Self { fields, cluster_id })
    }

    /// Settings for a cluster at `addresses` with every other value at its default.
    pub fn for_addresses(cluster_id: u128, addresses: Vec<String>) -> Result<Self, ConfigError> {
        Self::new(ConfigFields {
            cluster_id: cluster_id.to_string(),
            addresses,
            ..ConfigFields::default()
        })
    }

    /// The cluster id.
    pub fn cluster_id(&self) -> u128 {
        self.cluster_id
    }
    /// The addresses joined as the client library wants them.
    pub fn addresses_joined(&self) -> String {
        self.fields.addresses.join(",")
    }
    /// The most live leases one owner may keep in the lease cache: its share
    /// of `lease_cache_max`, at least 1.
    pub fn owner_leases_max(&self) -> usize {
        let share = (self.fields.lease_cache_max as usize) * usize::from(self.fields.lease_share_percent) / 100;
        share.max(1)
    }
    /// The validated raw settings.
    pub fn fields(&self) -> &ConfigFields {
        &self.fields
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_the_measured_best() {
        let config = TigerBeetleConfig::new(ConfigFields::default()).unwrap();
        assert_eq!(config.cluster_id(), 0);
        assert_eq!(config.addresses_joined(), "127.0.0.1:3000");
        // The first design had 8 sessions and 200 µs; the benchmark chose one session,
        // sent at once (docs/tigerbeetle-backend.md, "The submitter"; BENCHMARKS.md,
        // "TigerBeetle backend").
        assert_eq!(config.fields().sessions, 1);
        assert_eq!(config.fields().batch_events_max, 8_000);
        assert_eq!(config.fields().flush_interval_micros, 0);
    }

    #[test]
    fn bad_values_are_rejected() {
        let with = |f: fn(&mut ConfigFields)| {
            let mut fields = ConfigFields::default();
            f(&mut fields);
            TigerBeetleConfig::new(fields)
        };
        assert!(with(|f| f.cluster_id = "x".into()).is_err());
        assert!(with(|f| f.cluster_id = "-1".into()).is_err());
        assert!(with(|f| f.addresses.clear()).is_err());
        assert!(with(|f| f.addresses = vec!["a,b".into()]).is_err());
        assert!(with(|f| f.sessions = 0).is_err());
        assert!(with(|f| f.sessions = SESSIONS_MAX + 1).is_err());
        assert!(with(|f| f.batch_events_max = 8_190).is_err());
        assert!(with(|f| f.batch_events_max = 10).is_err());
        assert!(with(|f| f.flush_interval_micros = FLUSH_INTERVAL_MICROS_MAX + 1).is_err());
        assert!(with(|f| f.request_timeout_ms = 0).is_err());
        assert!(with(|f| f.queue_depth_max = 0).is_err());
        assert!(with(|f| f.lease_cache_max = 0).is_err());
        assert!(with(|f| f.lease_share_percent = 0).is_err());
        assert!(with(|f| f.lease_share_percent = 101).is_err());
        let share = with(|f| f.lease_cache_max = 8).unwrap();
        assert_eq!(share.owner_leases_max(), 2, "25% of 8 by default");
        let big = with(|f| f.cluster_id = u128::MAX.to_string()).unwrap();
        assert_eq!(big.cluster_id(), u128::MAX);
    }

    #[test]
    fn yaml_shape_of_the_spec_parses() {
        let fields: ConfigFields = serde_json::from_str(
            r#"{"cluster_id":"0","addresses":["127.0.0.1:3000"],"sessions":8,"max_batch_events":8000,"flush_interval_micros":200,"submit_mode":"direct"}"#,
        )
        .unwrap();
        assert_eq!(fields.submit_mode, SubmitMode::Direct);
        assert!(serde_json::from_str::<ConfigFields>(r#"{"sesions":8}"#).is_err());
    }
}
