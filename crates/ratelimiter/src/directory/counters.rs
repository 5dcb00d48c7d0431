//! The directory's counters, and the metrics `/metrics` exports of them.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::base::metrics::{Metric, MetricValue};

/// Counters of the directory, exported by the server.
#[derive(Debug, Default)]
pub(super) struct Counters {
    pub(super) tenants_created: AtomicU64,
    pub(super) tenants_updated: AtomicU64,
    pub(super) tenants_deleted: AtomicU64,
    pub(super) keys_created: AtomicU64,
    pub(super) keys_revoked: AtomicU64,
    pub(super) keys_rotated: AtomicU64,
    pub(super) keys_updated: AtomicU64,
    pub(super) keys_forgotten: AtomicU64,
    pub(super) reads_started: AtomicU64,
    pub(super) reads_done: AtomicU64,
    pub(super) read_failures: AtomicU64,
    pub(super) unknown_key_reads: AtomicU64,
}

impl Counters {
    /// The metrics of these counters and of the directory's sizes.
    pub(super) fn metrics(&self, tenants: u64, keys: u64) -> Vec<Metric> {
        let load = |c: &AtomicU64| MetricValue::Counter(c.load(Ordering::Relaxed));
        let c = self;
        vec![
            Metric { name: "gateway_tenants_created_total", help: "Gateway tenants created through the admin API on this server.", value: load(&c.tenants_created) },
            Metric { name: "gateway_tenants_updated_total", help: "Gateway tenants changed through the admin API on this server.", value: load(&c.tenants_updated) },
            Metric { name: "gateway_tenants_deleted_total", help: "Gateway tenants deleted (their keys revoked) through the admin API on this server.", value: load(&c.tenants_deleted) },
            Metric { name: "gateway_keys_created_total", help: "Gateway keys created through the admin API on this server.", value: load(&c.keys_created) },
            Metric { name: "gateway_keys_revoked_total", help: "Gateway keys revoked through the admin API on this server.", value: load(&c.keys_revoked) },
            Metric { name: "gateway_keys_rotated_total", help: "Gateway keys rotated through the admin API on this server.", value: load(&c.keys_rotated) },
            Metric { name: "gateway_keys_updated_total", help: "Gateway keys whose budgets were changed through the admin API on this server.", value: load(&c.keys_updated) },
            Metric { name: "gateway_keys_forgotten_total", help: "Revoked or expired gateway keys forgotten by this server after their retention.", value: load(&c.keys_forgotten) },
            Metric { name: "gateway_directory_reads_total", help: "Reads of the store of tenants and keys (periodic on a shared store, around changes, for unknown keys).", value: load(&c.reads_started) },
            Metric { name: "gateway_directory_unknown_key_reads_total", help: "Reads of the store made because a presented key was unknown: at most ten a second however many wrong keys arrive.", value: load(&c.unknown_key_reads) },
            Metric { name: "gateway_directory_read_failures_total", help: "Reads of the store of tenants and keys that failed: the server serves what it read last.", value: load(&c.read_failures) },
            Metric { name: "gateway_tenants", help: "Live gateway tenants known to this server, the configuration's included.", value: MetricValue::Gauge(tenants) },
            Metric { name: "gateway_keys", help: "Gateway keys known to this server, revoked and expired ones included until they are forgotten.", value: MetricValue::Gauge(keys) },
        ]
    }
}
