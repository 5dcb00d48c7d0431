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

mod fault_sequences_rig;
mod support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use fault_sequences_rig::{call, client, metric, metric_sum, Recovery, Rig, Seen, Step, RECOVERY_WAIT};
use ratelimiter::tigerbeetle::LocalCluster;
use ratelimiter::LeaseId;
use serde_json::json;
use support::proxy::{Mode, Proxy};
use support::{temp_dir, BackendConfig, Daemon};

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

/// `seconds`, times the factor of [`SCALE_ENV`] when it is set.
fn scaled(seconds: f64) -> Duration {
    let scale: f64 = std::env::var(SCALE_ENV)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1.0);
    Duration::from_secs_f64(seconds * scale)
}

/// How much the load of the moment stretches a recovery bound: the time a
/// fresh session took to be answered over its time on an idle machine, from 1
/// to [`LOAD_STRETCH_MAX`] (the most when it was not answered at all).
fn load_stretch(fresh_session: Option<Duration>) -> f64 {
    fresh_session.map_or(LOAD_STRETCH_MAX, |answered| {
        (answered.as_secs_f64() / FRESH_SESSION_IDLE.as_secs_f64()).clamp(1.0, LOAD_STRETCH_MAX)
    })
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
