//! What a phase of `loadgen reservations` spends besides time (loadgen/reservations.rs):
//! the CPU ticks of the processes that share the machine and of the machine, from
//! `/proc`, and the submitter's figures of a server from its `/metrics`.

use super::{histogram, histogram_percentile};

/// CPU time of the processes that share the machine, and of the machine.
#[derive(Debug, Clone)]
pub struct CpuSnapshot {
    /// Ticks of user and system time of each watched process.
    pub processes: Vec<u64>,
    /// Busy and total ticks of all cores (every process, neighbours' too).
    pub machine_busy: u64,
    pub machine_total: u64,
    /// Ticks waiting for I/O (the replica's fsyncs, among others).
    pub machine_iowait: u64,
}

impl CpuSnapshot {
    /// The CPU ticks of `pids` and of the machine, now.
    pub fn take(pids: &[u32]) -> CpuSnapshot {
        let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
        let cpu: Vec<u64> = stat
            .lines()
            .next()
            .unwrap_or_default()
            .split_whitespace()
            .skip(1)
            .filter_map(|v| v.parse().ok())
            .collect();
        let field = |i: usize| cpu.get(i).copied().unwrap_or(0);
        // user nice system idle iowait irq softirq steal
        let busy = field(0) + field(1) + field(2) + field(5) + field(6) + field(7);
        CpuSnapshot {
            processes: pids.iter().map(|pid| process_ticks(*pid)).collect(),
            machine_busy: busy,
            machine_total: busy + field(3) + field(4),
            machine_iowait: field(4),
        }
    }
}

/// User plus system ticks of `pid` and all its threads (0 if it is gone).
pub fn process_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The command name may hold spaces; the fields after it do not.
    let Some((_, rest)) = stat.rsplit_once(')') else {
        return 0;
    };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    ticks(11) + ticks(12)
}

/// What the server of a variant reported over one phase, from `/metrics`.
#[derive(Debug, Clone, Copy, Default)]
pub struct ServerDelta {
    pub batches: u64,
    pub items: u64,
    pub transfers: u64,
    pub largest_batch: u64,
    pub queue_full: u64,
    pub timeouts: u64,
    /// Queue wait p50 and p99, in ms (histogram bucket bounds).
    pub queue_wait_ms: (f64, f64),
    /// TigerBeetle round trip p50 and p99, in ms (histogram bucket bounds).
    pub round_trip_ms: (f64, f64),
}

/// The value of a single-valued metric in a `/metrics` text (0 when absent).
pub fn metric_value(text: &str, name: &str) -> u64 {
    text.lines()
        .filter_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
        .find_map(|value| value.trim().parse().ok())
        .unwrap_or(0)
}

/// The queue wait histogram's buckets.
const QUEUE_WAIT: &str = "ratelimiterd_tigerbeetle_queue_wait_seconds_bucket{";
/// The TigerBeetle round trip histogram's buckets.
const ROUND_TRIP: &str = "ratelimiterd_tigerbeetle_request_duration_seconds_bucket{";

impl ServerDelta {
    /// The server's figures between two `/metrics` texts.
    pub fn between(before: &str, after: &str) -> ServerDelta {
        let delta = |name: &str| metric_value(after, name) - metric_value(before, name);
        let percentiles = |prefix: &str| {
            let (b, a) = (histogram(before, prefix), histogram(after, prefix));
            (
                histogram_percentile(&b, &a, 0.5) * 1e3,
                histogram_percentile(&b, &a, 0.99) * 1e3,
            )
        };
        ServerDelta {
            batches: delta("ratelimiterd_tigerbeetle_batches_total"),
            items: delta("ratelimiterd_tigerbeetle_batch_items_total"),
            transfers: delta("ratelimiterd_tigerbeetle_batch_transfers_total"),
            largest_batch: metric_value(after, "ratelimiterd_tigerbeetle_batch_transfers_max"),
            queue_full: delta("ratelimiterd_tigerbeetle_queue_full_total"),
            timeouts: delta("ratelimiterd_tigerbeetle_timeouts_total"),
            queue_wait_ms: percentiles(QUEUE_WAIT),
            round_trip_ms: percentiles(ROUND_TRIP),
        }
    }

    /// Adds `other`'s counts (a fleet's servers): the largest batch is the largest of all.
    pub fn add(&mut self, other: &ServerDelta) {
        self.batches += other.batches;
        self.items += other.items;
        self.transfers += other.transfers;
        self.largest_batch = self.largest_batch.max(other.largest_batch);
        self.queue_full += other.queue_full;
        self.timeouts += other.timeouts;
    }
}
