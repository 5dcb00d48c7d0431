//! The submitter (spec §9.6, decisions §9): gets work items (one lease's linked
//! chain, or one Complete's transfers) to TigerBeetle and maps each result back
//! to its item.
//!
//! In `batching` mode one dispatcher task concatenates the items queued by many
//! requests into one `create_transfers` per free session, never splitting an
//! item, so a chain's `linked` flags stay inside one batch. It sends as soon as a
//! session is free, after waiting at most the flush interval for more items:
//! while every session is busy, items pile up and leave as one larger batch.
//! In `direct` mode every item is its own request and the client library
//! coalesces the requests queued on a session. Both bound the work outstanding
//! and answer `Busy` at once when full.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tigerbeetle_unofficial as tb;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use super::config::{SubmitMode, TigerBeetleConfig};
use super::pool::{ClientPool, PoolError, Slot};

/// The result of one transfer that failed: its index within the work item and
/// TigerBeetle's result code. Transfers not listed succeeded.
#[derive(Debug, Clone, Copy)]
pub struct Failure {
    /// The transfer's index within its work item.
    pub index: usize,
    /// TigerBeetle's result for it.
    pub error: tb::error::CreateTransferError,
}

impl Failure {
    /// The result code's kind.
    pub fn kind(&self) -> tb::error::CreateTransferErrorKind {
        self.error.kind()
    }
}

/// Counters of what the submitter sent, for metrics and benchmarks.
#[derive(Debug, Default)]
pub struct SubmitterStats {
    /// `create_transfers` requests sent.
    pub batches: AtomicU64,
    /// Work items sent in them.
    pub items: AtomicU64,
    /// Transfers sent in them.
    pub transfers: AtomicU64,
    /// The most transfers sent in one request.
    pub largest_batch: AtomicU64,
}

impl SubmitterStats {
    fn record(&self, items: usize, transfers: usize) {
        self.batches.fetch_add(1, Ordering::Relaxed);
        self.items.fetch_add(items as u64, Ordering::Relaxed);
        self.transfers.fetch_add(transfers as u64, Ordering::Relaxed);
        self.largest_batch.fetch_max(transfers as u64, Ordering::Relaxed);
    }

    /// A copy of the counters: (batches, items, transfers, largest batch).
    pub fn snapshot(&self) -> (u64, u64, u64, u64) {
        (
            self.batches.load(Ordering::Relaxed),
            self.items.load(Ordering::Relaxed),
            self.transfers.load(Ordering::Relaxed),
            self.largest_batch.load(Ordering::Relaxed),
        )
    }
}

/// What a work item waits for.
type Reply = oneshot::Sender<Result<Vec<Failure>, PoolError>>;

/// One work item on its way through the queue.
struct WorkItem {
    transfers: Vec<tb::Transfer>,
    reply: Reply,
}

/// Gets work items to TigerBeetle, batched or direct.
pub struct Submitter {
    pool: Arc<ClientPool>,
    /// The queue to the dispatcher; `None` in direct mode.
    queue: Option<mpsc::Sender<WorkItem>>,
    /// How long a caller waits for its result.
    timeout: Duration,
    /// The most transfers of one work item (and of one batch).
    batch_events_max: usize,
    stats: Arc<SubmitterStats>,
}

impl std::fmt::Debug for Submitter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Submitter")
            .field("batching", &self.queue.is_some())
            .field("timeout", &self.timeout)
            .finish()
    }
}

