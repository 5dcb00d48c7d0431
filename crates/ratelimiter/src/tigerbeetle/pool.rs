//! The client pool: a fixed set of TigerBeetle client sessions, a bound on the
//! requests outstanding on them, and a watchdog that replaces a session whose
//! client stopped answering once a fresh session is answered.
//!
//! A session has at most one request in flight on the wire; the client library
//! queues (and coalesces) the rest. The client library retries forever while the
//! cluster is unreachable, so a request that outlives its caller's timeout keeps
//! its slot until TigerBeetle answers: slots, not callers, bound the work queued
//! on the client library, and a pool without free slots answers at once.
//!
//! The client library's retries back off (up to 10 s between resends of a
//! request, and up to 1 s between connection attempts, in TigerBeetle 0.16), so
//! after connections were reset or refused for a while, a client can take
//! seconds to notice that the cluster is back. The watchdog does not wait for
//! it: while a session has had a request unanswered for [`STALL_MS`], it checks
//! whether a replica accepts connections and, if one does, opens a fresh
//! client (a probe) that sends a lookup. When a probe is answered
//! the cluster is reachable, and the probe's client, registered already,
//! replaces a stalled session; the requests still waiting on the old client end
//! with an error (outcome unknown, as after a timeout), their slots come free,
//! and the old client is closed (docs/tigerbeetle-backend.md, "Sessions").

use std::future::Future;
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock, Weak};
use std::time::{Duration, Instant};

use tigerbeetle_unofficial as tb;
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
use tokio::time::MissedTickBehavior;

use super::config::TigerBeetleConfig;

/// How long a request may stay unanswered before its session counts as
/// stalled: far above a commit's round trip (milliseconds, even under load),
/// and short enough that a balancer hears of an outage within 2 s.
pub const STALL_MS: u64 = 1_000;
/// How often the watchdog looks at the sessions, and checks a replica's port
/// while one is stalled: a refused port that opens again is seen this soon.
pub const WATCH_INTERVAL_MS: u64 = 100;
/// How long a probe client gets to be answered before it is closed. A fresh
/// client registers as it opens, before its connection is up, so its first
/// answer comes when it resends, about 650 ms later on a healthy cluster
/// (measured; TigerBeetle 0.16 resends after twice its 300 ms round-trip
/// estimate): a probe lives through two resends, so that while replicas accept
/// connections but do not answer, a resend falls within 0.7 s of the network's
/// return.
pub const PROBE_TIMEOUT_MS: u64 = 1_500;
/// The most probes open at once: each is a client with its own thread and
/// about 14 MiB of message buffers (three at once grew a server by 42 MiB).
pub const PROBES_MAX: usize = 1;
/// How long the check of a replica's port waits for the connection.
pub const CONNECT_CHECK_TIMEOUT_MS: u64 = 200;
/// The account id a probe looks up: any id will do, the answer is what counts.
const PROBE_ACCOUNT_ID: u128 = 1;

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
struct Live {
    client: Arc<tb::Client>,
    /// Set once the client is replaced: requests waiting on it stop waiting.
    retired: watch::Sender<bool>,
    /// Requests outstanding on this client.
    outstanding: AtomicUsize,
    /// When this client last answered or, idle before, was given a request
    /// (ms since the pool opened): a busy client that has not moved since
    /// [`STALL_MS`] is stalled.
    moved_ms: AtomicU64,
}

impl Live {
    fn new(client: tb::Client) -> Arc<Self> {
        Arc::new(Self {
            client: Arc::new(client),
            retired: watch::Sender::new(false),
            outstanding: AtomicUsize::new(0),
            moved_ms: AtomicU64::new(0),
        })
    }

    fn stalled(&self, now_ms: u64) -> bool {
        self.outstanding.load(Ordering::Acquire) > 0
            && now_ms.saturating_sub(self.moved_ms.load(Ordering::Acquire)) >= STALL_MS
    }
}

/// Counts a request outstanding on a client while it lives, whether it ends
/// with an answer or is dropped.
struct Outstanding<'a> {
    live: &'a Live,
    pool: &'a ClientPool,
}

impl<'a> Outstanding<'a> {
    fn begin(live: &'a Live, pool: &'a ClientPool) -> Self {
        if live.outstanding.fetch_add(1, Ordering::AcqRel) == 0 {
            live.moved_ms.store(pool.now_ms(), Ordering::Release);
        }
        Self { live, pool }
    }

    fn answered(&self) {
        self.live.moved_ms.store(self.pool.now_ms(), Ordering::Release);
    }
}

impl Drop for Outstanding<'_> {
    fn drop(&mut self) {
        self.live.outstanding.fetch_sub(1, Ordering::AcqRel);
    }
}

