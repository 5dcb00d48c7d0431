//! A session of the client pool: the client it uses now, its requests
//! outstanding and when it last moved, and the count of the pool's open clients.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use tigerbeetle_unofficial as tb;
use tokio::sync::watch;

/// How long a request may stay unanswered before its session counts as
/// stalled: far above a commit's round trip (milliseconds, even under load),
/// and short enough that a balancer hears of an outage within 2 s.
pub const STALL_MS: u64 = 1_000;
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
    /// much data), or the session was replaced before it answered (the outcome
    /// is then unknown). The detail is for logs.
    #[error("TigerBeetle client error: {0}")]
    Client(String),
}

/// The client a session uses now, and what the watchdog knows of it.
pub(super) struct Live {
    pub(super) client: Arc<tb::Client>,
    /// Set once the client is replaced: requests waiting on it stop waiting.
    pub(super) retired: watch::Sender<bool>,
    /// Requests outstanding on this client.
    pub(super) outstanding: AtomicUsize,
    /// When this client last answered or, idle before, was given a request
    /// (ms since the pool opened): a busy client that has not moved since
    /// [`STALL_MS`] is stalled.
    pub(super) moved_ms: AtomicU64,
    /// Counts the client among the pool's open clients while it lives.
    pub(super) _open: OpenClient,
}

impl Live {
    pub(super) fn new(client: tb::Client, open: &Arc<AtomicUsize>) -> Arc<Self> {
        Arc::new(Self {
            client: Arc::new(client),
            retired: watch::Sender::new(false),
            outstanding: AtomicUsize::new(0),
            moved_ms: AtomicU64::new(0),
            _open: OpenClient::new(open),
        })
    }

    pub(super) fn stalled(&self, now_ms: u64) -> bool {
        self.outstanding.load(Ordering::Acquire) > 0
            && now_ms.saturating_sub(self.moved_ms.load(Ordering::Acquire)) >= STALL_MS
    }
}

/// One client session.
pub(super) struct Session {
    /// Replaced when the cluster evicts the session (an evicted client answers
    /// nothing again), or when the watchdog finds it stalled while a fresh
    /// client is answered.
    pub(super) live: RwLock<Arc<Live>>,
}

/// Counts one open client in a pool's gauge while it lives.
pub(super) struct OpenClient(Arc<AtomicUsize>);

impl OpenClient {
    pub(super) fn new(open: &Arc<AtomicUsize>) -> Self {
        open.fetch_add(1, Ordering::Relaxed);
        Self(Arc::clone(open))
    }
}

impl Drop for OpenClient {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Opens a client of the cluster at `addresses`.
pub(super) fn new_client(cluster_id: u128, addresses: &str) -> Result<tb::Client, PoolError> {
    tb::Client::new(cluster_id, addresses).map_err(|e| PoolError::Client(format!("cannot open a session: {e}")))
}