impl Submitter {
    /// Starts a submitter on `pool`. In batching mode it spawns the dispatcher,
    /// which stops when `shutdown` completes or the submitter is dropped.
    pub fn start(
        pool: Arc<ClientPool>,
        config: &TigerBeetleConfig,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Self {
        let fields = config.fields();
        let batch_events_max = fields.max_batch_events as usize;
        let stats = Arc::new(SubmitterStats::default());
        let queue = match fields.submit_mode {
            SubmitMode::Direct => None,
            SubmitMode::Batching => {
                let (tx, rx) = mpsc::channel(fields.queue_depth_max as usize);
                let dispatcher = Dispatcher {
                    pool: Arc::clone(&pool),
                    queue: rx,
                    carry: None,
                    batch_events_max,
                    flush_interval: Duration::from_micros(fields.flush_interval_micros),
                    stats: Arc::clone(&stats),
                };
                tokio::spawn(dispatcher.run(shutdown));
                Some(tx)
            }
        };
        Self {
            pool,
            queue,
            timeout: Duration::from_millis(fields.request_timeout_ms),
            batch_events_max,
            stats,
        }
    }

    /// What was sent so far.
    pub fn stats(&self) -> &SubmitterStats {
        &self.stats
    }

    /// Sends `transfers` as one unit and returns the failed ones. `Busy` means
    /// nothing was sent; `Timeout` means the outcome is unknown.
    pub async fn submit(&self, transfers: Vec<tb::Transfer>) -> Result<Vec<Failure>, PoolError> {
        assert!(!transfers.is_empty(), "empty work item");
        assert!(
            transfers.len() <= self.batch_events_max,
            "work item larger than a batch"
        );
        let Some(queue) = &self.queue else {
            let slot = self.pool.try_slot()?;
            self.stats.record(1, transfers.len());
            return self
                .pool
                .run(slot, self.timeout, move |c| create_transfers(c, transfers))
                .await;
        };
        let (reply, answer) = oneshot::channel();
        queue.try_send(WorkItem { transfers, reply }).map_err(|e| match e {
            mpsc::error::TrySendError::Full(_) => PoolError::Busy,
            mpsc::error::TrySendError::Closed(_) => PoolError::Client("the submitter has stopped".to_owned()),
        })?;
        match tokio::time::timeout(self.timeout, answer).await {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err(PoolError::Client("the submitter dropped a work item".to_owned())),
            Err(_) => Err(PoolError::Timeout(self.timeout)),
        }
    }
}

/// Sends `transfers` on `client` and lists the failures.
pub async fn create_transfers(
    client: Arc<tb::Client>,
    transfers: Vec<tb::Transfer>,
) -> Result<Vec<Failure>, tb::error::SendError> {
    match client.create_transfers(transfers).await {
        Ok(()) => Ok(Vec::new()),
        Err(tb::error::CreateTransfersError::Send(e)) => Err(e),
        Err(tb::error::CreateTransfersError::Api(api)) => Ok(api
            .as_slice()
            .iter()
            .map(|f| Failure {
                index: f.index() as usize,
                error: f.inner(),
            })
            .collect()),
        Err(other) => unreachable!("unknown create_transfers error {other:?}"),
    }
}

/// The batching mode's single task: builds batches and hands them to sessions.
struct Dispatcher {
    pool: Arc<ClientPool>,
    queue: mpsc::Receiver<WorkItem>,
    /// An item that did not fit the previous batch; it opens the next one.
    carry: Option<WorkItem>,
    batch_events_max: usize,
    flush_interval: Duration,
    stats: Arc<SubmitterStats>,
}

/// Work items concatenated into one request.
struct Batch {
    transfers: Vec<tb::Transfer>,
    /// Each item's reply and the index of its first transfer in `transfers`.
    items: Vec<(Reply, usize)>,
}

impl Batch {
    fn push(&mut self, item: WorkItem) {
        // A caller that gave up (timeout) gets no answer: sending its transfers
        // would only hold capacity nobody waits for.
        if item.reply.is_closed() {
            return;
        }
        self.items.push((item.reply, self.transfers.len()));
        self.transfers.extend(item.transfers);
    }
}

impl Dispatcher {
    async fn run(mut self, shutdown: impl Future<Output = ()> + Send + 'static) {
        tokio::pin!(shutdown);
        loop {
            let first = match self.carry.take() {
                Some(item) => item,
                None => tokio::select! {
                    item = self.queue.recv() => match item {
                        Some(item) => item,
                        None => return,
                    },
                    () = &mut shutdown => return,
                },
            };
            // Waiting for a session with an item in hand lets the queue fill up
            // behind it: under load, batches grow by themselves.
            let slot = tokio::select! {
                slot = self.pool.slot() => slot,
                () = &mut shutdown => return,
            };
            let batch = self.gather(first).await;
            if batch.items.is_empty() {
                continue;
            }
            self.stats.record(batch.items.len(), batch.transfers.len());
            tokio::spawn(send(Arc::clone(&self.pool), slot, batch));
        }
    }

    /// Fills a batch starting with `first` from what is queued, waiting up to the
    /// flush interval for more; an item that does not fit is carried over whole.
    async fn gather(&mut self, first: WorkItem) -> Batch {
        let mut batch = Batch {
            transfers: Vec::with_capacity(self.batch_events_max),
            items: Vec::new(),
        };
        batch.push(first);
        let deadline = Instant::now() + self.flush_interval;
        loop {
            let item = match self.queue.try_recv() {
                Ok(item) => item,
                Err(mpsc::error::TryRecvError::Disconnected) => break,
                Err(mpsc::error::TryRecvError::Empty) => {
                    match tokio::time::timeout_at(deadline, self.queue.recv()).await {
                        Ok(Some(item)) => item,
                        Ok(None) | Err(_) => break,
                    }
                }
            };
            if batch.transfers.len() + item.transfers.len() > self.batch_events_max {
                self.carry = Some(item);
                break;
            }
            batch.push(item);
            if batch.transfers.len() == self.batch_events_max {
                break;
            }
        }
        batch
    }
}

/// Sends one batch and answers each of its items with its own failures.
async fn send(pool: Arc<ClientPool>, slot: Slot, batch: Batch) {
    let Batch { transfers, items } = batch;
    let total = transfers.len();
    let result = pool.execute(slot, move |c| create_transfers(c, transfers)).await;
    let failures = match result {
        Ok(failures) => failures,
        Err(e) => {
            for (reply, _) in items {
                let _ = reply.send(Err(e.clone()));
            }
            return;
        }
    };
    // Failures are mapped by index: each item owns the indices from its start
    // up to the next item's start.
    let starts: Vec<usize> = items.iter().map(|(_, start)| *start).collect();
    let mut own: Vec<Vec<Failure>> = vec![Vec::new(); items.len()];
    for f in failures {
        assert!(f.index < total, "TigerBeetle answered for an index outside the batch");
        let item = starts.partition_point(|start| *start <= f.index) - 1;
        own[item].push(Failure {
            index: f.index - starts[item],
            error: f.error,
        });
    }
    for ((reply, _), failures) in items.into_iter().zip(own) {
        let _ = reply.send(Ok(failures));
    }
}
