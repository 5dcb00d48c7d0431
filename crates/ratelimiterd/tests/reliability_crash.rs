//! `ratelimiterd` killed with SIGKILL (issue 7): limit definitions and
//! `decreasing` states survive a restart, and a kill during registry writes
//! never leaves a corrupt or empty registry: after every kill the file parses
//! and holds exactly a prefix of the writes that includes every answered one.

mod support;

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rand::{Rng, SeedableRng};
use ratelimiter::registry::Registry;
use ratelimiter::{LeaseId, LimitStatus};
use serde_json::{json, Value};
use support::raw::{self, request};
use support::{temp_dir, Daemon, ADMIN_TOKEN, CLIENT_TOKEN};

/// Kill rounds of the registry test unless `RELIABILITY_KILL_ROUNDS` says otherwise.
const KILL_ROUNDS_DEFAULT: u64 = 25;
/// The keys the registry test writes, in turn.
const WRITE_KEYS: u64 = 8;
/// The longest a round lets writes run before the kill, in ms.
const KILL_DELAY_MS_MAX: u64 = 80;
/// Decreases are checked far less often than any test runs, so a pending one stays pending.
const NO_DECREASE_CHECKS: &str = "decrease:\n  check_interval_ms: 3600000\n";

fn put(daemon: &Daemon, definition: &Value) -> (u16, Value) {
    let answer = request(
        daemon.addr,
        "PUT",
        "/v1/admin/limits",
        Some(ADMIN_TOKEN),
        definition.to_string().as_bytes(),
    );
    (answer.status, answer.json())
}

/// Every state without usage (which a restart of the memory backend drops).
fn definitions(daemon: &Daemon) -> Vec<Value> {
    let answer = request(daemon.addr, "GET", "/v1/admin/limits", Some(ADMIN_TOKEN), b"");
    assert_eq!(answer.status, 200, "{}", answer.text());
    let Value::Array(reports) = answer.json() else {
        panic!("a list")
    };
    reports
        .into_iter()
        .map(|mut r| {
            let object = r.as_object_mut().expect("an object");
            object.remove("in_use");
            object.remove("debt");
            r
        })
        .collect()
}

/// A key of this test process alone, so tests never share a limit, even on one
/// TigerBeetle cluster.
fn key(name: &str) -> String {
    static RUN: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    format!("crash:{}:{name}", RUN.get_or_init(|| LeaseId::generate().to_string()))
}

fn reserve(daemon: &Daemon, key: &str, amount: u64) -> Value {
    let body = json!({"lease_id": LeaseId::generate().to_string(), "requirements": [{"key": key, "amount": amount}]});
    raw::ok(daemon.addr, "POST", "/v1/reserve", CLIENT_TOKEN, &body).json()
}

#[test]
fn sigkill_keeps_definitions_and_decreasing_states() {
    let dir = temp_dir("sigkill-states");
    let mut daemon = Daemon::start(&dir, "", NO_DECREASE_CHECKS);
    let (inflight_key, tpm_key) = (key("inflight"), key("tpm"));
    let inflight = json!({"key": inflight_key, "kind": "concurrency", "capacity": 10, "timeout_seconds": 600});
    let tpm = json!({"key": tpm_key, "kind": "rolling", "capacity": 5000, "window_seconds": 60,
                     "unit": "tokens", "description": "kept across kills", "overage": "debt"});
    assert_eq!(put(&daemon, &inflight).0, 200);
    assert_eq!(put(&daemon, &tpm).0, 200);
    for _ in 0..4 {
        assert_eq!(reserve(&daemon, &inflight_key, 1)["allowed"], true);
    }
    // A decrease below the 4 units in use stays pending; an increase is at once.
    let (status, decreasing) = put(
        &daemon,
        &json!({"key": inflight_key, "kind": "concurrency", "capacity": 2, "timeout_seconds": 600}),
    );
    assert_eq!(
        (status, &decreasing["status"], &decreasing["pending_decrease_to"]),
        (200, &json!("decreasing"), &json!(2))
    );
    let mut bigger = tpm.clone();
    bigger["capacity"] = json!(8000);
    assert_eq!(put(&daemon, &bigger).0, 200);
    let before = definitions(&daemon);

    daemon.kill9();
    let registry = Registry::open(dir.join("limits.json")).expect("the registry parses after SIGKILL");
    let on_disk: Vec<_> = registry.states().collect();
    assert_eq!(on_disk.len(), 2);
    assert_eq!(on_disk[0].status(), LimitStatus::Decreasing);
    assert_eq!(on_disk[0].pending_decrease_to(), 2);
    assert_eq!(on_disk[1].definition().capacity(), 8000);

    let mut daemon = Daemon::start_with(&daemon.config).expect("restart after SIGKILL");
    assert_eq!(definitions(&daemon), before, "the states after the restart");
    // The restored decrease still refuses new reservations on its key.
    let denied = reserve(&daemon, &inflight_key, 1);
    assert_eq!(
        (&denied["allowed"], &denied["error"]),
        (&json!(false), &json!(format!("limit_decreasing:{inflight_key}")))
    );
    // Killed again straight after the restart, nothing is lost either.
    daemon.kill9();
    let daemon = Daemon::start_with(&daemon.config).expect("second restart");
    assert_eq!(definitions(&daemon), before);
}

