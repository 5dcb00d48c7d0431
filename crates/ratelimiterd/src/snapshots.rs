//! The memory backend's live state across restarts (issue 15): restored at
//! start, saved every `memory.snapshot_interval_ms` and on a graceful stop, in
//! `memory-snapshot.bin` beside the registry. Without it a deploy handed every
//! client the whole capacity again while the provider still counted the last
//! window's calls.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use ratelimiter::memory::{MemoryBackend, MemorySnapshot, SnapshotError};

use crate::config::DamagedSnapshotPolicy;
use crate::shutdown::Shutdown;
use ratelimiter::metrics::{BackendMetrics, Histogram, Metric, MetricValue};

/// The snapshot's file name, in the registry's directory: one directory holds
/// everything a server keeps.
pub const SNAPSHOT_FILE_NAME: &str = "memory-snapshot.bin";

/// Where the snapshot of the server whose registry is `registry_path` lives.
pub fn snapshot_path(registry_path: &Path) -> PathBuf {
    match registry_path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent.join(SNAPSHOT_FILE_NAME),
        _ => PathBuf::from(SNAPSHOT_FILE_NAME),
    }
}

/// The smallest wall-clock step since a snapshot that a restore warns about:
/// smaller ones are the rounding of two readings and the drift of a long-lived
/// process's clock (anchored once, then monotonic) from the wall clock.
const CLOCK_STEP_WARN_MS: u64 = 1_000;

/// The nice value of a periodic snapshot's encoding and write (Linux: per
/// thread). They take tens of ms of CPU per second when a million settled
/// leases are remembered (BENCHMARKS.md, "Memory snapshots"); at nice 10 a
/// request thread that wants the core preempts them, so on a busy machine the
/// save takes longer instead of the requests' tail latency growing, and on an
/// idle one it runs at full speed. The stop's save keeps the caller's priority.
const WRITER_NICE: libc::c_int = 10;

/// Where a snapshot's encoding and write run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum WritePriority {
    /// On the calling thread, at its priority: the stop's save, and tests.
    Calling,
    /// On a thread of its own at [`WRITER_NICE`]: the periodic saves.
    Lowered,
}

/// Encodes and writes `snapshot` on a scoped thread whose priority is lowered
/// first; on the calling thread when no thread can be started.
fn write_at_lowered_priority(snapshot: &MemorySnapshot, path: &Path) -> Result<usize, SnapshotError> {
    std::thread::scope(|scope| {
        let writer = std::thread::Builder::new()
            .name("snapshot-writer".into())
            .spawn_scoped(scope, || {
                lower_thread_priority();
                snapshot.write_atomic(path)
            });
        match writer {
            Ok(writer) => writer.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic)),
            Err(_) => snapshot.write_atomic(path),
        }
    })
}

/// Lowers the calling thread's CPU priority to [`WRITER_NICE`]. On Linux a
/// nice value belongs to one thread, so the rest of the process keeps its own;
/// elsewhere it would be the whole process's, so nothing is changed there.
fn lower_thread_priority() {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: setpriority reads only its integer arguments; `who` 0 names
        // the calling thread on Linux.
        let result = unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, WRITER_NICE) };
        if result != 0 {
            tracing::debug!(error = %std::io::Error::last_os_error(),
                "the snapshot writer's priority could not be lowered; it runs at the server's");
        }
    }
}

/// Saves and restores one memory backend's snapshot, and counts how it goes.
pub struct MemorySnapshots {
    /// The backend saved and restored.
    backend: Arc<MemoryBackend>,
    /// `memory-snapshot.bin` beside the registry.
    path: PathBuf,
    /// One save at a time: the periodic task and the stop's save share the
    /// temporary file. It holds the last snapshot, whose memory the next copy
    /// reuses, so the copy under the backend's lock faults in no pages.
    saving: Mutex<MemorySnapshot>,
    /// The whole save: copy, encoding, write and fsyncs.
    duration: Histogram,
    /// The copy under the backend's lock: how long reserves and completes wait.
    pause: Histogram,
    /// When the last save finished, for an alert on a snapshot that lags.
    last_success_unix_ms: AtomicU64,
    /// The last file's size: it grows with live and settled leases.
    last_bytes: AtomicU64,
    /// Saves that failed (a full disk, permissions): the previous file stays.
    failures_total: AtomicU64,
    /// Damaged snapshots moved aside at start.
    damaged_total: AtomicU64,
}

