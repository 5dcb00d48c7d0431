//! Sequences of network faults between a real `ratelimiterd` and its real
//! TigerBeetle replica, through a TCP proxy of the test's own: a long black
//! hole through a proxy that still accepts (and connects each new connection
//! to the replica, passing no byte) and then resets, a long black hole and
//! then a period where every new connection is reset as it is accepted, a
//! reset then a black hole, two resets, and the replica killed and restarted
//! while the network is black-holed. Clients reserve and complete on the
//! server all along (and on a second server that reaches the replica
//! directly). After every fault the network returns, and the test measures how
//! long the server takes to grant again and the replica to empty its accept
//! queue; while it is cut off, the test samples its queue, its requests
//! outstanding, the client sessions it holds open, and with `ss` the
//! connections it holds to the replica and those the replica holds and
//! queues, which must stay within their bounds however long the fault lasts.
//!
//! The figures are printed (`--nocapture`) and kept in RELIABILITY.md. The
//! bound asserted on recovery is the goal with a margin on an idle machine,
//! stretched by how slowly a fresh session of the test's own, opened straight
//! to the replica as the network returns, is answered: the load of the same
//! moment, which no fixed bound can know.

#![cfg(feature = "tigerbeetle")]

mod support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use ratelimiter::tigerbeetle::LocalCluster;
use ratelimiter::LeaseId;
use serde_json::{json, Value};
use support::proxy::{Mode, Proxy};
use support::{raw, sockets, temp_dir, BackendConfig, Daemon, ADMIN_TOKEN, CLIENT_TOKEN};

/// The request timeout of the servers: a call during an outage is answered
/// 503 after it.
const REQUEST_TIMEOUT_MS: u64 = 2_000;
/// Clients reserving and completing back to back on the proxied server, each
/// making a call answered 503 again on the direct server.
const CLIENTS: usize = 12;
/// Clients on the server that reaches the replica directly.
const DIRECT_CLIENTS: usize = 2;
/// Clients that reserve on the proxied server only (a 503 is not made again
/// elsewhere): they keep calling it all through every fault.
const PROXIED_ONLY_CLIENTS: usize = 3;
/// The most connections the proxied server may hold to the replica's address
/// (the proxy) at any moment, and the most the replica may hold that the
/// proxy opened for it: one per client open ([`CLIENTS_OPEN_MAX`]), one port
/// check, and the ones closed a moment ago that the network has not passed
/// on yet.
const SERVER_CONNECTIONS_MAX: u64 = 6;
/// The replica's accept queue must be empty this soon after the network
/// returns: a queue that stays means the replica is not accepting (every
/// connection slot it has is taken).
const ACCEPT_QUEUE_DRAINED_MAX: Duration = RECOVERY_MAX;
/// The goal: the server grants within this long of the network's return.
const RECOVERY_GOAL: Duration = Duration::from_secs(1);
/// The bound asserted on an idle machine: the goal plus a margin (a client's
/// call in flight when the network returns, scheduling). It is stretched by
/// the load measured as the network returns ([`load_stretch`]).
const RECOVERY_MAX: Duration = Duration::from_millis(2_500);
/// How long a fresh TigerBeetle session takes to be first answered on an idle
/// machine: it registers as it opens, before its connection is up, so it is
/// answered when it resends, after twice its 300 ms round-trip estimate, 60
/// ticks of 10 ms (docs/tigerbeetle-backend.md, "When the network fails").
/// The server's recovery waits for such an answer (its probe's), and each of
/// its steps runs on the same ticks; on a loaded machine they all run late.
const FRESH_SESSION_IDLE: Duration = Duration::from_millis(600);
/// The most the load stretches the recovery bounds. A server whose probe had
/// backed off (resends up to TigerBeetle's 10 s `backoff_max` apart) came back
/// 9.6 to 11.7 s after the network (RELIABILITY.md): above the stretched
/// bound (7.5 s) however loaded the machine.
const LOAD_STRETCH_MAX: f64 = 3.0;
/// The account the reference session looks up (none need exist: any answer
/// will do).
const REFERENCE_ACCOUNT_ID: u128 = 1;
/// How long the test waits for a grant before it records none.
const RECOVERY_WAIT: Duration = Duration::from_secs(15);
/// How often the server's bounds are sampled while it is cut off.
const SAMPLE_EVERY: Duration = Duration::from_millis(200);
/// How often the sockets and the server's clients are printed.
const TRACE_EVERY: Duration = Duration::from_secs(1);
/// The most client sessions the proxied server may hold open at any moment:
/// its one session, one probe, and one replaced client still closing.
const CLIENTS_OPEN_MAX: u64 = 3;
/// The most work items queued while cut off: one per call waiting (each
/// client has one reserve or complete out at a time), twice, since a caller
/// that gave up calls again before its item is dropped; an item whose caller
/// gave up must not stay.
const QUEUED_MAX: u64 = 2 * CLIENTS as u64;
/// The most probes the server may open while the network holds its
/// connections (black holes), however long: the one open when the hole
/// began (opened under resets just before) and one more. A held probe stays
/// until answered: every probe closed while held leaves its registration to
/// land once the network passes (a session nobody uses, which may evict
/// another server's) and its connection held at the replica.
const HELD_PROBES_MAX: u64 = 2;
/// The most new connections a black hole may hold for the server, however
/// long: a reconnection of each client open ([`CLIENTS_OPEN_MAX`]) and the
/// probes'. Each one a proxy that accepts during the hole holds open at the
/// replica, taking one of the connection slots it serves every client with
/// (32 on the test's replica), until the network passes.
const HELD_CONNECTIONS_MAX: u64 = CLIENTS_OPEN_MAX + HELD_PROBES_MAX + 1;
/// Names a factor for every fault's length, for a manual run (3.5 makes the
/// first black hole 52 s).
const SCALE_ENV: &str = "FAULT_SEQUENCE_SCALE";
/// Names the start of the names of the sequences to run, for a manual run.
const ONLY_ENV: &str = "FAULT_SEQUENCE_ONLY";
/// Names another request timeout of the servers, in ms (the product's default
/// is 5,000).
const TIMEOUT_ENV: &str = "FAULT_REQUEST_TIMEOUT_MS";
/// When set, the proxy keeps a connection open upstream after its client
/// closed it, as a balancer that passes no half-close on.
const KEEPS_UPSTREAM_ENV: &str = "FAULT_PROXY_KEEPS_UPSTREAM";
/// When set, the replica's log is printed at the end.
const REPLICA_LOG_ENV: &str = "FAULT_REPLICA_LOG";

