//! The submitter (docs/tigerbeetle-backend.md, "The submitter"): gets work items (one
//! lease's linked chain, or one Complete's transfers) to TigerBeetle and maps each result
//! back to its item.
//!
//! In `batching` mode one dispatcher task concatenates the items queued by many
//! requests into one `create_transfers` per free session, never splitting an
//! item, so a chain's `linked` flags stay inside one batch. While every session
//! is busy, items pile up and leave as one larger batch. Once a session is free
//! it waits for more only when that pays: when items are arriving faster than
//! a fraction of the cluster's round trip (a burst, or the load of a fleet
//! server), for at most that fraction, and never after a lull (see
//! [`FillPolicy`]); a configured flush interval replaces that with a fixed wait.
//! In `direct` mode every item is its own request and the client library
//! coalesces the requests queued on a session. Both bound the work outstanding
//! and answer `Busy` at once when full.

use std::collections::VecDeque;
use std::future::Future;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tigerbeetle_unofficial as tb;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use super::config::{SubmitMode, TigerBeetleConfig};
use super::pool::{ClientPool, PoolError, Slot};
use crate::base::metrics::Histogram;

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

/// The share of the cluster's round trip a batch may wait to fill, as a
/// divisor: an item waits at most half a round trip more, while the request
/// it saves costs the cluster a whole one's fixed work (BENCHMARKS.md,
/// "Reserve-only over HTTP": 1.4–2.5 ms per request besides the transfers).
const FILL_WAIT_RTT_DIVISOR: u32 = 2;

/// The longest adaptive wait, whatever the round trip: beyond it the latency
/// added outweighs the requests saved on any cluster this was measured on.
const FILL_WAIT_MAX: Duration = Duration::from_millis(2);

/// The weight of a new sample in the moving averages of the gap between
/// arrivals and of the round trip, as a divisor (1/8: a few dozen items or
/// batches of memory).
const EWMA_DIVISOR: u64 = 8;

/// The round trip assumed before any was measured (a local cluster's).
const RTT_INITIAL: Duration = Duration::from_millis(1);

/// How often the dispatcher, while it waits for a session, drops the queued
/// items whose callers gave up: while the cluster is cut off, the queue then
/// holds only items someone still waits for, instead of one more for every
/// attempt a client makes (10 ms is far below any caller's timeout and costs
/// nothing while sessions are free).
const PRUNE_INTERVAL: Duration = Duration::from_millis(10);

/// When the dispatcher waits for a batch to fill: from the moving averages
/// of the gap between arrivals and of the cluster's round trip, or a fixed
/// flush interval when one is configured.
#[derive(Debug)]
struct FillPolicy {
    /// The configured flush interval; zero means adaptive.
    fixed: Duration,
    /// The moving average of the gap between two items' arrivals, in µs.
    gap_micros: u64,
    /// When the last item arrived.
    last_arrival: Option<Instant>,
    /// The moving average of the round trip, in µs, shared with the tasks
    /// that send batches.
    rtt_micros: Arc<AtomicU64>,
}

impl FillPolicy {
    fn new(fixed: Duration) -> Self {
        Self {
            fixed,
            gap_micros: u64::MAX / 2,
            last_arrival: None,
            rtt_micros: Arc::new(AtomicU64::new(RTT_INITIAL.as_micros() as u64)),
        }
    }

    /// Notes the arrival of an item queued at `queued`.
    fn arrived(&mut self, queued: Instant) {
        if let Some(last) = self.last_arrival.replace(queued) {
            let gap = queued.saturating_duration_since(last).as_micros() as u64;
            self.gap_micros = ewma(self.gap_micros.min(FILL_WAIT_MAX.as_micros() as u64 * 4), gap);
        }
    }

    /// How long a batch whose first item was queued at `first` may stay open,
    /// and how long to wait for each next item before sending what it has: no
    /// wait at all unless items arrive more often than the batch may wait.
    fn window(&self, first: Instant) -> (Instant, Duration) {
        if !self.fixed.is_zero() {
            return (Instant::now() + self.fixed, self.fixed);
        }
        let rtt = Duration::from_micros(self.rtt_micros.load(Ordering::Relaxed));
        let budget = (rtt / FILL_WAIT_RTT_DIVISOR).min(FILL_WAIT_MAX);
        let gap = Duration::from_micros(self.gap_micros);
        if gap >= budget {
            return (first, Duration::ZERO);
        }
        // Two gaps without an arrival: the burst is over, send.
        (first + budget, gap * 2)
    }
}