impl MemorySnapshots {
    /// Snapshots of `backend` at `path`.
    pub fn new(backend: Arc<MemoryBackend>, path: PathBuf) -> Self {
        Self {
            backend,
            path,
            saving: Mutex::new(MemorySnapshot::empty()),
            duration: Histogram::default(),
            pause: Histogram::default(),
            last_success_unix_ms: AtomicU64::new(0),
            last_bytes: AtomicU64::new(0),
            failures_total: AtomicU64::new(0),
            damaged_total: AtomicU64::new(0),
        }
    }

    /// The snapshot file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Puts the saved state back; the limits are already defined from the
    /// registry. No file is a first start. A damaged file follows `policy`;
    /// a file that cannot be read at all (permissions, I/O) stops the start:
    /// it is neither damaged nor absent, and guessing would hide it.
    pub fn restore_at_start(&self, policy: DamagedSnapshotPolicy) -> Result<(), String> {
        let snapshot = match MemorySnapshot::read(&self.path) {
            Ok(Some(snapshot)) => snapshot,
            Ok(None) => {
                tracing::info!(snapshot = %self.path.display(), "no memory snapshot: nothing held");
                return Ok(());
            }
            Err(SnapshotError::Damaged { path, reason }) => return self.on_damaged(&path, &reason, policy),
            Err(e) => return Err(format!("{e}; fix it or remove the file")),
        };
        let report = self.backend.restore(&snapshot).map_err(|e| e.to_string())?;
        // By this process's wall clock, which a step since the snapshot moved.
        let age_ms = unix_ms().saturating_sub(snapshot.taken_at_unix_ms());
        tracing::info!(snapshot = %self.path.display(), age_ms, units_held = report.units_held,
            leases_live = report.leases_live, leases_settled = report.leases_settled,
            leases_dropped = report.leases_dropped, leases_evicted = report.leases_evicted, limits_dropped = report.limits_dropped,
            settled_remembered = report.settled_remembered, failed_remembered = report.failed_remembered,
            clock_step_ms = report.clock_step_ms, "memory snapshot restored");
        if report.clock_step_ms.unsigned_abs() >= CLOCK_STEP_WARN_MS {
            tracing::warn!(
                clock_step_ms = report.clock_step_ms,
                "the wall clock stepped since the snapshot was taken (same boot): its holds end after the real \
                 time they were granted for, not by the stepped clock"
            );
        }
        Ok(())
    }

    /// A damaged snapshot: refused, or moved aside and counted. Never half-loaded.
    fn on_damaged(&self, path: &Path, reason: &str, policy: DamagedSnapshotPolicy) -> Result<(), String> {
        if policy == DamagedSnapshotPolicy::Refuse {
            return Err(format!(
                "memory snapshot {} is damaged ({reason}); the reservations it held are unknown. Either \
                 repair or remove the file (the server then starts with nothing held), or set \
                 memory.damaged_snapshot: start_fresh to have it moved aside automatically",
                path.display()
            ));
        }
        let mut aside = path.as_os_str().to_owned();
        aside.push(format!(".damaged-{}", unix_ms()));
        let aside = PathBuf::from(aside);
        std::fs::rename(path, &aside).map_err(|e| {
            format!(
                "memory snapshot {} is damaged ({reason}) and cannot be moved aside to {}: {e}",
                path.display(),
                aside.display()
            )
        })?;
        self.damaged_total.fetch_add(1, Ordering::Relaxed);
        tracing::error!(snapshot = %path.display(), moved_to = %aside.display(), reason,
            "memory snapshot damaged: starting with nothing held; reservations of the last window are \
             forgotten, so keys may admit up to their capacity again");
        Ok(())
    }

    /// Saves a snapshot now, on the calling thread (it blocks on the fsyncs).
    pub fn save(&self) -> Result<(), SnapshotError> {
        self.save_at(WritePriority::Calling)
    }

