//! The TigerBeetle backend's counters and their backend-neutral metrics.

use crate::base::metrics::{LabeledMetric, Metric, MetricValue};

use super::connections::ReplicaConnectionCounts;

use super::submitter::{SubmitterSnapshot, SubmitterStats};

/// The backend's own counters at one moment, exported in `/metrics` (the
/// submitter's histograms are read from [`TigerBeetleBackend::submitter_stats`](crate::tigerbeetle::TigerBeetleBackend::submitter_stats)).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TigerBeetleCounters {
    /// Units used beyond reservations and dropped (`overage: none`).
    pub overage_dropped_units: u64,
    /// Units used beyond reservations and recorded as debt (`overage: debt`).
    pub overage_debt_units: u64,
    /// What the submitter sent.
    pub batches: SubmitterSnapshot,
    /// Work items refused at once because the queue was full (answered 503).
    pub queue_full: u64,
    /// Requests whose answer did not come in time (outcome unknown, 503).
    pub timeouts: u64,
    /// Queued work items dropped because their caller had given up.
    pub abandoned: u64,
    /// Work items waiting for the submitter now.
    pub queue_depth: u64,
    /// Requests outstanding on the client sessions now.
    pub slots_busy: u64,
    /// Sessions reopened after the cluster evicted them.
    pub sessions_renewed: u64,
    /// Sessions replaced after a stall, once a fresh session was answered.
    pub sessions_replaced: u64,
    /// Probe sessions opened while a session was stalled.
    pub session_probes: u64,
    /// Client sessions open now: the configured ones, a probe while a session
    /// is stalled, and replaced ones still closing.
    pub clients_open: u64,
    /// Probe sessions open now (0 or 1).
    pub probes_open: u64,
    /// Requests sent to the cluster on the sessions, of every kind.
    pub requests: u64,
    /// Reads of the definition log (each one request, or more for a long log).
    pub definitions_reads: u64,
    /// Leases whose metadata is kept now.
    pub leases_cached: u64,
    /// Live leases forgotten to respect `lease_cache_max`: not reconciled at Complete.
    pub lease_cache_evictions: u64,
    /// Reserves refused because their owner held its share of the lease cache,
    /// or the cache held only leases in force.
    pub lease_cache_refused: u64,
    /// Denied lease ids remembered now.
    pub denied_leases: u64,
    /// Denied lease ids forgotten to respect [`super::backend::DENIED_LEASES_MAX`].
    pub denied_lease_evictions: u64,
    /// Completes whose lease this server remembered.
    pub completes_from_cache: u64,
    /// Completes whose lease was read back from the cluster (reserved on
    /// another server, or forgotten here).
    pub completes_from_cluster: u64,
    /// Probes of the cluster's clock written (one a minute at most while
    /// Completes of leases reserved elsewhere come).
    pub cluster_clock_probes: u64,
    /// Leases looked up by id in the cluster (Completes of leases this server
    /// does not hold, reserves that met an existing chain).
    pub lease_lookups: u64,
    /// `lookup_transfers` requests those lookups took: lookups of one moment
    /// share one request.
    pub lease_lookup_requests: u64,
    /// Keys defined in the fleet, as this server knows them.
    pub definitions: u64,
    /// How old the newest definition record this server has applied is, in
    /// ms; every server of a fleet should show about the same.
    pub definitions_newest_age_ms: u64,
    /// How long ago this server last read the log up to date, in ms: above a
    /// few refresh intervals it is not seeing the fleet's changes.
    pub definitions_refresh_age_ms: u64,
    /// Reads of the log that failed.
    pub definitions_refresh_failures: u64,
    /// Definition records skipped because they did not decode.
    pub definitions_malformed: u64,
}

/// The single-valued metrics: name, help, and how to read the value from the
/// counters; `_total` names are counters, the rest gauges.
type MetricLine = (&'static str, &'static str, fn(&TigerBeetleCounters) -> u64);

