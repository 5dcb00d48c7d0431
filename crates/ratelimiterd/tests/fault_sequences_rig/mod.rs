//! The rig of tests/reliability_fault_sequences.rs: a server cut from its replica
//! by the test's proxy and one that reaches it directly, the clients that reserve
//! and complete on them all along, the [`Step`]s of a sequence of faults, and what
//! is sampled while the network is cut and measured when it returns.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use ratelimiter::tigerbeetle::LocalCluster;
use ratelimiter::LeaseId;
use serde_json::{json, Value};

use crate::support::proxy::{Mode, Proxy};
use crate::support::{raw, sockets, Daemon, ADMIN_TOKEN, CLIENT_TOKEN};

/// The account the reference session looks up (none need exist: any answer
/// will do).
const REFERENCE_ACCOUNT_ID: u128 = 1;
/// How long the test waits for a grant before it records none.
pub const RECOVERY_WAIT: Duration = Duration::from_secs(15);
/// How often the server's bounds are sampled while it is cut off.
const SAMPLE_EVERY: Duration = Duration::from_millis(200);
/// How often the sockets and the server's clients are printed.
const TRACE_EVERY: Duration = Duration::from_secs(1);

/// One step of a sequence.
#[derive(Debug, Clone, Copy)]
pub enum Step {
    /// The proxy does this for so long.
    Net(Mode, Duration),
    /// The replica is killed (SIGKILL); the network stays as it was.
    KillReplica,
    /// The replica starts again on its data; the network stays as it was.
    StartReplica,
    /// The network returns: the server must grant again soon.
    Heal,
}

/// One request to `server` with the token its path needs: the status and the JSON body.
pub fn call(server: &Daemon, method: &str, path: &str, body: Option<&Value>) -> (u16, Value) {
    let token = if path.starts_with("/v1/admin") {
        ADMIN_TOKEN
    } else {
        CLIENT_TOKEN
    };
    let body = body.map(Value::to_string).unwrap_or_default();
    let answer = raw::request(server.addr, method, path, Some(token), body.as_bytes());
    (answer.status, answer.value())
}

