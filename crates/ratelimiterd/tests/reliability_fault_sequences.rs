//! Sequences of network faults between a real `ratelimiterd` and its real
//! TigerBeetle replica, through a TCP proxy of the test's own: a long black
//! hole and then a period where every new connection is reset as it is
//! accepted, a reset then a black hole, two resets, and the replica killed and
//! restarted while the network is black-holed. Clients reserve and complete
//! on the server all along (and on a second server that reaches the replica
//! directly). After every fault the network returns, and the test measures how
//! long the server takes to grant again; while it is cut off, the test samples
//! its queue, its requests outstanding and the client sessions it holds open,
//! which must stay within their bounds however long the fault lasts.
//!
//! The figures are printed (`--nocapture`) and kept in RELIABILITY.md; the
//! bound asserted on recovery leaves a margin for a loaded machine.

#![cfg(feature = "tigerbeetle")]

mod support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use ratelimiter::tigerbeetle::LocalCluster;
use ratelimiter::LeaseId;
use serde_json::{json, Value};
use support::proxy::{Mode, Proxy};
use support::{raw, temp_dir, BackendConfig, Daemon, ADMIN_TOKEN, CLIENT_TOKEN};

/// The request timeout of the servers: a call during an outage is answered
/// 503 after it.
const REQUEST_TIMEOUT_MS: u64 = 2_000;
/// Clients reserving and completing back to back on the proxied server, each
/// making a call answered 503 again on the direct server.
const CLIENTS: usize = 12;
/// Clients on the server that reaches the replica directly.
const DIRECT_CLIENTS: usize = 2;
/// The goal: the server grants within this long of the network's return.
const RECOVERY_GOAL: Duration = Duration::from_secs(1);
/// The bound asserted: the goal plus a margin for a loaded 2-core machine
/// (a client's call in flight when the network returns, scheduling).
const RECOVERY_MAX: Duration = Duration::from_millis(2_500);
/// How long the test waits for a grant before it records none.
const RECOVERY_WAIT: Duration = Duration::from_secs(15);
/// How often the server's bounds are sampled while it is cut off.
const SAMPLE_EVERY: Duration = Duration::from_millis(200);
/// The most client sessions the proxied server may hold open at any moment:
/// its one session, one probe, and one replaced client still closing.
const CLIENTS_OPEN_MAX: u64 = 3;
/// The most work items queued while cut off: one per call waiting (each
/// client has one reserve or complete out at a time), twice, since a caller
/// that gave up calls again before its item is dropped; an item whose caller
/// gave up must not stay.
const QUEUED_MAX: u64 = 2 * CLIENTS as u64;
/// A probe held by a black hole is replaced this rarely at most (the
/// backend's `PROBE_HELD_MAX_MS`): every probe that reaches the replica
/// registers a session, which may evict another server's.
const HELD_PROBE_EVERY: Duration = Duration::from_secs(10);
/// While the replica's port holds connections, the server checks it this
/// rarely at most (the backend's `HELD_CHECK_INTERVAL_MS`); with its probes and
/// its session's reconnections, a black hole holds at most three connections
/// a second of it (checks every 100 ms would make it ten).
const HELD_CHECK_EVERY: Duration = Duration::from_secs(1);
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
}

impl Bounds {
    fn sample(&mut self, server: &Daemon) {
        let read = |name| metric(server, name).unwrap_or(0);
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
}

/// One recovery: how long after the network's return the first grant and
/// `/healthz` 200 came.
#[derive(Debug)]
struct Recovery {
    sequence: &'static str,
    after: String,
    first_grant: Option<Duration>,
    healthy: Option<Duration>,
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
                    let until = Instant::now() + length;
                    while Instant::now() < until {
                        bounds.sample(&self.proxied);
                        std::thread::sleep(SAMPLE_EVERY.min(until.saturating_duration_since(Instant::now())));
                    }
                    if mode == Mode::BlackHole {
                        bounds.held_probes += probes() - probes_before;
                        bounds.held_connections += self.proxy.accepted() - accepted_before;
                        bounds.held_for += length;
                    }
                }
                Step::KillReplica => self.cluster.kill().expect("kill the replica"),
                Step::StartReplica => self.cluster.start_again().expect("restart the replica"),
                Step::Heal => {
                    let (first_grant, healthy) = self.heal();
                    recoveries.push(Recovery {
                        sequence,
                        after: done.join(", "),
                        first_grant,
                        healthy,
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

    /// Lets the traffic through and waits for the first grant after it.
    fn heal(&self) -> (Option<Duration>, Option<Duration>) {
        self.proxy.set(Mode::Forward);
        let returned = Instant::now();
        let mut healthy = None;
        let mut first_grant = None;
        while returned.elapsed() < RECOVERY_WAIT && (first_grant.is_none() || healthy.is_none()) {
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
        (first_grant, healthy)
    }
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
    };
    let recoveries: Vec<Recovery> = std::thread::scope(|scope| {
        for _ in 0..CLIENTS {
            scope.spawn(|| client(&rig, &rig.proxied, Some((&rig.direct, &rig.seen_direct)), &rig.seen));
        }
        for _ in 0..DIRECT_CLIENTS {
            scope.spawn(|| client(&rig, &rig.direct, None, &rig.seen_direct));
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
            "{} (after {}): first grant {:?}, /healthz 200 {:?}; while cut off at most: queue {}, outstanding {}, \
             clients open {}, probes open {}; {} probes opened, {} connections held in {:?} of black hole",
            r.sequence,
            r.after,
            r.first_grant,
            r.healthy,
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
        assert!(
            first_grant <= RECOVERY_MAX,
            "{} (after {}): first grant after {first_grant:?} (goal {RECOVERY_GOAL:?})",
            r.sequence,
            r.after
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
        let held_probes_max = 2 + r.bounds.held_for.as_secs() / HELD_PROBE_EVERY.as_secs();
        assert!(
            r.bounds.held_probes <= held_probes_max,
            "{} (after {}): {} probes opened in {:?} of black hole, each a session registered once it passes",
            r.sequence,
            r.after,
            r.bounds.held_probes,
            r.bounds.held_for
        );
        let held_connections_max = 3 * r.bounds.held_for.as_secs() / HELD_CHECK_EVERY.as_secs() + CLIENTS_OPEN_MAX;
        assert!(
            r.bounds.held_connections <= held_connections_max,
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