const METRIC_LINES: [MetricLine; 33] = [
    (
        "tigerbeetle_overage_dropped_units_total",
        "Units used above reservations and dropped (overage: none).",
        |c| c.overage_dropped_units,
    ),
    (
        "tigerbeetle_overage_debt_units_total",
        "Units used above reservations and recorded as debt (overage: debt).",
        |c| c.overage_debt_units,
    ),
    (
        "tigerbeetle_batches_total",
        "create_transfers requests sent; transfers per batch is batch_transfers_total over this.",
        |c| c.batches.batches,
    ),
    (
        "tigerbeetle_batch_items_total",
        "Work items (a lease's chain, a Complete's transfers) sent in those requests.",
        |c| c.batches.items,
    ),
    (
        "tigerbeetle_batch_transfers_total",
        "Transfers sent in those requests.",
        |c| c.batches.transfers,
    ),
    (
        "tigerbeetle_batch_transfers_max",
        "The most transfers sent in one request since the start.",
        |c| c.batches.largest_batch,
    ),
    (
        "tigerbeetle_lease_lookups_total",
        "Leases looked up by id in the cluster (a Complete of a lease this server does not hold).",
        |c| c.lease_lookups,
    ),
    (
        "tigerbeetle_lease_lookup_requests_total",
        "lookup_transfers requests those lookups took (lookups of one moment share one).",
        |c| c.lease_lookup_requests,
    ),
    (
        "tigerbeetle_queue_full_total",
        "Work items refused at once (503) because the submitter's queue was full.",
        |c| c.queue_full,
    ),
    (
        "tigerbeetle_timeouts_total",
        "Requests TigerBeetle did not answer within request_timeout_ms (503, outcome unknown).",
        |c| c.timeouts,
    ),
    (
        "tigerbeetle_abandoned_items_total",
        "Queued work items not sent because their caller had given up.",
        |c| c.abandoned,
    ),
    (
        "tigerbeetle_queue_depth",
        "Work items waiting for the submitter.",
        |c| c.queue_depth,
    ),
    (
        "tigerbeetle_requests_outstanding",
        "Requests sent on the client sessions and not answered yet.",
        |c| c.slots_busy,
    ),
    (
        "tigerbeetle_sessions_renewed_total",
        "Client sessions reopened after the cluster evicted them.",
        |c| c.sessions_renewed,
    ),
    (
        "tigerbeetle_sessions_replaced_total",
        "Client sessions replaced after a request stayed unanswered while a fresh session was answered.",
        |c| c.sessions_replaced,
    ),
    (
        "tigerbeetle_session_probes_total",
        "Fresh sessions opened to learn whether the cluster answers while a session was stalled.",
        |c| c.session_probes,
    ),
    (
        "tigerbeetle_clients_open",
        "Client sessions open now: the configured ones, a probe while a session is stalled, replaced ones closing.",
        |c| c.clients_open,
    ),
    (
        "tigerbeetle_probes_open",
        "Probe sessions open now (at most one, while a session is stalled).",
        |c| c.probes_open,
    ),
    (
        "tigerbeetle_requests_total",
        "Requests sent to the cluster on the client sessions: batches, reads, health checks (probes not included).",
        |c| c.requests,
    ),
    (
        "tigerbeetle_definitions_reads_total",
        "Reads of the definition log up to date (periodic, on an unknown key, after a write).",
        |c| c.definitions_reads,
    ),
    (
        "tigerbeetle_leases_cached",
        "Leases whose metadata is kept for Complete.",
        |c| c.leases_cached,
    ),
    (
        "tigerbeetle_lease_cache_evictions_total",
        "Leases forgotten to respect lease_cache_max; their Completes were not reconciled.",
        |c| c.lease_cache_evictions,
    ),
    (
        "tigerbeetle_lease_cache_refused_total",
        "Reserves refused with too_many_leases: the owner held its share of lease_cache_max, or every cached lease was in force.",
        |c| c.lease_cache_refused,
    ),
    (
        "tigerbeetle_denied_leases_remembered",
        "Lease ids TigerBeetle denied, remembered so that they stay denied.",
        |c| c.denied_leases,
    ),
    (
        "tigerbeetle_denied_leases_evictions_total",
        "Denied lease ids forgotten to respect the bound; TigerBeetle still remembers them.",
        |c| c.denied_lease_evictions,
    ),
    (
        "tigerbeetle_completes_from_cache_total",
        "Completes whose lease this server remembered.",
        |c| c.completes_from_cache,
    ),
    (
        "tigerbeetle_completes_from_cluster_total",
        "Completes whose lease was read back from the cluster (reserved on another server, or forgotten here).",
        |c| c.completes_from_cluster,
    ),
    (
        "tigerbeetle_cluster_clock_probes_total",
        "Probes of the cluster's clock written to time Completes of leases reserved elsewhere (one a minute at most).",
        |c| c.cluster_clock_probes,
    ),
    (
        "tigerbeetle_definitions",
        "Keys defined in the fleet, as this server knows them.",
        |c| c.definitions,
    ),
    (
        "tigerbeetle_definitions_newest_age_ms",
        "Age of the newest definition record this server has applied; the same on every server of a healthy fleet.",
        |c| c.definitions_newest_age_ms,
    ),
    (
        "tigerbeetle_definitions_refresh_age_ms",
        "Time since this server last read the definition log up to date.",
        |c| c.definitions_refresh_age_ms,
    ),
    (
        "tigerbeetle_definitions_refresh_failures_total",
        "Reads of the definition log that failed.",
        |c| c.definitions_refresh_failures,
    ),
    (
        "tigerbeetle_definitions_malformed_total",
        "Definition records skipped because they did not decode.",
        |c| c.definitions_malformed,
    ),
];