    /// Saves a snapshot now: the copy under the backend's lock on the calling
    /// thread, at its priority (a copy preempted while it holds the lock would
    /// hold up every request), the encoding and the write as `priority` says.
    fn save_at(&self, priority: WritePriority) -> Result<(), SnapshotError> {
        let mut snapshot = self.saving.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let start = Instant::now();
        self.backend.snapshot_into(&mut snapshot);
        self.pause.observe(start.elapsed());
        let written = match priority {
            WritePriority::Calling => snapshot.write_atomic(&self.path),
            WritePriority::Lowered => write_at_lowered_priority(&snapshot, &self.path),
        };
        match written {
            Ok(bytes) => {
                self.duration.observe(start.elapsed());
                self.last_bytes.store(bytes as u64, Ordering::Relaxed);
                self.last_success_unix_ms.store(unix_ms(), Ordering::Relaxed);
                Ok(())
            }
            Err(e) => {
                self.failures_total.fetch_add(1, Ordering::Relaxed);
                Err(e)
            }
        }
    }

    /// Saves on a blocking thread, so the fsyncs hold up no request, with the
    /// encoding and the write at a lowered CPU priority; logs a failure.
    pub async fn save_in_background(self: &Arc<Self>) -> bool {
        let snapshots = self.clone();
        match tokio::task::spawn_blocking(move || snapshots.save_at(WritePriority::Lowered)).await {
            Ok(Ok(())) => true,
            Ok(Err(e)) => {
                tracing::error!(error = %e, "memory snapshot not saved");
                false
            }
            Err(e) => {
                tracing::error!(error = %e, "memory snapshot task failed");
                false
            }
        }
    }

    /// Saves every `interval` until `shutdown` fires. The stop's own save comes
    /// after the connections closed, from the caller.
    pub async fn run(self: Arc<Self>, interval: Duration, shutdown: Shutdown) {
        let stop = shutdown.wait();
        tokio::pin!(stop);
        let mut ticks = tokio::time::interval(interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = &mut stop => return,
                _ = ticks.tick() => {
                    self.save_in_background().await;
                }
            }
        }
    }

    /// The snapshot metrics, named `memory_snapshot_*`.
    pub fn metrics(&self) -> Vec<Metric> {
        let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        vec![
            Metric {
                name: "memory_snapshot_duration_seconds",
                help: "Time to save a memory snapshot: copy, encoding, write and fsyncs.",
                value: MetricValue::Histogram(self.duration.snapshot()),
            },
            Metric {
                name: "memory_snapshot_pause_seconds",
                help: "Time a memory snapshot held the backend's lock (reserves and completes waited).",
                value: MetricValue::Histogram(self.pause.snapshot()),
            },
            Metric {
                name: "memory_snapshot_last_success_timestamp_seconds",
                help: "When the last memory snapshot was saved (Unix seconds; 0: none yet).",
                value: MetricValue::Gauge(load(&self.last_success_unix_ms) / 1_000),
            },
            Metric {
                name: "memory_snapshot_bytes",
                help: "Size of the last memory snapshot saved.",
                value: MetricValue::Gauge(load(&self.last_bytes)),
            },
            Metric {
                name: "memory_snapshot_failures_total",
                help: "Memory snapshots that could not be saved (the previous one stays in place).",
                value: MetricValue::Counter(load(&self.failures_total)),
            },
            Metric {
                name: "memory_snapshot_damaged_total",
                help: "Damaged memory snapshots found at start and moved aside (memory.damaged_snapshot: start_fresh).",
                value: MetricValue::Counter(load(&self.damaged_total)),
            },
        ]
    }
}

/// The memory backend's counters and its snapshots' metrics, as one exporter.
pub struct MemoryMetrics {
    /// The backend, for its counters.
    pub backend: Arc<MemoryBackend>,
    /// Its snapshots, for theirs.
    pub snapshots: Arc<MemorySnapshots>,
}

impl BackendMetrics for MemoryMetrics {
    fn metrics(&self) -> Vec<Metric> {
        let mut metrics = self.backend.metrics();
        metrics.extend(self.snapshots.metrics());
        metrics
    }
}

/// Wall time now, for the metrics and the moved-aside file's name.
fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}