/// One step of a sequence.
#[derive(Debug, Clone, Copy)]
enum Step {
    /// The proxy does this for so long.
    Net(Mode, Duration),
    /// The replica is killed (SIGKILL); the network stays as it was.
    KillReplica,
    /// The replica starts again on its data; the network stays as it was.
    StartReplica,
    /// The network returns: the server must grant again soon.
    Heal,
}

fn scaled(seconds: f64) -> Duration {
    let scale: f64 = std::env::var(SCALE_ENV)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1.0);
    Duration::from_secs_f64(seconds * scale)
}

fn call(server: &Daemon, method: &str, path: &str, body: Option<&Value>) -> (u16, Value) {
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
fn metric(server: &Daemon, name: &str) -> Option<u64> {
    let answer = raw::request(server.addr, "GET", "/metrics", None, b"");
    let text = answer.text();
    text.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

/// The sum of the series of the labeled metric `name` on `server` (0 when
/// it exports none).
fn metric_sum(server: &Daemon, name: &str) -> u64 {
    let answer = raw::request(server.addr, "GET", "/metrics", None, b"");
    let text = answer.text();
    text.lines()
        .filter_map(|line| line.strip_prefix(name)?.strip_prefix('{'))
        .filter_map(|rest| rest.rsplit_once(' ')?.1.trim().parse::<u64>().ok())
        .sum()
}

/// What the clients of one server saw.
#[derive(Debug, Default)]
struct Seen {
    granted: u64,
    unavailable: u64,
    other: Vec<(u16, Value)>,
    last_grant: Option<Instant>,
}

/// Reserves on both limits and completes once on `server`; true when granted.
fn reserve_and_complete(server: &Daemon, keys: &[String; 2], seen: &Mutex<Seen>) -> bool {
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
fn client(rig: &Rig, server: &Daemon, fallback: Option<(&Daemon, &Mutex<Seen>)>, seen: &Mutex<Seen>) {
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
struct Bounds {
    queue_depth: u64,
    outstanding: u64,
    clients_open: u64,
    probes_open: u64,
    /// Probes opened while the network held connections (black holes), each
    /// a registration that lands once the network passes, and how long.
    held_probes: u64,
    /// Connections the black holes held (each one the replica accepts, one
    /// per 10 ms tick, once the network passes).
    held_connections: u64,
    held_for: Duration,
    /// Connections the proxied server held to the replica's address (the
    /// proxy), as the kernel counts them.
    server_connections: u64,
    /// Connections on the replica's port (accepted or queued, both servers').
    replica_connections: u64,
    /// The replica's accept queue.
    accept_queue: u64,
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
struct Rig {
    cluster: LocalCluster,
    proxy: Proxy,
    proxied: Daemon,
    direct: Daemon,
    seen: Mutex<Seen>,
    seen_direct: Mutex<Seen>,
    stop: AtomicBool,
    keys: [String; 2],
    /// The replica's port, whose connections and accept queue are sampled.
    replica_port: u16,
    /// When the sockets were last printed.
    trace_at: Mutex<Instant>,
}

/// One recovery: how long after the network's return the first grant and
/// `/healthz` 200 came.
#[derive(Debug)]
struct Recovery {
    sequence: &'static str,
    after: String,
    first_grant: Option<Duration>,
    healthy: Option<Duration>,
    /// When the replica's accept queue was first empty after the return.
    queue_drained: Option<Duration>,
    /// How long a fresh session opened straight to the replica as the network
    /// returned took to be answered: the reference of [`load_stretch`].
    fresh_session: Option<Duration>,
    bounds: Bounds,
}

impl Rig {
    /// Runs `steps`; returns the recovery measured at each `Heal`.
    fn run(&self, sequence: &'static str, steps: &[Step]) -> Vec<Recovery> {
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
/// within [`RECOVERY_WAIT`]. On an idle machine [`FRESH_SESSION_IDLE`]; later
/// as the replica and the clients' ticks run late.
fn fresh_session_answer(address: &str) -> Option<Duration> {
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

/// How much the load of the moment stretches a recovery bound: the time a
/// fresh session took to be answered over its time on an idle machine, from 1
/// to [`LOAD_STRETCH_MAX`] (the most when it was not answered at all).
fn load_stretch(fresh_session: Option<Duration>) -> f64 {
    fresh_session.map_or(LOAD_STRETCH_MAX, |answered| {
        (answered.as_secs_f64() / FRESH_SESSION_IDLE.as_secs_f64()).clamp(1.0, LOAD_STRETCH_MAX)
    })
}

fn describe(step: &Step) -> String {
    match step {
        Step::Net(mode, length) => format!("{mode:?} {:.1} s", length.as_secs_f64()),
        Step::KillReplica => "replica killed".to_owned(),
        Step::StartReplica => "replica started".to_owned(),
        Step::Heal => "heal".to_owned(),
    }
}

#[test]
fn a_server_grants_again_soon_after_any_sequence_of_network_faults() {
    let cluster = LocalCluster::start().expect("a local TigerBeetle replica");
    let keeps_upstream = std::env::var_os(KEEPS_UPSTREAM_ENV).is_some();
    let proxy = Proxy::start_with(cluster.address().parse().expect("replica address"), keeps_upstream);
    let timeout_ms: u64 = std::env::var(TIMEOUT_ENV)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(REQUEST_TIMEOUT_MS);
    let settings = format!("  request_timeout_ms: {timeout_ms}\n");
    let proxied_address = proxy.addr.to_string();
    let (dir, dir_direct) = (temp_dir("tb-faults"), temp_dir("tb-faults-direct"));
    let proxied = Daemon::start_on(
        &dir,
        BackendConfig::TigerBeetle {
            addresses: &proxied_address,
            settings: &settings,
        },
        "",
        "",
    );
    let direct = Daemon::start_on(
        &dir_direct,
        BackendConfig::TigerBeetle {
            addresses: cluster.address(),
            settings: &settings,
        },
        "",
        "",
    );
    let replica_port = cluster
        .address()
        .parse::<std::net::SocketAddr>()
        .expect("replica address")
        .port();
    let run = LeaseId::generate();
    let keys = [format!("seq:{run}:inflight"), format!("seq:{run}:tpm")];
    for definition in [
        json!({"key": keys[0], "kind": "concurrency", "capacity": 10_000, "timeout_seconds": 10}),
        json!({"key": keys[1], "kind": "rolling", "capacity": 1_000_000_000u64, "window_seconds": 60}),
    ] {
        assert_eq!(call(&proxied, "PUT", "/v1/admin/limits", Some(&definition)).0, 200);
    }
    let rig = Rig {
        cluster,
        proxy,
        proxied,
        direct,
        seen: Mutex::new(Seen::default()),
        seen_direct: Mutex::new(Seen::default()),
        stop: AtomicBool::new(false),
        keys,
        replica_port,
        trace_at: Mutex::new(Instant::now()),
    };
    let recoveries: Vec<Recovery> = std::thread::scope(|scope| {
        for _ in 0..CLIENTS {
            scope.spawn(|| client(&rig, &rig.proxied, Some((&rig.direct, &rig.seen_direct)), &rig.seen));
        }
        for _ in 0..DIRECT_CLIENTS {
            scope.spawn(|| client(&rig, &rig.direct, None, &rig.seen_direct));
        }
        for _ in 0..PROXIED_ONLY_CLIENTS {
            scope.spawn(|| client(&rig, &rig.proxied, None, &rig.seen));
        }
        std::thread::sleep(Duration::from_millis(500));
        let mut all = Vec::new();
        for (name, steps) in chosen_sequences() {
            all.extend(rig.run(name, &steps));
            // A server that never came back fails every later sequence too.
            if all.iter().any(|r: &Recovery| r.first_grant.is_none()) {
                break;
            }
        }
        rig.stop.store(true, Ordering::Release);
        all
    });
    let log = rig.cluster.log();
    for pattern in [
        "new session",
        "evict",
        "no session",
        "older session",
        "shutdown",
        "set_and_verify_peer",
    ] {
        println!(
            "replica log: {} lines with {pattern:?}",
            log.lines().filter(|l| l.contains(pattern)).count()
        );
    }
    if std::env::var_os(REPLICA_LOG_ENV).is_some() {
        println!("{log}");
    }
    report(&rig, &recoveries);
}

/// The sequences of [`ONLY_ENV`], or all.
fn chosen_sequences() -> Vec<(&'static str, Vec<Step>)> {
    let only = std::env::var(ONLY_ENV).unwrap_or_default();
    (sequences().into_iter())
        .filter(|(name, _)| name.starts_with(&only))
        .collect()
}

/// The sequences, each ended by the network's return.
fn sequences() -> Vec<(&'static str, Vec<Step>)> {
    vec![
        (
            "held connections, then resets",
            vec![
                Step::Net(Mode::Forward, scaled(8.0)),
                Step::Net(Mode::AcceptHold, scaled(15.0)),
                Step::Heal,
                Step::Net(Mode::Forward, scaled(12.0)),
                Step::Net(Mode::Reset, scaled(12.0)),
                Step::Heal,
            ],
        ),
        (
            "black hole, then resets",
            vec![
                Step::Net(Mode::BlackHole, scaled(15.0)),
                Step::Heal,
                Step::Net(Mode::Forward, scaled(12.0)),
                Step::Net(Mode::Reset, scaled(12.0)),
                Step::Heal,
            ],
        ),
        (
            "reset, then black hole",
            vec![
                Step::Net(Mode::Reset, scaled(5.0)),
                Step::Net(Mode::BlackHole, scaled(5.0)),
                Step::Heal,
            ],
        ),
        (
            "two resets",
            vec![
                Step::Net(Mode::Reset, scaled(5.0)),
                Step::Heal,
                Step::Net(Mode::Forward, scaled(3.0)),
                Step::Net(Mode::Reset, scaled(5.0)),
                Step::Heal,
            ],
        ),
        (
            "replica restart during a black hole",
            vec![
                Step::Net(Mode::BlackHole, scaled(3.0)),
                Step::KillReplica,
                Step::Net(Mode::BlackHole, scaled(3.0)),
                Step::StartReplica,
                Step::Net(Mode::BlackHole, scaled(2.0)),
                Step::Heal,
            ],
        ),
    ]
}

/// Prints every recovery and what the servers saw, then checks them.
fn report(rig: &Rig, recoveries: &[Recovery]) {
    for r in recoveries {
        println!(
            "{} (after {}): first grant {:?}, /healthz 200 {:?}, the replica's accept queue empty {:?}, \
             a fresh session answered {:?}; \
             while cut off at most: the server's connections {}, the replica's {}, its accept queue {}, \
             queue {}, outstanding {}, \
             clients open {}, probes open {}; {} probes opened, {} connections held in {:?} of black hole",
            r.sequence,
            r.after,
            r.first_grant,
            r.healthy,
            r.queue_drained,
            r.fresh_session,
            r.bounds.server_connections,
            r.bounds.replica_connections,
            r.bounds.accept_queue,
            r.bounds.queue_depth,
            r.bounds.outstanding,
            r.bounds.clients_open,
            r.bounds.probes_open,
            r.bounds.held_probes,
            r.bounds.held_connections,
            r.bounds.held_for
        );
    }
    let (seen, direct) = (rig.seen.lock().unwrap(), rig.seen_direct.lock().unwrap());
    let read = |server: &Daemon, name: &str| metric(server, &format!("ratelimiterd_tigerbeetle_{name}"));
    println!(
        "proxied server: {} granted, {} answered 503; sessions replaced {:?}, probes {:?}, renewed {:?}; \
         direct server: {} granted, {} answered 503, sessions renewed {:?}",
        seen.granted,
        seen.unavailable,
        read(&rig.proxied, "sessions_replaced_total"),
        read(&rig.proxied, "session_probes_total"),
        read(&rig.proxied, "sessions_renewed_total"),
        direct.granted,
        direct.unavailable,
        read(&rig.direct, "sessions_renewed_total"),
    );
    let sum = |name: &str| {
        metric_sum(
            &rig.proxied,
            &format!("ratelimiterd_tigerbeetle_replica_connections_{name}"),
        )
    };
    println!(
        "proxied server's connections to the replica: {} open, {} opened ({} while cut off), {} closed",
        sum("open"),
        sum("opened_total"),
        sum("opened_cut_off_total"),
        sum("closed_total")
    );
    assert!(seen.other.is_empty(), "unexpected answers: {:?}", seen.other);
    assert!(direct.other.is_empty(), "unexpected answers: {:?}", direct.other);
    assert_eq!(
        read(&rig.direct, "sessions_renewed_total"),
        Some(0),
        "the direct server's session was evicted"
    );
    let heals = (chosen_sequences().iter())
        .flat_map(|(_, steps)| steps)
        .filter(|step| matches!(step, Step::Heal))
        .count();
    assert_eq!(
        recoveries.len(),
        heals,
        "a server that never came back ended the run early"
    );
    for r in recoveries {
        let first_grant = r.first_grant.unwrap_or_else(|| {
            panic!(
                "{} (after {}): no grant within {RECOVERY_WAIT:?} of the network's return",
                r.sequence, r.after
            )
        });
        // The goal is met in the clients' and the replica's ticks: measured in
        // wall time, the bound stretches as far as the load of the same moment
        // made a fresh session late.
        let stretch = load_stretch(r.fresh_session);
        let (recovery_max, drained_max) = (RECOVERY_MAX.mul_f64(stretch), ACCEPT_QUEUE_DRAINED_MAX.mul_f64(stretch));
        assert!(
            first_grant <= recovery_max,
            "{} (after {}): first grant after {first_grant:?} (goal {RECOVERY_GOAL:?}; bound {recovery_max:?}, \
             {RECOVERY_MAX:?} stretched {stretch:.2} times by a fresh session answered after {:?})",
            r.sequence,
            r.after,
            r.fresh_session
        );
        let drained = r.queue_drained.unwrap_or(RECOVERY_WAIT);
        assert!(
            drained <= drained_max,
            "{} (after {}): the replica's accept queue not empty {drained:?} after the network's return \
             (bound {drained_max:?})",
            r.sequence,
            r.after
        );
        assert!(
            r.bounds.server_connections <= SERVER_CONNECTIONS_MAX,
            "{} (after {}): the server held {} connections to the replica",
            r.sequence,
            r.after,
            r.bounds.server_connections
        );
        assert!(
            r.healthy.is_some(),
            "{} (after {}): /healthz never 200",
            r.sequence,
            r.after
        );
        assert!(
            r.bounds.clients_open <= CLIENTS_OPEN_MAX,
            "{} (after {}): {} client sessions open",
            r.sequence,
            r.after,
            r.bounds.clients_open
        );
        assert!(
            r.bounds.held_probes <= HELD_PROBES_MAX,
            "{} (after {}): {} probes opened in {:?} of black hole, each a session registered once it passes",
            r.sequence,
            r.after,
            r.bounds.held_probes,
            r.bounds.held_for
        );
        assert!(
            r.bounds.held_connections <= HELD_CONNECTIONS_MAX,
            "{} (after {}): {} connections held in {:?} of black hole",
            r.sequence,
            r.after,
            r.bounds.held_connections,
            r.bounds.held_for
        );
        assert!(
            r.bounds.probes_open <= 1,
            "{} (after {}): probes open",
            r.sequence,
            r.after
        );
        assert!(
            r.bounds.queue_depth <= QUEUED_MAX,
            "{} (after {}): {} items queued",
            r.sequence,
            r.after,
            r.bounds.queue_depth
        );
    }
}