/// Records a round trip in the moving average `rtt_micros`.
fn observe_rtt(rtt_micros: &AtomicU64, rtt: Duration) {
    let old = rtt_micros.load(Ordering::Relaxed);
    rtt_micros.store(ewma(old, rtt.as_micros() as u64), Ordering::Relaxed);
}

/// One step of an exponentially weighted moving average.
fn ewma(average: u64, sample: u64) -> u64 {
    average - average / EWMA_DIVISOR + sample / EWMA_DIVISOR
}

/// Counters of what the submitter sent and refused, for `/metrics` and benchmarks.
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
    /// Work items refused at once because the queue (or, in direct mode, every
    /// slot) was full: the cluster is slower than the load.
    pub queue_full: AtomicU64,
    /// Callers that stopped waiting for TigerBeetle: their outcome is unknown.
    pub timeouts: AtomicU64,
    /// Queued work items not sent because their caller had already given up.
    pub abandoned: AtomicU64,
    /// How long work items waited in the queue before their batch left
    /// (batching mode): the price of batching, and the first sign of saturation.
    pub queue_wait: Histogram,
    /// How long each `create_transfers` took, from send to answer: the
    /// cluster's commit latency as this server sees it.
    pub round_trip: Histogram,
}

/// A copy of the counters at one moment, for benchmarks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SubmitterSnapshot {
    /// `create_transfers` requests sent.
    pub batches: u64,
    /// Work items sent in them.
    pub items: u64,
    /// Transfers sent in them.
    pub transfers: u64,
    /// The most transfers sent in one request.
    pub largest_batch: u64,
}

impl SubmitterStats {
    fn record(&self, items: usize, transfers: usize) {
        self.batches.fetch_add(1, Ordering::Relaxed);
        self.items.fetch_add(items as u64, Ordering::Relaxed);
        self.transfers.fetch_add(transfers as u64, Ordering::Relaxed);
        self.largest_batch.fetch_max(transfers as u64, Ordering::Relaxed);
    }

    /// A copy of the batch counters.
    pub fn snapshot(&self) -> SubmitterSnapshot {
        SubmitterSnapshot {
            batches: self.batches.load(Ordering::Relaxed),
            items: self.items.load(Ordering::Relaxed),
            transfers: self.transfers.load(Ordering::Relaxed),
            largest_batch: self.largest_batch.load(Ordering::Relaxed),
        }
    }

