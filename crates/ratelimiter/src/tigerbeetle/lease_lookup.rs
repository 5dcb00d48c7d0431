//! The batcher of lease lookups (docs/tigerbeetle-backend.md, "Complete on any
//! server"), which reads leases back from the cluster by id ([`super::cluster_lease`]).
//!
//! Lookups are batched like the submitter's writes: the lookups of one moment,
//! from many requests, leave as one `lookup_transfers` of all their ids on a
//! free session, and while the session is busy the next batch fills. Leases
//! reserved by earlier versions (their chain opened with a zero-amount marker
//! and named reservations by key) are found by `query_transfers` on the
//! lease's `user_data_128` instead.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tigerbeetle_unofficial as tb;
use tokio::sync::{mpsc, oneshot};

use super::pool::{ClientPool, PoolError};

/// The most ids of one `lookup_transfers`: TigerBeetle's 8,189 events per
/// request, rounded down.
const LOOKUP_IDS_MAX: usize = 8_000;

/// The most lookups queued for the batcher; beyond it a lookup is answered
/// `Busy` (503) at once.
const LOOKUP_QUEUE_MAX: usize = 4_096;

/// How often the batcher, while it waits for a session, drops the lookups
/// whose callers gave up from the head of its queue (as the submitter does).
const PRUNE_INTERVAL: Duration = Duration::from_millis(10);

/// One lookup on its way through the batcher.
struct Lookup {
    ids: Vec<u128>,
    reply: oneshot::Sender<Result<Vec<tb::Transfer>, PoolError>>,
}

/// Batches `lookup_transfers` from many requests into few cluster requests.
#[derive(Debug)]
pub struct LeaseLookups {
    queue: mpsc::Sender<Lookup>,
    /// `lookup_transfers` requests sent: with [`Self::lookups`], how well
    /// lookups of one moment share a request.
    requests: Arc<AtomicU64>,
    /// Lookups asked for.
    lookups: AtomicU64,
}

impl std::fmt::Debug for Lookup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lookup").field("ids", &self.ids.len()).finish()
    }
}

impl LeaseLookups {
    /// Starts the batcher on `pool`; its task ends when this is dropped.
    pub fn start(pool: Arc<ClientPool>) -> Self {
        let (queue, rx) = mpsc::channel(LOOKUP_QUEUE_MAX);
        let requests = Arc::new(AtomicU64::new(0));
        tokio::spawn(run_lookups(pool, rx, Arc::clone(&requests)));
        Self {
            queue,
            requests,
            lookups: AtomicU64::new(0),
        }
    }

    /// Lookups asked for, and `lookup_transfers` requests sent for them.
    pub fn counts(&self) -> (u64, u64) {
        (
            self.lookups.load(Ordering::Relaxed),
            self.requests.load(Ordering::Relaxed),
        )
    }

    /// The transfers found at `ids` (those that exist, in no order), waiting
    /// at most `timeout`.
    pub async fn lookup(&self, ids: Vec<u128>, timeout: Duration) -> Result<Vec<tb::Transfer>, PoolError> {
        assert!(!ids.is_empty() && ids.len() <= LOOKUP_IDS_MAX, "lookup size");
        let (reply, answer) = oneshot::channel();
        self.lookups.fetch_add(1, Ordering::Relaxed);
        self.queue.try_send(Lookup { ids, reply }).map_err(|e| match e {
            mpsc::error::TrySendError::Full(_) => PoolError::Busy,
            mpsc::error::TrySendError::Closed(_) => PoolError::Client("the lookup batcher has stopped".to_owned()),
        })?;
        match tokio::time::timeout(timeout, answer).await {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err(PoolError::Client("the lookup batcher dropped a lookup".to_owned())),
            Err(_) => Err(PoolError::Timeout(timeout)),
        }
    }
}

/// The batcher's task: takes the first lookup, waits for a free session
/// (lookups queue up meanwhile), then sends everything queued as one request.
async fn run_lookups(pool: Arc<ClientPool>, mut queue: mpsc::Receiver<Lookup>, requests: Arc<AtomicU64>) {
    let mut carry: Option<Lookup> = None;
    loop {
        let first = match carry.take() {
            Some(lookup) => lookup,
            None => match queue.recv().await {
                Some(lookup) => lookup,
                None => return,
            },
        };
        let Some((slot, first)) = wait_for_slot(&pool, first, &mut queue).await else {
            continue;
        };
        let mut batch = vec![first];
        let mut ids = batch[0].ids.len();
        while let Ok(lookup) = queue.try_recv() {
            if ids + lookup.ids.len() > LOOKUP_IDS_MAX {
                carry = Some(lookup);
                break;
            }
            ids += lookup.ids.len();
            batch.push(lookup);
        }
        batch.retain(|l| !l.reply.is_closed());
        if batch.is_empty() {
            continue;
        }
        requests.fetch_add(1, Ordering::Relaxed);
        tokio::spawn(send_lookups(Arc::clone(&pool), slot, batch));
    }
}

/// Waits for a free session holding `first`; meanwhile, every
/// [`PRUNE_INTERVAL`], a lookup whose caller gave up gives its place to the
/// next one queued, so that while the cluster is cut off the queue drains of
/// the lookups nobody waits for (callers give up in the order they came).
/// `None` when every lookup queued was given up.
async fn wait_for_slot(
    pool: &ClientPool,
    mut first: Lookup,
    queue: &mut mpsc::Receiver<Lookup>,
) -> Option<(super::pool::Slot, Lookup)> {
    let acquire = pool.slot();
    tokio::pin!(acquire);
    loop {
        tokio::select! {
            slot = &mut acquire => return Some((slot, first)),
            () = tokio::time::sleep(PRUNE_INTERVAL) => {
                while first.reply.is_closed() {
                    first = queue.try_recv().ok()?;
                }
            }
        }
    }
}

/// Sends one batch of lookups and answers each with the transfers at its ids.
async fn send_lookups(pool: Arc<ClientPool>, slot: super::pool::Slot, batch: Vec<Lookup>) {
    let ids: Vec<u128> = batch.iter().flat_map(|l| l.ids.iter().copied()).collect();
    let result = pool
        .execute(slot, move |client| async move { client.lookup_transfers(ids).await })
        .await;
    let found: HashMap<u128, tb::Transfer> = match result {
        Ok(found) => found.into_iter().map(|t| (t.id(), t)).collect(),
        Err(e) => {
            for lookup in batch {
                let _ = lookup.reply.send(Err(e.clone()));
            }
            return;
        }
    };
    for lookup in batch {
        let own = lookup.ids.iter().filter_map(|id| found.get(id).copied()).collect();
        let _ = lookup.reply.send(Ok(own));
    }
}