impl TigerBeetleCounters {
    /// The counters as backend-neutral metrics, named `tigerbeetle_*`.
    pub fn metrics(&self) -> Vec<Metric> {
        METRIC_LINES
            .iter()
            .map(|&(name, help, read)| Metric {
                name,
                help,
                value: if name.ends_with("_total") {
                    MetricValue::Counter(read(self))
                } else {
                    MetricValue::Gauge(read(self))
                },
            })
            .collect()
    }
}

/// Every metric of the backend: its counters, then the submitter's histograms.
pub(super) fn backend_metrics(counters: TigerBeetleCounters, stats: &SubmitterStats) -> Vec<Metric> {
    let mut metrics = counters.metrics();
    metrics.push(Metric {
        name: "tigerbeetle_queue_wait_seconds",
        help: "Time work items waited for the submitter before their batch was sent.",
        value: MetricValue::Histogram(stats.queue_wait.snapshot()),
    });
    metrics.push(Metric {
        name: "tigerbeetle_request_duration_seconds",
        help: "Time TigerBeetle took to answer each create_transfers request.",
        value: MetricValue::Histogram(stats.round_trip.snapshot()),
    });
    metrics
}

/// The connections this server holds to each replica (read from the kernel by
/// the pool's watchdog), one series per replica address.
pub(super) fn replica_connection_metrics(counts: &[ReplicaConnectionCounts]) -> Vec<LabeledMetric> {
    type Line = (&'static str, &'static str, fn(&ReplicaConnectionCounts) -> u64);
    const LINES: [Line; 4] = [
        (
            "tigerbeetle_replica_connections_open",
            "TCP connections this server holds to the replica now (each one of the replica's bounded connection slots).",
            |c| c.open,
        ),
        (
            "tigerbeetle_replica_connections_opened_total",
            "TCP connections to the replica seen opened (by the client sessions and probes).",
            |c| c.opened,
        ),
        (
            "tigerbeetle_replica_connections_opened_cut_off_total",
            "TCP connections to the replica seen opened while a session was stalled (cut off).",
            |c| c.opened_cut_off,
        ),
        (
            "tigerbeetle_replica_connections_closed_total",
            "TCP connections to the replica seen closed.",
            |c| c.closed,
        ),
    ];
    (LINES.iter())
        .map(|&(name, help, read)| LabeledMetric {
            name,
            help,
            label: "replica",
            series: counts.iter().map(|c| (c.replica.to_string(), read(c))).collect(),
        })
        .collect()
}