    /// Counts a refusal or a timeout before it is returned to the caller.
    fn count_error(&self, error: &PoolError) {
        let counter = match error {
            PoolError::Busy => &self.queue_full,
            PoolError::Timeout(_) => &self.timeouts,
            PoolError::Client(_) => return,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// What a work item waits for.
type Reply = oneshot::Sender<Result<Vec<Failure>, PoolError>>;

/// One work item on its way through the queue.
struct WorkItem {
    transfers: Vec<tb::Transfer>,
    reply: Reply,
    /// When the item was queued, for the queue wait histogram.
    queued: Instant,
}

/// Gets work items to TigerBeetle, batched or direct.
pub struct Submitter {
    pool: Arc<ClientPool>,
    /// The queue to the dispatcher; `None` in direct mode.
    queue: Option<mpsc::Sender<WorkItem>>,
    /// Items the dispatcher took off the queue while it waited for a session
    /// (they count against the queue's bound).
    backlog_len: Arc<AtomicUsize>,
    /// The most items queued, backlog included.
    queue_max: usize,
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
        let batch_events_max = fields.batch_events_max as usize;
        let stats = Arc::new(SubmitterStats::default());
        let queue_max = fields.queue_depth_max as usize;
        let backlog_len = Arc::new(AtomicUsize::new(0));
        let queue = match fields.submit_mode {
            SubmitMode::Direct => None,
            SubmitMode::Batching => {
                let (tx, rx) = mpsc::channel(queue_max);
                let dispatcher = Dispatcher {
                    pool: Arc::clone(&pool),
                    queue: rx,
                    carry: None,
                    backlog: VecDeque::new(),
                    backlog_len: Arc::clone(&backlog_len),
                    queue_max,
                    batch_events_max,
                    fill: FillPolicy::new(Duration::from_micros(fields.flush_interval_micros)),
                    stats: Arc::clone(&stats),
                };
                tokio::spawn(dispatcher.run(shutdown));
                Some(tx)
            }
        };
        Self {
            pool,
            queue,
            backlog_len,
            queue_max,
            timeout: Duration::from_millis(fields.request_timeout_ms),
            batch_events_max,
            stats,
        }
    }

    /// The most transfers of one work item: a caller with more sends them as
    /// several items, in order.
    pub fn batch_events_max(&self) -> usize {
        self.batch_events_max
    }

    /// What was sent so far.
    pub fn stats(&self) -> &SubmitterStats {
        &self.stats
    }

    /// Work items queued for the dispatcher now (0 in direct mode, whose
    /// requests wait on the client library and count as busy slots).
    pub fn queue_depth(&self) -> usize {
        let queued = self.queue.as_ref().map_or(0, |q| q.max_capacity() - q.capacity());
        queued + self.backlog_len.load(Ordering::Relaxed)
    }

    /// Sends `transfers` as one unit and returns the failed ones. `Busy` means
    /// nothing was sent; `Timeout` means the outcome is unknown.
    pub async fn submit(&self, transfers: Vec<tb::Transfer>) -> Result<Vec<Failure>, PoolError> {
        assert!(!transfers.is_empty(), "empty work item");
        assert!(
            transfers.len() <= self.batch_events_max,
            "work item larger than a batch"
        );
        let result = match &self.queue {
            None => self.submit_direct(transfers).await,
            Some(queue) => self.submit_queued(queue, transfers).await,
        };
        if let Err(e) = &result {
            self.stats.count_error(e);
        }
        result
    }

    /// Direct mode: the item is its own request on a free slot.
    async fn submit_direct(&self, transfers: Vec<tb::Transfer>) -> Result<Vec<Failure>, PoolError> {
        let slot = self.pool.try_slot()?;
        self.stats.record(1, transfers.len());
        let stats = Arc::clone(&self.stats);
        self.pool
            .run(slot, self.timeout, move |c| timed_create_transfers(c, transfers, stats))
            .await
    }

    /// Batching mode: the item joins the dispatcher's queue.
    async fn submit_queued(
        &self,
        queue: &mpsc::Sender<WorkItem>,
        transfers: Vec<tb::Transfer>,
    ) -> Result<Vec<Failure>, PoolError> {
        if self.queue_depth() >= self.queue_max {
            return Err(PoolError::Busy);
        }
        let (reply, answer) = oneshot::channel();
        let item = WorkItem {
            transfers,
            reply,
            queued: Instant::now(),
        };
        queue.try_send(item).map_err(|e| match e {
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

/// [`create_transfers`], recording how long TigerBeetle took to answer.
async fn timed_create_transfers(
    client: Arc<tb::Client>,
    transfers: Vec<tb::Transfer>,
    stats: Arc<SubmitterStats>,
) -> Result<Vec<Failure>, tb::error::SendError> {
    let sent = Instant::now();
    let result = create_transfers(client, transfers).await;
    stats.round_trip.observe(sent.elapsed());
    result
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
    /// Items taken off the queue while waiting for a session, oldest first,
    /// so that those whose callers gave up can be dropped.
    backlog: VecDeque<WorkItem>,
    /// The backlog's length, for the queue's depth and bound.
    backlog_len: Arc<AtomicUsize>,
    /// The most items queued, backlog included.
    queue_max: usize,
    batch_events_max: usize,
    fill: FillPolicy,
    stats: Arc<SubmitterStats>,
}

/// Work items concatenated into one request.
struct Batch {
    transfers: Vec<tb::Transfer>,
    /// Each item's reply, where its transfers start, and when it was queued.
    items: Vec<BatchedItem>,
}

/// One work item inside a batch.
struct BatchedItem {
    reply: Reply,
    /// The index of the item's first transfer in the batch.
    start: usize,
    queued: Instant,
}

impl Batch {
    /// Adds `item`, unless its caller gave up (timeout): it gets no answer, and
    /// sending its transfers would only hold capacity nobody waits for.
    fn push(&mut self, item: WorkItem, stats: &SubmitterStats) {
        if item.reply.is_closed() {
            stats.abandoned.fetch_add(1, Ordering::Relaxed);
            return;
        }
        self.items.push(BatchedItem {
            reply: item.reply,
            start: self.transfers.len(),
            queued: item.queued,
        });
        self.transfers.extend(item.transfers);
    }
}

/// How a wait for a session ended.
enum SlotWait {
    /// A session is free for the batch that `first` opens.
    Slot(Slot, WorkItem),
    /// Every caller waiting gave up: nothing to send.
    Emptied,
    /// The submitter stops.
    Stop,
}

impl Dispatcher {
    async fn run(mut self, shutdown: impl Future<Output = ()> + Send + 'static) {
        tokio::pin!(shutdown);
        loop {
            let first = match self.carry.take().or_else(|| self.pop_backlog()) {
                Some(item) => item,
                None => {
                    let item = tokio::select! {
                        item = self.queue.recv() => match item {
                            Some(item) => item,
                            None => return,
                        },
                        () = &mut shutdown => return,
                    };
                    self.fill.arrived(item.queued);
                    item
                }
            };
            // Waiting for a session with an item in hand lets the queue fill up
            // behind it: under load, batches grow by themselves.
            let (slot, first) = match self.wait_for_slot(first, &mut shutdown).await {
                SlotWait::Slot(slot, first) => (slot, first),
                SlotWait::Emptied => continue,
                SlotWait::Stop => return,
            };
            let batch = self.gather(first).await;
            if batch.items.is_empty() {
                continue;
            }
            self.stats.record(batch.items.len(), batch.transfers.len());
            let now = Instant::now();
            for item in &batch.items {
                self.stats.queue_wait.observe(now - item.queued);
            }
            let rtt = Arc::clone(&self.fill.rtt_micros);
            tokio::spawn(send(Arc::clone(&self.pool), slot, batch, Arc::clone(&self.stats), rtt));
        }
    }

    /// Waits for a free session holding `first`; meanwhile drops the queued
    /// items whose callers gave up, `first` included.
    async fn wait_for_slot(
        &mut self,
        mut first: WorkItem,
        shutdown: &mut std::pin::Pin<&mut impl Future<Output = ()>>,
    ) -> SlotWait {
        // One wait, kept across the prunes, so the dispatcher keeps its place
        // among the waiters.
        let pool = Arc::clone(&self.pool);
        let acquire = pool.slot();
        tokio::pin!(acquire);
        loop {
            tokio::select! {
                slot = &mut acquire => return SlotWait::Slot(slot, first),
                () = tokio::time::sleep(PRUNE_INTERVAL) => {
                    self.prune();
                    if first.reply.is_closed() {
                        self.stats.abandoned.fetch_add(1, Ordering::Relaxed);
                        match self.pop_backlog() {
                            Some(next) => first = next,
                            None => return SlotWait::Emptied,
                        }
                    }
                }
                () = shutdown.as_mut() => return SlotWait::Stop,
            }
        }
    }

    /// Moves what is queued to the backlog and drops the items there whose
    /// callers gave up.
    fn prune(&mut self) {
        while self.backlog.len() < self.queue_max {
            let Ok(item) = self.queue.try_recv() else {
                break;
            };
            self.fill.arrived(item.queued);
            self.backlog.push_back(item);
        }
        let before = self.backlog.len();
        self.backlog.retain(|item| !item.reply.is_closed());
        let dropped = before - self.backlog.len();
        self.stats.abandoned.fetch_add(dropped as u64, Ordering::Relaxed);
        self.backlog_len.store(self.backlog.len(), Ordering::Relaxed);
    }

    /// The oldest item of the backlog, if any.
    fn pop_backlog(&mut self) -> Option<WorkItem> {
        let item = self.backlog.pop_front();
        self.backlog_len.store(self.backlog.len(), Ordering::Relaxed);
        item
    }

    /// Fills a batch starting with `first` from what is queued, waiting for
    /// more as long as the [`FillPolicy`] says it pays; an item that does not
    /// fit is carried over whole.
    async fn gather(&mut self, first: WorkItem) -> Batch {
        let mut batch = Batch {
            transfers: Vec::with_capacity(self.batch_events_max),
            items: Vec::new(),
        };
        let (deadline, patience) = self.fill.window(first.queued);
        batch.push(first, &self.stats);
        loop {
            if let Some(item) = self.pop_backlog() {
                if batch.transfers.len() + item.transfers.len() > self.batch_events_max {
                    self.carry = Some(item);
                    break;
                }
                batch.push(item, &self.stats);
                if batch.transfers.len() == self.batch_events_max {
                    break;
                }
                continue;
            }
            let item = match self.queue.try_recv() {
                Ok(item) => item,
                Err(mpsc::error::TryRecvError::Disconnected) => break,
                Err(mpsc::error::TryRecvError::Empty) => {
                    let until = deadline.min(Instant::now() + patience);
                    if patience.is_zero() || until <= Instant::now() {
                        break;
                    }
                    match tokio::time::timeout_at(until, self.queue.recv()).await {
                        Ok(Some(item)) => item,
                        Ok(None) | Err(_) => break,
                    }
                }
            };
            self.fill.arrived(item.queued);
            if batch.transfers.len() + item.transfers.len() > self.batch_events_max {
                self.carry = Some(item);
                break;
            }
            batch.push(item, &self.stats);
            if batch.transfers.len() == self.batch_events_max {
                break;
            }
        }
        batch
    }
}

/// Sends one batch and answers each of its items with its own failures.
async fn send(pool: Arc<ClientPool>, slot: Slot, batch: Batch, stats: Arc<SubmitterStats>, rtt: Arc<AtomicU64>) {
    let Batch { transfers, items } = batch;
    let total = transfers.len();
    let sent = Instant::now();
    let result = pool
        .execute(slot, move |c| timed_create_transfers(c, transfers, stats))
        .await;
    if result.is_ok() {
        observe_rtt(&rtt, sent.elapsed());
    }
    let failures = match result {
        Ok(failures) => failures,
        Err(e) => {
            for item in items {
                let _ = item.reply.send(Err(e.clone()));
            }
            return;
        }
    };
    // Failures are mapped by index: each item owns the indices from its start
    // up to the next item's start.
    let mut own: Vec<Vec<Failure>> = vec![Vec::new(); items.len()];
    for f in failures {
        assert!(f.index < total, "TigerBeetle answered for an index outside the batch");
        let item = items.partition_point(|item| item.start <= f.index) - 1;
        own[item].push(Failure {
            index: f.index - items[item].start,
            error: f.error,
        });
    }
    for (item, failures) in items.into_iter().zip(own) {
        let _ = item.reply.send(Ok(failures));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A policy whose round trip is `rtt` and whose items arrived `gap` apart.
    fn policy(fixed: Duration, rtt: Duration, gap: Duration) -> FillPolicy {
        let policy = FillPolicy::new(fixed);
        policy.rtt_micros.store(rtt.as_micros() as u64, Ordering::Relaxed);
        let mut policy = policy;
        let start = Instant::now();
        for i in 0..64 {
            policy.arrived(start + gap * i);
        }
        policy
    }

    #[test]
    fn a_batch_waits_only_while_items_arrive_faster_than_half_a_round_trip() {
        let first = Instant::now();
        let rtt = Duration::from_millis(1);
        let (deadline, patience) = policy(Duration::ZERO, rtt, Duration::from_micros(50)).window(first);
        assert_eq!(
            deadline,
            first + rtt / 2,
            "at most half a round trip after the first item"
        );
        // The moving average is in whole µs: about two gaps of 50 µs.
        assert!(
            (Duration::from_micros(100)..=Duration::from_micros(120)).contains(&patience),
            "two gaps without an arrival end it: {patience:?}"
        );
        let (_, patience) = policy(Duration::ZERO, rtt, Duration::from_micros(600)).window(first);
        assert_eq!(patience, Duration::ZERO, "a light load sends at once");
        let (deadline, _) = policy(Duration::ZERO, Duration::from_millis(40), Duration::from_micros(50)).window(first);
        assert_eq!(deadline, first + FILL_WAIT_MAX, "never longer than the cap");
    }

    #[test]
    fn a_configured_flush_interval_replaces_the_adaptive_wait() {
        let fixed = Duration::from_micros(300);
        let slow = policy(fixed, Duration::from_millis(1), Duration::from_secs(1));
        let (_, patience) = slow.window(Instant::now());
        assert_eq!(patience, fixed, "waits even at a light load");
    }

    #[test]
    fn a_server_that_saw_no_arrivals_yet_sends_at_once() {
        let policy = FillPolicy::new(Duration::ZERO);
        assert_eq!(policy.window(Instant::now()).1, Duration::ZERO);
    }
}