fn write_key(write: u64) -> String {
    key(&format!("w{}", write % WRITE_KEYS))
}

/// Write number `write` (from 0) sets its key's capacity to `write + 1`, so
/// capacities only grow (every write is active at once, none is a decrease)
/// and the largest capacity on disk names the last write applied.
fn write_definition(write: u64) -> Value {
    json!({"key": write_key(write), "kind": "rolling", "capacity": write + 1, "window_seconds": 60})
}

/// Runs writes from `first` on until `stop`, counting in `acked` the writes answered 200.
fn writer(addr: std::net::SocketAddr, first: u64, acked: Arc<AtomicU64>, stop: Arc<AtomicBool>) {
    let mut write = first;
    while !stop.load(Ordering::SeqCst) {
        let body = write_definition(write).to_string();
        let Ok(answer) = support::raw::exchange(
            addr,
            &support::raw::request_bytes("PUT", "/v1/admin/limits", Some(ADMIN_TOKEN), body.as_bytes()),
        ) else {
            return;
        };
        assert_eq!(answer.status, 200, "write {write}: {}", answer.text());
        write += 1;
        acked.store(write, Ordering::SeqCst);
    }
}

/// The number of writes the registry at `path` holds, checking that it holds
/// exactly the first that many: each key at the capacity of its last write.
fn writes_on_disk(path: &Path) -> u64 {
    let registry = Registry::open(path).unwrap_or_else(|e| panic!("the registry is corrupt after SIGKILL: {e}"));
    let capacities: Vec<(String, u64)> = registry
        .states()
        .map(|s| (s.definition().key().to_string(), s.definition().capacity()))
        .collect();
    let applied = capacities.iter().map(|(_, c)| *c).max().unwrap_or(0);
    let expected: Vec<(String, u64)> = {
        let mut last = std::collections::BTreeMap::new();
        for write in 0..applied {
            last.insert(write_key(write), write + 1);
        }
        last.into_iter().collect()
    };
    assert_eq!(capacities, expected, "the registry is not the first {applied} writes");
    assert!(registry.states().all(|s| s.status() == LimitStatus::Active));
    applied
}

#[test]
fn sigkill_during_registry_writes_never_corrupts_the_registry() {
    let rounds = std::env::var("RELIABILITY_KILL_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(KILL_ROUNDS_DEFAULT);
    let seed = rand::random::<u64>();
    println!("seed {seed}");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let dir = temp_dir("sigkill-writes");
    let mut config: Option<std::path::PathBuf> = None;
    let mut applied = 0;
    let mut kills_mid_write = 0;
    for round in 0..rounds {
        let mut daemon = match &config {
            None => Daemon::start(&dir, "", ""),
            Some(path) => Daemon::start_with(path)
                .unwrap_or_else(|logs| panic!("round {round}: no restart after SIGKILL (seed {seed}):\n{logs}")),
        };
        config = Some(daemon.config.clone());
        // What the restarted server serves is what the file held.
        let served = definitions(&daemon).len() as u64;
        assert_eq!(served, applied.min(WRITE_KEYS), "round {round}");
        let acked = Arc::new(AtomicU64::new(applied));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (acked, stop, addr) = (acked.clone(), stop.clone(), daemon.addr);
            std::thread::spawn(move || writer(addr, applied, acked, stop))
        };
        // Every other round first waits for one answered write, so writes surely
        // run; then the kill comes at a random instant.
        if round % 2 == 0 {
            let deadline = std::time::Instant::now() + support::WAIT_MAX;
            while acked.load(Ordering::SeqCst) == applied {
                assert!(
                    std::time::Instant::now() < deadline,
                    "round {round}: no write was answered"
                );
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        std::thread::sleep(Duration::from_millis(rng.gen_range(0..=KILL_DELAY_MS_MAX)));
        // Stopped first, so the writer does not open a new connection after the
        // kill (its port could by then belong to another test's server); the
        // write in flight, if any, is the one the kill interrupts.
        stop.store(true, Ordering::SeqCst);
        daemon.kill9();
        thread.join().expect("writer");
        let answered = acked.load(Ordering::SeqCst);
        let on_disk = writes_on_disk(&dir.join("limits.json"));
        // Every answered write is on disk; at most the one in flight is too.
        assert!(
            (answered..=answered + 1).contains(&on_disk),
            "round {round}: {answered} writes answered, {on_disk} on disk (seed {seed})"
        );
        kills_mid_write += u64::from(on_disk > answered);
        applied = on_disk;
    }
    println!("{rounds} kills, {applied} writes, {kills_mid_write} kills after a write reached disk unanswered");
    assert!(applied >= rounds / 2, "too few writes ran to test anything: {applied}");
}
