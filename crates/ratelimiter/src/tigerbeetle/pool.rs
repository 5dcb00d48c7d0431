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
//! it: while a session has had a request unanswered for [`STALL_MS`], it reads
//! the kernel's table of this process's connections to the replicas
//! ([`super::connections`]) to learn what the network does with them (holds
//! them open, or resets and refuses them) and keeps one fresh client open (a
//! probe) that sends a lookup. While the network resets or refuses
//! connections, the probe gives way to a fresh one every
//! [`PROBE_RESET_LIFETIME_MS`], so that one that has not backed off is
//! waiting when the network returns; while it holds them (a black hole, or a
//! slow cluster), the probe stays until answered: its registration is on its
//! way, and closing it would leave that registration to land later as a
//! session nobody uses, and its connection, if a proxy accepted it, held open
//! at the replica, taking one of the bounded connection slots the replica
//! serves every client with. The watchdog opens no connection of its own to
//! look. When a probe is answered the cluster is reachable, and the probe's client, registered already,
//! replaces a stalled session; the requests still waiting on the old client
//! end with an error (outcome unknown, as after a timeout), their slots come
//! free, and the old client is closed. The watchdog reads the table every
//! [`WATCH_INTERVAL_MS`] and wakes at once when the probe is answered. The
//! pool opens at most one client per [`CLIENT_SPACING_MS`] (probes, and
//! sessions reopened after an eviction), so whatever the network does, a
//! server registers at most two sessions a second, holds at most its
//! sessions, one probe and the clients it is closing, and, while the network
//! holds connections, opens none beyond its one probe
//! (docs/tigerbeetle-backend.md, "Sessions", "When the network fails",
//! "Connections").

use std::future::Future;
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock, Weak};
use std::time::{Duration, Instant};

use tigerbeetle_unofficial as tb;
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
use tokio::time::MissedTickBehavior;

use super::config::TigerBeetleConfig;
use super::connections::{ReplicaConnectionCounts, ReplicaConnections};

/// How long a request may stay unanswered before its session counts as
/// stalled: far above a commit's round trip (milliseconds, even under load),
/// and short enough that a balancer hears of an outage within 2 s.
pub const STALL_MS: u64 = 1_000;
/// How often the watchdog looks at the sessions, and reads the table of the
/// connections to the replicas while one is stalled.
pub const WATCH_INTERVAL_MS: u64 = 100;
/// The fewest ms between two clients a pool opens (probes, and sessions
/// reopened after an eviction): whatever the network does, a server
/// registers at most two sessions a second.
pub const CLIENT_SPACING_MS: u64 = 500;
/// How long a probe client lives while the network resets or refuses its
/// connections. Its first answer can come only with its client's first
/// resend of its registration (the first send, made as it opens, finds no
/// connection yet): after twice the client's 300 ms round-trip estimate, 60
/// of its 10 ms ticks, which is 0.6 s on an idle host and was up to 1.4 s on
/// a loaded 2-core one, where those ticks run late (TigerBeetle 0.16,
/// measured). A probe closed before that never resent, and the next starts
/// the count again: with probes given way every 500 ms, the server waited
/// 1.2–2.2 s after resets ended for the first answer, from a probe opened
/// only then. From its first resend on, a probe resends every 600 ms plus a
/// jitter of at most 10 × 2^attempt ms (20, 40, 80 ms for the next three),
/// so at this age its next resend after the network returns comes as soon as
/// a fresh probe's first would; older, its resends back off toward 10 s
/// apart, and it gives way. (Its attempts to connect, if refused, are up to
/// 1 s apart by then, the client library's cap.) Nothing of such a probe
/// reaches a replica, so replacing it costs the cluster nothing.
pub const PROBE_RESET_LIFETIME_MS: u64 = 2_000;
/// How often the watchdog reads the kernel's table of this process's
/// connections to the replicas while no session is stalled, for the metrics
/// (every tick while one is): once a second costs nothing measurable.
pub const CONNECTIONS_READ_INTERVAL_MS: u64 = 1_000;
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
    /// Counts the client among the pool's open clients while it lives.
    _open: OpenClient,
}

