//! A real `ratelimiterd` cut from its real TigerBeetle cluster by a TCP proxy
//! of the test's own (issue 21, item 1): the server talks to the replica only
//! through the proxy, which forwards, black-holes (holds every byte and every
//! new connection, as a network that drops packets while TCP keeps retrying),
//! or resets every connection and refuses new ones (a replica restarting, a
//! firewall or balancer flushing connections). For each fault the test
//! measures, from the moment the network returns, how long the server takes
//! to grant again and to answer `/healthz` 200, checks that every request is
//! answered within its timeout, that `/healthz` turns 503 during the outage,
//! and that nothing is granted beyond capacity. The figures are printed
//! (`--nocapture`) and kept in RELIABILITY.md; the bounds asserted are loose,
//! for a loaded machine.

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

/// The request timeout of the server: an outage is answered 503 after it.
const REQUEST_TIMEOUT_MS: u64 = 2_000;
/// How long each outage lasts: long enough for the client library's retry
/// timers to back off by seconds (the fault of issue 21).
const OUTAGE: Duration = Duration::from_secs(10);
/// Names another outage length, in seconds, for a manual run.
const OUTAGE_ENV: &str = "NETWORK_OUTAGE_S";

/// [`OUTAGE`], or [`OUTAGE_ENV`] seconds when set: longer outages back the client
/// library's timers off further (issue 21 used 12 s).
fn outage_len() -> Duration {
    std::env::var(OUTAGE_ENV)
        .ok()
        .and_then(|s| s.parse().ok())
        .map(Duration::from_secs)
        .unwrap_or(OUTAGE)
}
/// Client threads sending reserves back to back, so that a grant is seen as
/// soon as the server can give one, whatever each call is waiting for.
const CLIENTS: usize = 4;
/// Capacity of the concurrency limit the clients hold and release: above
/// [`CLIENTS`], so that holds of unknown outcome left by an outage (released by
/// their timeout) do not starve the clients; checked at the end.
const CAPACITY: u64 = 16;
/// The loose bound asserted on recovery (the target, 1 s, is measured and
/// written down, not asserted: the machine may be loaded).
const RECOVERY_MAX: Duration = Duration::from_secs(5);
/// The most any call may take: the request timeout plus scheduling slack.
const ANSWER_MAX: Duration = Duration::from_millis(REQUEST_TIMEOUT_MS + 3_000);

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

/// What the clients saw during one phase.
#[derive(Debug, Default)]
struct Seen {
    granted: u64,
    unavailable: u64,
    other: Vec<(u16, Value)>,
    slowest: Duration,
    first_grant: Option<Instant>,
}

/// Runs [`CLIENTS`] threads reserving 1 unit of `key` and completing the lease
/// at once (a 503 too: whatever it may hold is released) until `stop`.
fn clients(server: &Daemon, key: &str, stop: &AtomicBool, seen: &Mutex<Seen>) {
    std::thread::scope(|scope| {
        for _ in 0..CLIENTS {
            scope.spawn(|| {
                while !stop.load(Ordering::Acquire) {
                    let lease = LeaseId::generate().to_string();
                    let body = json!({"lease_id": lease, "requirements": [{"key": key, "amount": 1}]});
                    let sent = Instant::now();
                    let (status, answer) = call(server, "POST", "/v1/reserve", Some(&body));
                    let mut took = sent.elapsed();
                    if status == 503 || answer["allowed"] == json!(true) {
                        let sent = Instant::now();
                        let (done, answer) = call(server, "POST", "/v1/complete", Some(&json!({"lease_id": lease})));
                        took = took.max(sent.elapsed());
                        assert!(done == 200 || done == 503, "complete: {done} {answer}");
                    }
                    let mut seen = seen.lock().unwrap();
                    seen.slowest = seen.slowest.max(took);
                    match (status, answer["allowed"].as_bool()) {
                        (200, Some(true)) => {
                            seen.granted += 1;
                            seen.first_grant.get_or_insert_with(Instant::now);
                        }
                        (503, _) => seen.unavailable += 1,
                        _ => seen.other.push((status, answer)),
                    }
                    drop(seen);
                    if status == 503 {
                        std::thread::sleep(Duration::from_millis(20));
                    }
                }
            });
        }
    });
}

