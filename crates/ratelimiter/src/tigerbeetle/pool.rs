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
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::MissedTickBehavior;

use super::config::TigerBeetleConfig;
use super::connections::{ReplicaConnectionCounts, ReplicaConnections};
use super::probe::{Probe, Watch};
use super::session::{new_client, Live, Session};

pub use super::probe::PROBE_RESET_LIFETIME_MS;
pub use super::session::{PoolError, STALL_MS};

/// How often the watchdog looks at the sessions, and reads the table of the
/// connections to the replicas while one is stalled.
pub const WATCH_INTERVAL_MS: u64 = 100;
/// The fewest ms between two clients a pool opens (probes, and sessions
/// reopened after an eviction): whatever the network does, a server
/// registers at most two sessions a second.
pub const CLIENT_SPACING_MS: u64 = 500;
/// How often the watchdog reads the kernel's table of this process's
/// connections to the replicas while no session is stalled, for the metrics
/// (every tick while one is): once a second costs nothing measurable.
pub const CONNECTIONS_READ_INTERVAL_MS: u64 = 1_000;
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
    /// Opens a probe client, counted among the pool's probes and open clients.
    fn start_probe(&self) -> Option<Probe> {
        let probe = Probe::start(self.cluster_id, &self.addresses, &self.clients_open)?;
        self.probes.fetch_add(1, Ordering::Relaxed);
        Some(probe)
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