/// One client session.
struct Session {
    /// Replaced when the cluster evicts the session (an evicted client answers
    /// nothing again), or when the watchdog finds it stalled while a fresh
    /// client is answered.
    live: RwLock<Arc<Live>>,
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
    /// Sessions replaced by the watchdog after a stall (a metric).
    replaced: AtomicU64,
    /// Probe clients the watchdog opened (a metric).
    probes: AtomicU64,
    /// Requests run on the sessions (a metric).
    requests: AtomicU64,
    /// The next session to use, round robin.
    next: AtomicUsize,
    /// The origin of the pool's millisecond clock.
    opened: Instant,
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
    live: Arc<Live>,
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
                    live: RwLock::new(Live::new(client)),
                })
            })
            .collect::<Result<Vec<_>, PoolError>>()?;
        Ok(Self {
            sessions,
            slots: Arc::new(Semaphore::new(slots)),
            slots_max: slots,
            renewed: AtomicU64::new(0),
            replaced: AtomicU64::new(0),
            probes: AtomicU64::new(0),
            requests: AtomicU64::new(0),
            next: AtomicUsize::new(0),
            opened: Instant::now(),
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

    /// Sessions replaced so far by the watchdog, after a stall, once a fresh
    /// client was answered.
    pub fn sessions_replaced(&self) -> u64 {
        self.replaced.load(Ordering::Relaxed)
    }

    /// Probe clients the watchdog opened so far (each one request).
    pub fn probes(&self) -> u64 {
        self.probes.load(Ordering::Relaxed)
    }

    /// Requests run on the sessions so far, of every kind (probes aside).
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }

    /// True while some session has had a request unanswered for [`STALL_MS`]:
    /// the cluster is unreachable, or far slower than it should be.
    pub fn stalled(&self) -> bool {
        let now = self.now_ms();
        self.sessions.iter().any(|s| self.live(s).stalled(now))
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
        Slot {
            permit,
            live: self.live(&self.sessions[session]),
            session,
        }
    }

    fn live(&self, session: &Session) -> Arc<Live> {
        session.live.read().expect("session lock poisoned").clone()
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.opened.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Puts `client` in place of `session`'s client if that is still `old`, and
    /// retires the old one: the requests waiting on it end, and the client
    /// library closes it once the last of them has let go of it.
    fn replace(&self, session: usize, old: &Arc<Live>, client: tb::Client) -> bool {
        let previous = {
            let mut guard = self.sessions[session].live.write().expect("session lock poisoned");
            // Another request may have replaced it already.
            if !Arc::ptr_eq(&guard, old) {
                return false;
            }
            std::mem::replace(&mut *guard, Live::new(client))
        };
        previous.retired.send_replace(true);
        true
    }

    /// Replaces the client of `session` after the cluster evicted it.
    fn renew(&self, session: usize, evicted: &Arc<Live>) {
        match new_client(self.cluster_id, &self.addresses) {
            Ok(client) => {
                if self.replace(session, evicted, client) {
                    self.renewed.fetch_add(1, Ordering::Relaxed);
                }
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
    /// long that takes, or until the watchdog replaces the session; reopens the
    /// session when the cluster evicted it.
    pub async fn execute<T, F, Fut>(self: Arc<Self>, slot: Slot, op: F) -> Result<T, PoolError>
    where
        F: FnOnce(Arc<tb::Client>) -> Fut,
        Fut: Future<Output = Result<T, tb::error::SendError>>,
    {
        let Slot { permit, live, session } = slot;
        // A slot taken before its session was replaced goes to the new client.
        let live = if *live.retired.borrow() {
            self.live(&self.sessions[session])
        } else {
            live
        };
        self.requests.fetch_add(1, Ordering::Relaxed);
        let mut retired = live.retired.subscribe();
        let outstanding = Outstanding::begin(&live, &self);
        let result = tokio::select! {
            result = op(Arc::clone(&live.client)) => result,
            _ = retired.wait_for(|retired| *retired) => {
                drop(outstanding);
                drop(permit);
                return Err(PoolError::Client("the session was replaced before it answered".to_owned()));
            }
        };
        outstanding.answered();
        drop(outstanding);
        if let Err(e) = &result {
            if matches!(e.kind(), tb::error::SendErrorKind::ClientEvicted) {
                self.renew(session, &live);
            }
        }
        drop(permit);
        result.map_err(|e| PoolError::Client(e.to_string()))
    }

    /// Starts the watchdog (see the module's documentation); it ends when the
    /// pool is dropped.
    pub fn start_watchdog(self: &Arc<Self>) -> tokio::task::JoinHandle<()> {
        let pool = Arc::downgrade(self);
        tokio::spawn(watch_sessions(pool))
    }

    /// The sessions stalled now, with their clients.
    fn stalled_sessions(&self) -> Vec<(usize, Arc<Live>)> {
        let now = self.now_ms();
        (self.sessions.iter().enumerate())
            .map(|(i, s)| (i, self.live(s)))
            .filter(|(_, live)| live.stalled(now))
            .collect()
    }

    /// The replica addresses as socket addresses (a bare port is loopback, as
    /// for the client library).
    fn socket_addresses(&self) -> Vec<SocketAddr> {
        self.addresses
            .split(',')
            .filter_map(|a| {
                let a = if a.bytes().all(|b| b.is_ascii_digit()) {
                    format!("127.0.0.1:{a}")
                } else {
                    a.to_owned()
                };
                a.to_socket_addrs().ok()?.next()
            })
            .collect()
    }
}

/// A fresh client whose lookup is on its way.
struct Probe {
    client: Arc<tb::Client>,
    /// The lookup's outcome: true when the cluster answered.
    answer: tokio::sync::oneshot::Receiver<bool>,
    /// The task sending the lookup, aborted when the probe is dropped, so that
    /// it lets go of the client, which then closes.
    task: tokio::task::JoinHandle<()>,
    started: Instant,
}

impl Drop for Probe {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The watchdog's loop: nothing to do while no session is stalled.
async fn watch_sessions(pool: Weak<ClientPool>) {
    let mut ticks = tokio::time::interval(Duration::from_millis(WATCH_INTERVAL_MS));
    ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut probes: Vec<Probe> = Vec::new();
    loop {
        ticks.tick().await;
        let Some(pool) = pool.upgrade() else {
            return;
        };
        let stalled = pool.stalled_sessions();
        if stalled.is_empty() {
            probes.clear();
            continue;
        }
        let mut answered = Vec::new();
        probes.retain_mut(|probe| match probe.answer.try_recv() {
            Ok(true) => {
                answered.push(Arc::clone(&probe.client));
                false
            }
            Ok(false) | Err(tokio::sync::oneshot::error::TryRecvError::Closed) => false,
            Err(tokio::sync::oneshot::error::TryRecvError::Empty) => {
                probe.started.elapsed() < Duration::from_millis(PROBE_TIMEOUT_MS)
            }
        });
        if !answered.is_empty() {
            pool.replace_stalled(answered, stalled);
            continue;
        }
        if probes.len() < PROBES_MAX {
            probes.extend(pool.start_probe().await);
        }
    }
}

impl ClientPool {
    /// Opens a probe client when some replica accepts connections; none while
    /// every port refuses (opening clients then would only spin threads).
    async fn start_probe(&self) -> Option<Probe> {
        if !self.some_replica_listens().await {
            return None;
        }
        let client = Arc::new(
            new_client(self.cluster_id, &self.addresses)
                .inspect_err(|e| tracing::error!(error = %e, "cannot open a probe session"))
                .ok()?,
        );
        self.probes.fetch_add(1, Ordering::Relaxed);
        let (tell, answer) = tokio::sync::oneshot::channel();
        let asking = Arc::clone(&client);
        let task = tokio::spawn(async move {
            let answered = asking.lookup_accounts(vec![PROBE_ACCOUNT_ID]).await.is_ok();
            drop(asking);
            let _ = tell.send(answered);
        });
        Some(Probe {
            client,
            answer,
            task,
            started: Instant::now(),
        })
    }

    /// True when a connection to some replica's port succeeds now.
    async fn some_replica_listens(&self) -> bool {
        let addresses = self.socket_addresses();
        let checks = addresses.into_iter().map(|address| {
            tokio::task::spawn_blocking(move || {
                TcpStream::connect_timeout(&address, Duration::from_millis(CONNECT_CHECK_TIMEOUT_MS)).is_ok()
            })
        });
        for check in checks.collect::<Vec<_>>() {
            if check.await.unwrap_or(false) {
                return true;
            }
        }
        false
    }

    /// Replaces stalled sessions by the clients of answered probes, which are
    /// registered already: one each, in order; a session left over waits for
    /// the next answered probe.
    fn replace_stalled(&self, answered: Vec<Arc<tb::Client>>, stalled: Vec<(usize, Arc<Live>)>) {
        for (client, (session, old)) in answered.into_iter().zip(stalled) {
            // The probe's task has let go of its client by the time it answers.
            let Some(client) = Arc::into_inner(client) else {
                continue;
            };
            if self.replace(session, &old, client) {
                self.replaced.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(
                    session,
                    "TigerBeetle session stalled while a fresh one is answered: replaced"
                );
            }
        }
    }
}

fn new_client(cluster_id: u128, addresses: &str) -> Result<tb::Client, PoolError> {
    tb::Client::new(cluster_id, addresses).map_err(|e| PoolError::Client(format!("cannot open a session: {e}")))
}