/// Polls `/healthz` every 50 ms until it answers `status` or `bound` passes;
/// returns when it did, and the slowest answer.
fn health_turns(server: &Daemon, status: u16, from: Instant, bound: Duration) -> (Option<Duration>, Duration) {
    let mut slowest = Duration::ZERO;
    while from.elapsed() < bound {
        let sent = Instant::now();
        let (answered, _) = call(server, "GET", "/healthz", None);
        slowest = slowest.max(sent.elapsed());
        if answered == status {
            return (Some(from.elapsed()), slowest);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    (None, slowest)
}

fn metric(server: &Daemon, name: &str) -> u64 {
    let answer = raw::request(server.addr, "GET", "/metrics", None, b"");
    let text = answer.text();
    text.lines()
        .find_map(|line| line.strip_prefix(name)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("{name} not in /metrics"))
}

/// One outage in `mode`: reserves during it are all answered in time and
/// `/healthz` turns 503; after it, the first grant and `/healthz` 200 come
/// within the loose bound; the times are printed.
fn outage(server: &Daemon, proxy: &Proxy, key: &str, mode: Mode) {
    let stop = AtomicBool::new(false);
    let seen = Mutex::new(Seen::default());
    let (unhealthy, healthy, returned) = std::thread::scope(|scope| {
        scope.spawn(|| clients(server, key, &stop, &seen));
        std::thread::sleep(Duration::from_millis(300));
        let cut = Instant::now();
        proxy.set(mode);
        let (unhealthy, slowest_health) = health_turns(server, 503, cut, outage_len());
        assert!(
            slowest_health < ANSWER_MAX,
            "{mode:?}: /healthz took {slowest_health:?}"
        );
        std::thread::sleep(outage_len().saturating_sub(cut.elapsed()));
        let before = seen.lock().unwrap().granted;
        proxy.set(Mode::Forward);
        let returned = Instant::now();
        seen.lock().unwrap().first_grant = None;
        let (healthy, _) = health_turns(server, 200, returned, RECOVERY_MAX);
        let deadline = returned + RECOVERY_MAX;
        while seen.lock().unwrap().first_grant.is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        stop.store(true, Ordering::Release);
        assert!(seen.lock().unwrap().granted >= before);
        (unhealthy, healthy, returned)
    });
    let seen = seen.into_inner().unwrap();
    let first_grant = seen.first_grant.map(|at| at - returned);
    println!(
        "{mode:?} for {:?}: /healthz 503 after {unhealthy:?}; network back: first grant after {first_grant:?}, \
         /healthz 200 after {healthy:?}; {} granted, {} answered 503, slowest reserve {:?}",
        outage_len(),
        seen.granted,
        seen.unavailable,
        seen.slowest
    );
    assert!(seen.other.is_empty(), "{mode:?}: unexpected answers {:?}", seen.other);
    assert!(seen.unavailable > 0, "{mode:?}: the outage was not seen");
    assert!(seen.slowest < ANSWER_MAX, "{mode:?}: a reserve took {:?}", seen.slowest);
    assert!(unhealthy.is_some(), "{mode:?}: /healthz never turned 503");
    assert!(first_grant.is_some(), "{mode:?}: no grant within {RECOVERY_MAX:?}");
    assert!(healthy.is_some(), "{mode:?}: /healthz not 200 within {RECOVERY_MAX:?}");
}

#[test]
fn a_server_cut_from_its_cluster_grants_again_soon_after_the_network_returns() {
    let cluster = LocalCluster::start().expect("a local TigerBeetle replica");
    let proxy = Proxy::start(cluster.address().parse().expect("replica address"));
    let dir = temp_dir("tb-network");
    let settings = format!("  request_timeout_ms: {REQUEST_TIMEOUT_MS}\n");
    let proxied = proxy.addr.to_string();
    let backend = BackendConfig::TigerBeetle {
        addresses: &proxied,
        settings: &settings,
    };
    let server = Daemon::start_on(&dir, backend, "", "");
    let (ready, _) = health_turns(&server, 200, Instant::now(), Duration::from_secs(60));
    assert!(ready.is_some(), "the server never became healthy");
    let key = format!("net:{}:inflight", LeaseId::generate());
    let definition = json!({"key": key, "kind": "concurrency", "capacity": CAPACITY, "timeout_seconds": 30});
    assert_eq!(call(&server, "PUT", "/v1/admin/limits", Some(&definition)).0, 200);

    // Each outage asserts its own recovery within RECOVERY_MAX and prints it.
    for mode in [Mode::BlackHole, Mode::Refuse, Mode::Reset] {
        outage(&server, &proxy, &key, mode);
    }
    println!(
        "sessions replaced {}, probes {}",
        metric(&server, "ratelimiterd_tigerbeetle_sessions_replaced_total"),
        metric(&server, "ratelimiterd_tigerbeetle_session_probes_total")
    );
    // While a replica's port accepted connections that went nowhere, the
    // watchdog tried fresh sessions (whether one replaced the stalled session
    // depends on which answered first, the old client or the probe: printed).
    assert!(metric(&server, "ratelimiterd_tigerbeetle_session_probes_total") >= 1);

    // Nothing over-admitted: whatever the outages left of unknown outcome is
    // held, and the capacity still bounds every grant.
    let mut granted_after = 0;
    loop {
        let body = json!({"lease_id": LeaseId::generate().to_string(), "requirements": [{"key": key, "amount": 1}]});
        let (status, answer) = call(&server, "POST", "/v1/reserve", Some(&body));
        assert_eq!(status, 200, "{answer}");
        if answer["allowed"] != json!(true) {
            assert_eq!(
                answer["error"],
                json!(format!("insufficient_capacity:{key}")),
                "{answer}"
            );
            break;
        }
        granted_after += 1;
        assert!(granted_after <= CAPACITY, "granted beyond capacity");
    }
    let (status, report) = call(&server, "GET", &format!("/v1/admin/limits/{key}"), None);
    assert_eq!(status, 200, "{report}");
    let in_use = report["in_use"].as_u64().expect("in_use");
    assert!(in_use == CAPACITY, "{report}");
}
