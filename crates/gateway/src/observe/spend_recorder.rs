//! Records every completed call's spend in the ledger (docs/gateway.md, "The
//! spend ledger") without delaying any answer: a call hands its entry to a
//! bounded queue and goes on; one task writes what the queue holds in batches
//! (one sync of the file, or one request to the cluster, for many calls) and
//! retries a failed batch with backoff, with the same ids, so an entry whose
//! write was acknowledged but whose answer was lost is not counted twice.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use ratelimiter::spend::{SpendBook, SpendEntry, SpendError, SpendRecord};
use tokio::sync::mpsc;

use super::spend_metrics::SpendMetrics;

/// Entries waiting to be written at most: some seconds of a busy gateway's
/// calls while the ledger is slow or away (about 300 bytes each); past it an
/// entry is dropped and counted, never waited for by a call.
pub const SPEND_QUEUE_MAX: usize = 65_536;
/// Entries written in one batch at most: one sync or one request for them all.
pub const SPEND_BATCH_MAX: usize = 512;
/// The shortest time between the starts of two writes of less than a whole
/// batch: a write and its sync cost the server about half a millisecond of CPU
/// (more than the call it records), so at 1,000 calls a second one write a
/// second instead of one per call. An entry waits at most this long for its
/// write, the same window as the memory backend's snapshots (1 s by default).
pub const SPEND_WRITE_INTERVAL: Duration = Duration::from_millis(1_000);
/// The first wait after a failed write.
const RETRY_FIRST: Duration = Duration::from_millis(100);
/// The longest wait between two tries: the ledger back within seconds of its
/// return, and a log line every few seconds while it is away.
const RETRY_MAX: Duration = Duration::from_secs(5);

/// The queue of entries to record and the task that writes them.
#[derive(Debug, Clone)]
pub struct SpendRecorder {
    queue: mpsc::Sender<SpendRecord>,
    metrics: Arc<SpendMetrics>,
}

impl SpendRecorder {
    /// Starts the task writing to `book` (on the current tokio runtime); it ends
    /// once every recorder is dropped and the queue is written.
    pub fn start(book: Arc<dyn SpendBook>, metrics: Arc<SpendMetrics>) -> Self {
        let (queue, receiver) = mpsc::channel(SPEND_QUEUE_MAX);
        tokio::spawn(write_all(book, receiver, metrics.clone()));
        Self { queue, metrics }
    }

    /// Queues `entry` with a fresh id; never waits. A full queue drops it,
    /// counted and logged.
    pub fn record(&self, entry: SpendEntry) {
        if let Err(e) = self.queue.try_send(SpendRecord::new(entry)) {
            self.metrics.dropped.fetch_add(1, Ordering::Relaxed);
            let entry = match e {
                mpsc::error::TrySendError::Full(r) | mpsc::error::TrySendError::Closed(r) => r.entry,
            };
            tracing::error!(tenant = %entry.tenant, model = %entry.model, micro_usd = entry.micro_usd,
                "gateway: the spend queue is full; a call's spend is not recorded");
        }
    }

    /// The metrics of what was recorded.
    pub fn metrics(&self) -> &Arc<SpendMetrics> {
        &self.metrics
    }
}

/// Writes batches until the queue closes. A write starts at most every
/// [`SPEND_WRITE_INTERVAL`] unless a whole batch waits: an entry after a quiet
/// spell is written at once, and the entries of a steady stream share one
/// write (and one sync) per interval instead of one each.
async fn write_all(book: Arc<dyn SpendBook>, mut receiver: mpsc::Receiver<SpendRecord>, metrics: Arc<SpendMetrics>) {
    let mut batch = Vec::with_capacity(SPEND_BATCH_MAX);
    let mut last_write: Option<tokio::time::Instant> = None;
    while receiver.recv_many(&mut batch, SPEND_BATCH_MAX).await > 0 {
        let due = last_write.map(|last| last + SPEND_WRITE_INTERVAL);
        if let Some(due) = due.filter(|due| batch.len() < SPEND_BATCH_MAX && *due > tokio::time::Instant::now()) {
            tokio::time::sleep_until(due).await;
            while batch.len() < SPEND_BATCH_MAX {
                match receiver.try_recv() {
                    Ok(record) => batch.push(record),
                    Err(_) => break,
                }
            }
        }
        last_write = Some(tokio::time::Instant::now());
        write_batch(book.as_ref(), &batch, &metrics).await;
        batch.clear();
    }
}