/// The value of the metric `name` on `server`, if it exports it.
pub fn metric(server: &Daemon, name: &str) -> Option<u64> {
    let answer = raw::request(server.addr, "GET", "/metrics", None, b"");
    let text = answer.text();
    text.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

/// The sum of the series of the labeled metric `name` on `server` (0 when
/// it exports none).
pub fn metric_sum(server: &Daemon, name: &str) -> u64 {
    let answer = raw::request(server.addr, "GET", "/metrics", None, b"");
    let text = answer.text();
    text.lines()
        .filter_map(|line| line.strip_prefix(name)?.strip_prefix('{'))
        .filter_map(|rest| rest.rsplit_once(' ')?.1.trim().parse::<u64>().ok())
        .sum()
}

/// What the clients of one server saw.
#[derive(Debug, Default)]
pub struct Seen {
    pub granted: u64,
    pub unavailable: u64,
    pub other: Vec<(u16, Value)>,
    pub last_grant: Option<Instant>,
}

/// Reserves on both limits and completes once on `server`; true when granted.
pub fn reserve_and_complete(server: &Daemon, keys: &[String; 2], seen: &Mutex<Seen>) -> bool {
    let lease = LeaseId::generate().to_string();
    let body = json!({"lease_id": lease, "requirements": [
        {"key": keys[0], "amount": 1}, {"key": keys[1], "amount": 10}]});
    let (status, answer) = call(server, "POST", "/v1/reserve", Some(&body));
    if status == 503 || answer["allowed"] == json!(true) {
        let (done, answer) = call(server, "POST", "/v1/complete", Some(&json!({"lease_id": lease})));
        assert!(done == 200 || done == 503, "complete: {done} {answer}");
    }
    let mut seen = seen.lock().unwrap();
    match (status, answer["allowed"].as_bool()) {
        (200, Some(true)) => {
            seen.granted += 1;
            seen.last_grant = Some(Instant::now());
            return true;
        }
        (503, _) => seen.unavailable += 1,
        _ => seen.other.push((status, answer)),
    }
    false
}

/// Reserves and completes on `server` back to back until `stop`; a call
/// answered 503 is made again on `fallback`, as a client of a fleet fails over.
pub fn client(rig: &Rig, server: &Daemon, fallback: Option<(&Daemon, &Mutex<Seen>)>, seen: &Mutex<Seen>) {
    while !rig.stop.load(Ordering::Acquire) {
        if reserve_and_complete(server, &rig.keys, seen) {
            continue;
        }
        match fallback {
            Some((other, other_seen)) => {
                reserve_and_complete(other, &rig.keys, other_seen);
            }
            None => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

/// The most of each bound seen while the server was cut off.
#[derive(Debug, Default, Clone, Copy)]
pub struct Bounds {
    pub queue_depth: u64,
    pub outstanding: u64,
    pub clients_open: u64,
    pub probes_open: u64,
    /// Probes opened while the network held connections (black holes), each
    /// a registration that lands once the network passes, and how long.
    pub held_probes: u64,
    /// Connections the black holes held (each one the replica accepts, one
    /// per 10 ms tick, once the network passes).
    pub held_connections: u64,
    pub held_for: Duration,
    /// Connections the proxied server held to the replica's address (the
    /// proxy), as the kernel counts them.
    pub server_connections: u64,
    /// Connections on the replica's port (accepted or queued, both servers').
    pub replica_connections: u64,
    /// The replica's accept queue.
    pub accept_queue: u64,
}

impl Bounds {
    fn sample(&mut self, rig: &Rig, mode: Mode, since: Instant) {
        let server = &rig.proxied;
        let read = |name| metric(server, name).unwrap_or(0);
        let replica = sockets::on_port(rig.replica_port);
        let held = sockets::clients_of(rig.proxy.addr.port());
        self.server_connections = self.server_connections.max(held);
        self.replica_connections = self.replica_connections.max(replica.connections);
        self.accept_queue = self.accept_queue.max(replica.accept_queue);
        if rig.trace_at.lock().unwrap().elapsed() >= TRACE_EVERY {
            *rig.trace_at.lock().unwrap() = Instant::now();
            println!(
                "  {mode:?} +{:.1} s: server's connections {held} (its metric: {}); replica's {} ({} closed by peer), \
                 accept queue {}; clients open {}, probes open {}, probes {}, replaced {}",
                since.elapsed().as_secs_f64(),
                metric_sum(server, "ratelimiterd_tigerbeetle_replica_connections_open"),
                replica.connections,
                replica.closed_by_peer,
                replica.accept_queue,
                read("ratelimiterd_tigerbeetle_clients_open"),
                read("ratelimiterd_tigerbeetle_probes_open"),
                read("ratelimiterd_tigerbeetle_session_probes_total"),
                read("ratelimiterd_tigerbeetle_sessions_replaced_total"),
            );
        }
        self.queue_depth = self.queue_depth.max(read("ratelimiterd_tigerbeetle_queue_depth"));
        self.outstanding = (self.outstanding).max(read("ratelimiterd_tigerbeetle_requests_outstanding"));
        self.clients_open = (self.clients_open).max(read("ratelimiterd_tigerbeetle_clients_open"));
        self.probes_open = (self.probes_open).max(read("ratelimiterd_tigerbeetle_probes_open"));
    }
}

/// The two servers, their clients' views, and the replica behind the proxy.
pub struct Rig {
    pub cluster: LocalCluster,
    pub proxy: Proxy,
    pub proxied: Daemon,
    pub direct: Daemon,
    pub seen: Mutex<Seen>,
    pub seen_direct: Mutex<Seen>,
    pub stop: AtomicBool,
    pub keys: [String; 2],
    /// The replica's port, whose connections and accept queue are sampled.
    pub replica_port: u16,
    /// When the sockets were last printed.
    pub trace_at: Mutex<Instant>,
}

/// One recovery: how long after the network's return the first grant and
/// `/healthz` 200 came.
#[derive(Debug)]
pub struct Recovery {
    pub sequence: &'static str,
    pub after: String,
    pub first_grant: Option<Duration>,
    pub healthy: Option<Duration>,
    /// When the replica's accept queue was first empty after the return.
    pub queue_drained: Option<Duration>,
    /// How long a fresh session opened straight to the replica as the network
    /// returned took to be answered: the reference of the recovery bound's stretch.
    pub fresh_session: Option<Duration>,
    pub bounds: Bounds,
}

impl Rig {
    /// Runs `steps`; returns the recovery measured at each `Heal`.
    pub fn run(&self, sequence: &'static str, steps: &[Step]) -> Vec<Recovery> {
        let mut recoveries = Vec::new();
        let mut bounds = Bounds::default();
        let mut done = Vec::new();
        for step in steps {
            match *step {
                Step::Net(mode, length) => {
                    let probes = || metric(&self.proxied, "ratelimiterd_tigerbeetle_session_probes_total").unwrap_or(0);
                    let probes_before = probes();
                    let accepted_before = self.proxy.accepted();
                    self.proxy.set(mode);
                    let since = Instant::now();
                    let until = since + length;
                    while Instant::now() < until {
                        bounds.sample(self, mode, since);
                        std::thread::sleep(SAMPLE_EVERY.min(until.saturating_duration_since(Instant::now())));
                    }
                    if matches!(mode, Mode::BlackHole | Mode::AcceptHold) {
                        bounds.held_probes += probes() - probes_before;
                        bounds.held_connections += self.proxy.accepted() - accepted_before;
                        bounds.held_for += length;
                    }
                }
                Step::KillReplica => self.cluster.kill().expect("kill the replica"),
                Step::StartReplica => self.cluster.start_again().expect("restart the replica"),
                Step::Heal => {
                    let (first_grant, healthy, queue_drained, fresh_session) = self.heal();
                    recoveries.push(Recovery {
                        sequence,
                        after: done.join(", "),
                        first_grant,
                        healthy,
                        queue_drained,
                        fresh_session,
                        bounds,
                    });
                    bounds = Bounds::default();
                    done.clear();
                    continue;
                }
            }
            done.push(describe(step));
        }
        recoveries
    }

    /// Lets the traffic through and waits for the first grant after it, for
    /// `/healthz` 200 and for the replica's accept queue to be empty; times a
    /// fresh session of its own meanwhile ([`fresh_session_answer`]).
    fn heal(&self) -> (Option<Duration>, Option<Duration>, Option<Duration>, Option<Duration>) {
        self.proxy.set(Mode::Forward);
        let returned = Instant::now();
        let address = self.cluster.address().to_owned();
        let reference = std::thread::spawn(move || fresh_session_answer(&address));
        let mut healthy = None;
        let mut first_grant = None;
        let mut queue_drained = None;
        while returned.elapsed() < RECOVERY_WAIT
            && (first_grant.is_none() || healthy.is_none() || queue_drained.is_none())
        {
            if queue_drained.is_none() && sockets::on_port(self.replica_port).accept_queue == 0 {
                queue_drained = Some(returned.elapsed());
            }
            if first_grant.is_none() && (self.seen.lock().unwrap().last_grant).is_some_and(|at| at > returned) {
                first_grant = Some(returned.elapsed());
            }
            if healthy.is_none() && call(&self.proxied, "GET", "/healthz", None).0 == 200 {
                healthy = Some(returned.elapsed());
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        // The time of the first grant, not of the poll that saw it.
        let first_grant = first_grant.and_then(|_| {
            let seen = self.seen.lock().unwrap();
            seen.last_grant.map(|at| at.saturating_duration_since(returned))
        });
        let fresh_session = reference.join().expect("the reference session's thread");
        let replica = sockets::on_port(self.replica_port);
        println!(
            "  healed: first grant {first_grant:?}, /healthz 200 {healthy:?}, accept queue empty {queue_drained:?}, \
             a fresh session answered {fresh_session:?}; then the replica's connections {}, accept queue {}",
            replica.connections, replica.accept_queue
        );
        (first_grant, healthy, queue_drained, fresh_session)
    }
}

/// How long a fresh session of the test's own, opened straight to the replica
/// (not through the proxy) now, takes to be answered; `None` when it is not
/// within [`RECOVERY_WAIT`]. On an idle machine the test's `FRESH_SESSION_IDLE`; later
/// as the replica and the clients' ticks run late.
pub fn fresh_session_answer(address: &str) -> Option<Duration> {
    let opened = Instant::now();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("a runtime for the reference session");
    runtime.block_on(async {
        let client = ratelimiter::tigerbeetle::client::Client::new(0, address).ok()?;
        let lookup = client.lookup_accounts(vec![REFERENCE_ACCOUNT_ID]);
        tokio::time::timeout(RECOVERY_WAIT, lookup).await.ok()?.ok()?;
        Some(opened.elapsed())
    })
}

/// A step, as the report names it.
pub fn describe(step: &Step) -> String {
    match step {
        Step::Net(mode, length) => format!("{mode:?} {:.1} s", length.as_secs_f64()),
        Step::KillReplica => "replica killed".to_owned(),
        Step::StartReplica => "replica started".to_owned(),
        Step::Heal => "heal".to_owned(),
    }
}
