//! The client pool: a fixed set of TigerBeetle client sessions and a bound on
//! the requests outstanding on them.
//!
//! A session has at most one request in flight on the wire; the client library
//! queues (and coalesces) the rest. The client library retries forever while the
//! cluster is unreachable, so a request that outlives its caller's timeout keeps
//! its slot until TigerBeetle answers: slots, not callers, bound the work queued
//! on the client library, and a pool without free slots answers at once.

use std::future::Future;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use tigerbeetle_unofficial as tb;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::config::TigerBeetleConfig;

/// Why a pool request has no answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PoolError {
    /// Every slot is taken: the cluster is slow or down. Nothing was sent.
    #[error("every TigerBeetle session slot is busy")]
    Busy,
    /// No answer within the timeout: the outcome is unknown.
    #[error("no answer from TigerBeetle within {0:?}")]
    Timeout(Duration),
    /// The client library refused or failed the request (evicted, shut down, too
    /// much data). The detail is for logs.
    #[error("TigerBeetle client error: {0}")]
    Client(String),
}

/// One client session.
struct Session {
    /// Replaced when the cluster evicts the session (too many clients, or a
    /// session idle for too long), since an evicted client answers nothing again.
    client: RwLock<Arc<tb::Client>>,
}

/// A fixed set of client sessions to one cluster.
pub struct ClientPool {
    sessions: Vec<Session>,
    /// Free slots: requests that may be outstanding on the client library.
    slots: Arc<Semaphore>,
    /// The number of slots, free or not.
    slots_max: usize,
    /// Sessions reopened after the cluster evicted them (a metric).
    renewed: AtomicU64,
    /// The next session to use, round robin.
    next: AtomicUsize,
    cluster_id: u128,
    addresses: String,
}

impl std::fmt::Debug for ClientPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientPool")
            .field("sessions", &self.sessions.len())
            .field("free_slots", &self.slots.available_permits())
            .field("addresses", &self.addresses)
            .finish()
    }
}

/// The right to have one request outstanding on one session.
pub struct Slot {
    permit: OwnedSemaphorePermit,
    client: Arc<tb::Client>,
    session: usize,
}

impl ClientPool {
    /// Opens `config.sessions` sessions with `slots` outstanding requests in all.
    /// Opening does not wait for the cluster: the client library connects lazily.
    pub fn open(config: &TigerBeetleConfig, slots: usize) -> Result<Self, PoolError> {
        assert!(slots >= 1, "a pool needs at least one slot");
        let addresses = config.addresses_joined();
        let sessions = (0..config.fields().sessions)
            .map(|_| {
                let client = new_client(config.cluster_id(), &addresses)?;
                Ok(Session {
                    client: RwLock::new(Arc::new(client)),
                })
            })
            .collect::<Result<Vec<_>, PoolError>>()?;
        Ok(Self {
            sessions,
            slots: Arc::new(Semaphore::new(slots)),
            slots_max: slots,
            renewed: AtomicU64::new(0),
            next: AtomicUsize::new(0),
            cluster_id: config.cluster_id(),
            addresses,
        })
    }

    /// The number of sessions.
    pub fn session_count(&self) -> usize {
        self.sessions.len()
    }

    /// Requests outstanding on the client library now.
    pub fn slots_busy(&self) -> usize {
        self.slots_max - self.slots.available_permits()
    }

    /// Sessions reopened so far because the cluster had evicted them.
    pub fn sessions_renewed(&self) -> u64 {
        self.renewed.load(Ordering::Relaxed)
    }

    /// A free slot, or `Busy` at once.
    pub fn try_slot(&self) -> Result<Slot, PoolError> {
        let permit = self.slots.clone().try_acquire_owned().map_err(|_| PoolError::Busy)?;
        Ok(self.slot_with(permit))
    }

    /// Waits for a free slot (the submitter does, so that work queues up while
    /// every session is busy and goes out as one larger batch).
    pub async fn slot(&self) -> Slot {
        let permit = self
            .slots
            .clone()
            .acquire_owned()
            .await
            .expect("the pool never closes its semaphore");
        self.slot_with(permit)
    }

    fn slot_with(&self, permit: OwnedSemaphorePermit) -> Slot {
        let session = self.next.fetch_add(1, Ordering::Relaxed) % self.sessions.len();
        let client = self.sessions[session]
            .client
            .read()
            .expect("session lock poisoned")
            .clone();
        Slot {
            permit,
            client,
            session,
        }
    }

    /// Replaces the client of `session` after the cluster evicted it.
    fn renew(&self, session: usize, evicted: &Arc<tb::Client>) {
        let mut guard = self.sessions[session].client.write().expect("session lock poisoned");
        // Another request may have renewed it already.
        if !Arc::ptr_eq(&guard, evicted) {
            return;
        }
        match new_client(self.cluster_id, &self.addresses) {
            Ok(client) => {
                *guard = Arc::new(client);
                self.renewed.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => tracing::error!(session, error = %e, "cannot reopen an evicted TigerBeetle session"),
        }
    }

    /// Runs `op` on `slot`'s client in a task that keeps the slot until the
    /// client library answers, and waits for that answer at most `timeout`.
    pub async fn run<T, F, Fut>(self: &Arc<Self>, slot: Slot, timeout: Duration, op: F) -> Result<T, PoolError>
    where
        F: FnOnce(Arc<tb::Client>) -> Fut + Send + 'static,
        Fut: Future<Output = Result<T, tb::error::SendError>> + Send + 'static,
        T: Send + 'static,
    {
        let task = tokio::spawn(Arc::clone(self).execute(slot, op));
        match tokio::time::timeout(timeout, task).await {
            Ok(Ok(result)) => result,
            Ok(Err(join)) => Err(PoolError::Client(format!("request task failed: {join}"))),
            Err(_) => Err(PoolError::Timeout(timeout)),
        }
    }

    /// Runs `op` on `slot`'s client and keeps the slot until it answers, however
    /// long that takes; reopens the session when the cluster evicted it.
    pub async fn execute<T, F, Fut>(self: Arc<Self>, slot: Slot, op: F) -> Result<T, PoolError>
    where
        F: FnOnce(Arc<tb::Client>) -> Fut,
        Fut: Future<Output = Result<T, tb::error::SendError>>,
    {
        let Slot {
            permit,
            client,
            session,
        } = slot;
        let result = op(Arc::clone(&client)).await;
        if let Err(e) = &result {
            if matches!(e.kind(), tb::error::SendErrorKind::ClientEvicted) {
                self.renew(session, &client);
            }
        }
        drop(permit);
        result.map_err(|e| PoolError::Client(e.to_string()))
    }
}

fn new_client(cluster_id: u128, addresses: &str) -> Result<tb::Client, PoolError> {
    tb::Client::new(cluster_id, addresses).map_err(|e| PoolError::Client(format!("cannot open a session: {e}")))
}