/// Writes `batch` until the book takes it: a failure waits and retries the
/// same records; a batch the book refuses as invalid is written entry by entry,
/// so one bad entry (none is expected) costs only itself.
async fn write_batch(book: &dyn SpendBook, batch: &[SpendRecord], metrics: &SpendMetrics) {
    let mut wait = RETRY_FIRST;
    loop {
        match book.record(batch).await {
            Ok(()) => {
                batch.iter().for_each(|r| metrics.add(&r.entry));
                return;
            }
            Err(SpendError::Invalid(reason)) if batch.len() == 1 => {
                metrics.dropped.fetch_add(1, Ordering::Relaxed);
                tracing::error!(%reason, "gateway: the spend ledger refused an entry; not recorded");
                return;
            }
            Err(SpendError::Invalid(_)) => {
                for record in batch {
                    Box::pin(write_batch(book, std::slice::from_ref(record), metrics)).await;
                }
                return;
            }
            Err(e) => {
                metrics.record_failures.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(error = %e, entries = batch.len(), retry_in_ms = wait.as_millis() as u64,
                    "gateway: writing spend failed; retrying the same entries");
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(RETRY_MAX);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ratelimiter::spend::{SpendQuery, SpendRow};
    use std::sync::Mutex;

    /// A book that fails its first `failures` writes and remembers the ids it took.
    #[derive(Debug, Default)]
    struct Flaky {
        failures: Mutex<usize>,
        tries: Mutex<Vec<Vec<u128>>>,
    }

    #[async_trait::async_trait]
    impl SpendBook for Flaky {
        async fn record(&self, records: &[SpendRecord]) -> Result<(), SpendError> {
            self.tries.lock().unwrap().push(records.iter().map(|r| r.id).collect());
            if records.iter().any(|r| r.entry.model.is_empty()) {
                return Err(SpendError::Invalid("model: must not be empty".into()));
            }
            let mut failures = self.failures.lock().unwrap();
            if *failures > 0 {
                *failures -= 1;
                return Err(SpendError::Unavailable("away".into()));
            }
            Ok(())
        }
        async fn report(&self, _: &SpendQuery) -> Result<Vec<SpendRow>, SpendError> {
            Ok(Vec::new())
        }
        fn shared(&self) -> bool {
            false
        }
    }

    fn entry(model: &str) -> SpendEntry {
        SpendEntry {
            at_unix_ms: 0,
            tenant: "acme".into(),
            key: "".into(),
            model: model.into(),
            deployment: "east".into(),
            input_tokens: 1,
            cached_tokens: 0,
            output_tokens: 1,
            micro_usd: 3,
            unpriced: false,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_write_is_retried_with_the_same_ids_and_a_bad_entry_costs_only_itself() {
        let book = Arc::new(Flaky {
            failures: Mutex::new(2),
            ..Flaky::default()
        });
        let metrics = Arc::new(SpendMetrics::default());
        let batch = vec![SpendRecord::new(entry("gpt")), SpendRecord::new(entry("gpt"))];
        write_batch(book.as_ref(), &batch, &metrics).await;
        let tries = book.tries.lock().unwrap().clone();
        assert_eq!(tries.len(), 3);
        assert!(tries.iter().all(|ids| *ids == tries[0]), "retries send the same ids");
        assert_eq!(metrics.record_failures.load(Ordering::Relaxed), 2);
        assert_eq!(metrics.recorded.load(Ordering::Relaxed), 2);
        let mixed = vec![SpendRecord::new(entry("")), SpendRecord::new(entry("gpt"))];
        write_batch(book.as_ref(), &mixed, &metrics).await;
        assert_eq!(
            (
                metrics.recorded.load(Ordering::Relaxed),
                metrics.dropped.load(Ordering::Relaxed)
            ),
            (3, 1)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_steady_stream_shares_one_write_per_interval_and_a_lone_entry_is_written_at_once() {
        let book = Arc::new(Flaky::default());
        let recorder = SpendRecorder::start(book.clone(), Arc::new(SpendMetrics::default()));
        recorder.record(entry("gpt"));
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert_eq!(
            book.tries.lock().unwrap().len(),
            1,
            "the first entry is written at once"
        );
        // 50 entries over 50 ms, then time for every write.
        for _ in 0..50 {
            recorder.record(entry("gpt"));
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        tokio::time::sleep(SPEND_WRITE_INTERVAL * 3).await;
        let tries = book.tries.lock().unwrap().clone();
        assert_eq!(
            tries.iter().map(Vec::len).sum::<usize>(),
            51,
            "every entry is written once"
        );
        assert!(
            tries.len() <= 3,
            "one write per interval, not one per entry: {} writes",
            tries.len()
        );
    }

    #[tokio::test]
    async fn a_full_queue_drops_and_counts_without_waiting() {
        let metrics = Arc::new(SpendMetrics::default());
        let (queue, _receiver) = mpsc::channel(1);
        let recorder = SpendRecorder {
            queue,
            metrics: metrics.clone(),
        };
        recorder.record(entry("gpt"));
        recorder.record(entry("gpt"));
        assert_eq!(metrics.dropped.load(Ordering::Relaxed), 1);
    }
}