impl Live {
    fn new(client: tb::Client, open: &Arc<AtomicUsize>) -> Arc<Self> {
        Arc::new(Self {
            client: Arc::new(client),
            retired: watch::Sender::new(false),
            outstanding: AtomicUsize::new(0),
            moved_ms: AtomicU64::new(0),
            _open: OpenClient::new(open),
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
    /// Clients open now: sessions, the probe, and replaced ones still closing.
    clients_open: Arc<AtomicUsize>,
    /// Probes open now (0 or 1).
    probes_open: AtomicUsize,
    /// When the pool last opened a client (ms of its clock), to space them by
    /// [`CLIENT_SPACING_MS`]; `u64::MAX` before the first after the sessions.
    client_opened_ms: AtomicU64,
    /// The connections this process holds to each replica, from the kernel.
    connections: ReplicaConnections,
    /// Whether the last reading of those found a connection held open.
    network_holds: AtomicBool,
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
        let clients_open = Arc::new(AtomicUsize::new(0));
        let sessions = (0..config.fields().sessions)
            .map(|_| {
                let client = new_client(config.cluster_id(), &addresses)?;
                Ok(Session {
                    live: RwLock::new(Live::new(client, &clients_open)),
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
            clients_open,
            probes_open: AtomicUsize::new(0),
            client_opened_ms: AtomicU64::new(u64::MAX),
            connections: ReplicaConnections::new(&socket_addresses(&addresses)),
            network_holds: AtomicBool::new(false),
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

    /// Clients open now: the sessions, a probe while one is open, and replaced
    /// clients still closing. Bounded by the sessions plus two whatever the
    /// network does.
    pub fn clients_open(&self) -> usize {
        self.clients_open.load(Ordering::Relaxed)
    }

    /// Probes open now (at most one).
    pub fn probes_open(&self) -> usize {
        self.probes_open.load(Ordering::Relaxed)
    }

    /// The connections this process holds to each replica, as of the
    /// watchdog's last reading of the kernel's table (every
    /// [`WATCH_INTERVAL_MS`] while a session is stalled, every
    /// [`CONNECTIONS_READ_INTERVAL_MS`] otherwise).
    pub fn replica_connections(&self) -> Vec<ReplicaConnectionCounts> {
        self.connections.counts()
    }

    /// Why the pool cannot serve now, in words for an operator (`/healthz`):
    /// which session has been stalled and how long, what the network does
    /// with the connections, the probe and the connections open. `None`
    /// while no session is stalled.
    pub fn stall_reason(&self) -> Option<String> {
        let now = self.now_ms();
        let stalled_ms = (self.sessions.iter())
            .map(|s| self.live(s))
            .filter(|live| live.stalled(now))
            .map(|live| now.saturating_sub(live.moved_ms.load(Ordering::Acquire)))
            .max()?;
        let network = if self.network_holds.load(Ordering::Relaxed) {
            "holds its connections open without an answer (a black hole, a proxy cut from the replicas, or a slow cluster)"
        } else {
            "resets or refuses its connections"
        };
        let open: u64 = self.connections.counts().iter().map(|c| c.open).sum();
        Some(format!(
            "a TigerBeetle session has had a request unanswered for {stalled_ms} ms; the network {network}; \
             {} probe session open, {open} connections open to the replicas",
            self.probes_open()
        ))
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
            std::mem::replace(&mut *guard, Live::new(client, &self.clients_open))
        };
        previous.retired.send_replace(true);
        true
    }

    /// Takes the right to open a client now: true when [`CLIENT_SPACING_MS`]
    /// have passed since the pool last opened one (or it opened none yet), and
    /// no one else took it meanwhile.
    fn claim_client_open(&self) -> bool {
        let last = self.client_opened_ms.load(Ordering::Acquire);
        let now = self.now_ms();
        if last != u64::MAX && now.saturating_sub(last) < CLIENT_SPACING_MS {
            return false;
        }
        (self.client_opened_ms)
            .compare_exchange(last, now, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// Replaces the client of `session` after the cluster evicted it, no
    /// sooner than [`CLIENT_SPACING_MS`] after the pool's last new client: a
    /// replica that evicts sessions as fast as they register (more sessions
    /// than it serves, across a fleet) is not answered by a storm of
    /// registrations that would evict other servers' sessions in turn.
    async fn renew(&self, session: usize, evicted: &Arc<Live>) {
        loop {
            // Replaced meanwhile (by another request's renewal, or the watchdog).
            if !Arc::ptr_eq(&self.live(&self.sessions[session]), evicted) {
                return;
            }
            if self.claim_client_open() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(CLIENT_SPACING_MS / 5)).await;
        }
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
                self.renew(session, &live).await;
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
}

/// The replica addresses as socket addresses (a bare port is loopback, as for
/// the client library).
fn socket_addresses(addresses: &str) -> Vec<SocketAddr> {
    addresses
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

/// A fresh client whose lookup is on its way.
struct Probe {
    client: Arc<tb::Client>,
    /// The lookup's outcome: true when the cluster answered.
    answer: tokio::sync::oneshot::Receiver<bool>,
    /// The task sending the lookup, aborted when the probe is dropped, so that
    /// it lets go of the client, which then closes.
    task: tokio::task::JoinHandle<()>,
    started: Instant,
    /// How long readings found the network resetting or refusing connections
    /// while this probe was open: its client backs off with every failed
    /// attempt.
    reset_for: Duration,
    /// When the watchdog last judged it (see [`Watch::judge`]).
    judged: Instant,
    /// Counts the probe among the open clients while it lives.
    _open: OpenClient,
}

impl Drop for Probe {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// What the watchdog keeps between its ticks.
#[derive(Default)]
struct Watch {
    /// The one probe open, if any.
    probe: Option<Probe>,
}

impl Watch {
    /// Decides whether the probe open may stay, given whether the network
    /// holds connections open: a probe whose connections are reset or refused
    /// closes after [`PROBE_RESET_LIFETIME_MS`] (nothing of it reached a
    /// replica, and its client has backed off); a probe held open stays until
    /// it is answered, since its registration is on its way, and closing it
    /// would leave that registration to land later as a session nobody uses
    /// and its connection held open at the replica by whatever holds the
    /// network (the client library reconnects by itself if that connection
    /// fails). A probe that met resets for as long as a reset probe lives has
    /// backed off: when the network holds connections again it gives way to a
    /// fresh one. The time between two readings counts as met resets when
    /// the second finds none held (a slow reading counts for what it took).
    /// A probe held for as long has backed off too: when a connection of ours
    /// closes while the network holds (`closed`; a black hole passes no
    /// close, so one that arrives means bytes flow again, from a replica
    /// restarted behind it, say), it gives way to a fresh one, whose
    /// registration goes out on a live connection, instead of waiting out its
    /// backoff if the replica dropped its registration.
    fn judge(&mut self, held: bool, closed: bool) {
        let Some(probe) = &mut self.probe else {
            return;
        };
        let now = Instant::now();
        if !held {
            probe.reset_for += now.saturating_duration_since(probe.judged);
        }
        probe.judged = now;
        if !probe_may_stay(held, closed, probe.reset_for, probe.started.elapsed()) {
            self.probe = None;
        }
    }

    /// Waits for the next tick, or for the open probe's answer if it comes
    /// first: `Some(true)` when the cluster answered it, `Some(false)` when
    /// its client failed (evicted, shut down), `None` at a tick.
    async fn next_answer_or_tick(&mut self, ticks: &mut tokio::time::Interval) -> Option<bool> {
        let Some(probe) = &mut self.probe else {
            ticks.tick().await;
            return None;
        };
        tokio::select! {
            _ = ticks.tick() => None,
            answer = &mut probe.answer => Some(answer.unwrap_or(false)),
        }
    }
}

/// Whether a probe of age `age` stays open when the network holds
/// connections open (`held`) or not, given whether a connection of ours
/// closed since the last reading (`closed`) and how long the probe met resets
/// while open (`reset_for`; see [`Watch::judge`]).
fn probe_may_stay(held: bool, closed: bool, reset_for: Duration, age: Duration) -> bool {
    let lifetime = Duration::from_millis(PROBE_RESET_LIFETIME_MS);
    if held {
        reset_for < lifetime && (!closed || age < lifetime)
    } else {
        age < lifetime
    }
}

/// The watchdog's loop: nothing to do while no session is stalled but read
/// the table of connections once in a while, for the metrics. While a probe
/// is open it wakes as soon as the probe is answered, not at its next tick,
/// and puts the probe's client in place of a stalled session at once.
async fn watch_sessions(pool: Weak<ClientPool>) {
    let mut ticks = tokio::time::interval(Duration::from_millis(WATCH_INTERVAL_MS));
    ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut watch = Watch::default();
    let mut last_read = Instant::now();
    loop {
        let answered = watch.next_answer_or_tick(&mut ticks).await;
        let Some(pool) = pool.upgrade() else {
            return;
        };
        let stalled = pool.stalled_sessions();
        if stalled.is_empty() {
            watch = Watch::default();
            pool.probes_open.store(0, Ordering::Relaxed);
            if last_read.elapsed() >= Duration::from_millis(CONNECTIONS_READ_INTERVAL_MS) {
                last_read = Instant::now();
                pool.network_holds
                    .store(pool.connections.read(false).held, Ordering::Relaxed);
            }
            continue;
        }
        match answered {
            Some(true) => {
                let probe = watch.probe.take().expect("an answered probe");
                pool.replace_stalled(probe, stalled);
                pool.probes_open.store(0, Ordering::Relaxed);
                continue;
            }
            // Evicted or shut down: the next probe waits for its turn.
            Some(false) => watch.probe = None,
            None => {}
        }
        last_read = Instant::now();
        let reading = pool.connections.read(true);
        pool.network_holds.store(reading.held, Ordering::Relaxed);
        watch.judge(reading.held, reading.closed > 0);
        if watch.probe.is_none() && pool.claim_client_open() {
            watch.probe = pool.start_probe();
        }
        pool.probes_open
            .store(usize::from(watch.probe.is_some()), Ordering::Relaxed);
    }
}

impl ClientPool {
    /// Opens a probe client: a fresh session that sends one lookup.
    fn start_probe(&self) -> Option<Probe> {
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
            reset_for: Duration::ZERO,
            judged: Instant::now(),
            _open: OpenClient::new(&self.clients_open),
        })
    }

    /// Replaces one stalled session by the client of an answered probe, which
    /// is registered already; other stalled sessions wait for the next probe.
    fn replace_stalled(&self, probe: Probe, stalled: Vec<(usize, Arc<Live>)>) {
        let client = Arc::clone(&probe.client);
        drop(probe);
        // The probe's task has let go of its client by the time it answers.
        let Some(client) = Arc::into_inner(client) else {
            return;
        };
        let Some((session, old)) = stalled.into_iter().next() else {
            return;
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

/// Counts one open client in a pool's gauge while it lives.
struct OpenClient(Arc<AtomicUsize>);

impl OpenClient {
    fn new(open: &Arc<AtomicUsize>) -> Self {
        open.fetch_add(1, Ordering::Relaxed);
        Self(Arc::clone(open))
    }
}

impl Drop for OpenClient {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

fn new_client(cluster_id: u128, addresses: &str) -> Result<tb::Client, PoolError> {
    tb::Client::new(cluster_id, addresses).map_err(|e| PoolError::Client(format!("cannot open a session: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_held_probe_stays_until_answered_and_a_reset_one_gives_way_once_backed_off() {
        let lifetime = Duration::from_millis(PROBE_RESET_LIFETIME_MS);
        let young = lifetime - Duration::from_millis(1);
        let none = Duration::ZERO;
        // Past its first resend even where the client's ticks run late.
        assert!(probe_may_stay(false, false, none, Duration::from_millis(1_400)));
        assert!(probe_may_stay(false, false, young, young));
        assert!(
            !probe_may_stay(false, false, young, lifetime),
            "a reset probe has backed off"
        );
        // Held: its registration is on its way; closing it would leave the
        // registration to land as a session nobody uses, and its connection
        // held open at the replica.
        assert!(probe_may_stay(true, false, none, Duration::from_secs(3_600)));
        assert!(probe_may_stay(true, false, young, lifetime));
        // Held after resets for as long as a reset probe lives: backed off.
        assert!(!probe_may_stay(true, false, lifetime, lifetime));
        // Held and backed off while a connection closed: bytes flow again.
        assert!(!probe_may_stay(true, true, none, lifetime));
        assert!(
            probe_may_stay(true, true, none, young),
            "a young held probe resends soon"
        );
    }
}
