//! `ratelimiterd` on the memory backend restarted (issue 15): reservations,
//! concurrency holds and what Complete reconciles survive a SIGTERM (the
//! stop's snapshot) and a SIGKILL (the last periodic snapshot), and a damaged
//! snapshot is never half-loaded nor silently ignored.

mod support;

use std::path::Path;
use std::time::{Duration, Instant};

use ratelimiter::LeaseId;
use serde_json::{json, Value};
use support::raw::{self, request};
use support::{temp_dir, BackendConfig, Daemon, ADMIN_TOKEN, CLIENT_TOKEN, WAIT_MAX};

/// Only the stop's snapshot: a SIGTERM test then proves that one is written.
const STOP_SNAPSHOT_ONLY: &str = "memory:\n  snapshot_interval_ms: 0\n";
/// The shortest periodic interval, so a SIGKILL test waits little.
const PERIODIC_SNAPSHOTS: &str = "memory:\n  snapshot_interval_ms: 100\n";

fn put(daemon: &Daemon, definition: Value) {
    raw::ok(daemon.addr, "PUT", "/v1/admin/limits", ADMIN_TOKEN, &definition);
}

fn reserve(daemon: &Daemon, lease: LeaseId, needs: &[(&str, u64)]) -> Value {
    let requirements: Vec<Value> = needs.iter().map(|(k, a)| json!({"key": k, "amount": a})).collect();
    let body = json!({"lease_id": lease.to_string(), "requirements": requirements});
    raw::ok(daemon.addr, "POST", "/v1/reserve", CLIENT_TOKEN, &body).json()
}

fn complete(daemon: &Daemon, lease: LeaseId, actuals: &[(&str, u64)]) {
    let actuals: Vec<Value> = actuals
        .iter()
        .map(|(k, a)| json!({"key": k, "actual_amount": a}))
        .collect();
    let body = json!({"lease_id": lease.to_string(), "actuals": actuals});
    raw::ok(daemon.addr, "POST", "/v1/complete", CLIENT_TOKEN, &body);
}

fn in_use(daemon: &Daemon, key: &str) -> u64 {
    let answer = request(
        daemon.addr,
        "GET",
        &format!("/v1/admin/limits/{key}"),
        Some(ADMIN_TOKEN),
        b"",
    );
    assert_eq!(answer.status, 200, "{}", answer.text());
    answer.json()["in_use"].as_u64().expect("in_use")
}

fn metric(daemon: &Daemon, name: &str) -> f64 {
    let text = request(daemon.addr, "GET", "/metrics", None, b"").text();
    text.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in /metrics"))
}

/// The scenario: a 600 s rolling limit of 1,000 with 700 reserved
/// (two leases) and a concurrency limit with two holds. Returns the leases.
fn reserve_the_scenario(daemon: &Daemon) -> [LeaseId; 4] {
    put(
        daemon,
        json!({"key": "tpm", "kind": "rolling", "capacity": 1000, "window_seconds": 600}),
    );
    put(
        daemon,
        json!({"key": "inflight", "kind": "concurrency", "capacity": 10, "timeout_seconds": 600}),
    );
    let leases = [(); 4].map(|()| LeaseId::generate());
    assert_eq!(reserve(daemon, leases[0], &[("tpm", 400)])["allowed"], true);
    assert_eq!(reserve(daemon, leases[1], &[("tpm", 300)])["allowed"], true);
    assert_eq!(reserve(daemon, leases[2], &[("inflight", 1)])["allowed"], true);
    assert_eq!(reserve(daemon, leases[3], &[("inflight", 1)])["allowed"], true);
    assert_eq!((in_use(daemon, "tpm"), in_use(daemon, "inflight")), (700, 2));
    leases
}

/// After the restart: the units are held, only 300 more fit, replays answer
/// as before, and Complete still reconciles and releases.
fn check_the_scenario_after_a_restart(daemon: &Daemon, leases: [LeaseId; 4]) {
    assert_eq!((in_use(daemon, "tpm"), in_use(daemon, "inflight")), (700, 2));
    let over = reserve(daemon, LeaseId::generate(), &[("tpm", 301)]);
    assert_eq!(over["error"], "insufficient_capacity:tpm", "{over}");
    let replay = reserve(daemon, leases[0], &[("tpm", 400)]);
    assert_eq!(replay["allowed"], true, "{replay}");
    assert_eq!(in_use(daemon, "tpm"), 700, "a replay reserves nothing");
    complete(daemon, leases[0], &[("tpm", 100)]);
    complete(daemon, leases[2], &[]);
    assert_eq!((in_use(daemon, "tpm"), in_use(daemon, "inflight")), (400, 1));
}

#[test]
fn sigterm_keeps_reservations_and_holds_and_complete_still_reconciles() {
    let dir = temp_dir("restart-sigterm");
    let mut daemon = Daemon::start_on(&dir, BackendConfig::Memory, "", STOP_SNAPSHOT_ONLY);
    let leases = reserve_the_scenario(&daemon);
    assert!(daemon.terminate().success());
    assert!(dir.join("memory-snapshot.bin").exists());
    let daemon = Daemon::start_with(&daemon.config).expect("restart after SIGTERM");
    check_the_scenario_after_a_restart(&daemon, leases);
}

/// Waits until two snapshots completed after this call: the second was surely
/// copied after it.
fn wait_for_a_later_snapshot(daemon: &Daemon) {
    let name = "ratelimiterd_memory_snapshot_last_success_timestamp_seconds";
    let deadline = Instant::now() + WAIT_MAX;
    let mut seen = metric(daemon, name);
    for _ in 0..2 {
        loop {
            assert!(Instant::now() < deadline, "no periodic snapshot");
            std::thread::sleep(Duration::from_millis(20));
            let now = metric(daemon, name);
            if now > seen {
                seen = now;
                break;
            }
        }
    }
}

#[test]
fn sigkill_keeps_what_the_last_periodic_snapshot_held() {
    let dir = temp_dir("restart-sigkill");
    let mut daemon = Daemon::start_on(&dir, BackendConfig::Memory, "", PERIODIC_SNAPSHOTS);
    let leases = reserve_the_scenario(&daemon);
    wait_for_a_later_snapshot(&daemon);
    daemon.kill9();
    let mut daemon = Daemon::start_with(&daemon.config).expect("restart after SIGKILL");
    check_the_scenario_after_a_restart(&daemon, leases);
    // Killed again at once: the restored state was saved again meanwhile.
    wait_for_a_later_snapshot(&daemon);
    daemon.kill9();
    let daemon = Daemon::start_with(&daemon.config).expect("second restart");
    assert_eq!((in_use(&daemon, "tpm"), in_use(&daemon, "inflight")), (400, 1));
}

fn damage(path: &Path) {
    let mut bytes = std::fs::read(path).expect("a snapshot");
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x01;
    std::fs::write(path, bytes).unwrap();
}

#[test]
fn a_damaged_snapshot_is_moved_aside_named_and_counted_or_refused() {
    let dir = temp_dir("restart-damaged");
    let mut daemon = Daemon::start_on(&dir, BackendConfig::Memory, "", STOP_SNAPSHOT_ONLY);
    reserve_the_scenario(&daemon);
    assert!(daemon.terminate().success());
    let path = dir.join("memory-snapshot.bin");
    damage(&path);

    // Refused: the start fails, naming the file and both ways on.
    let refuse = support::write_config_on(
        &dir,
        BackendConfig::Memory,
        "",
        "memory:\n  snapshot_interval_ms: 0\n  damaged_snapshot: refuse\n",
    );
    let logs = Daemon::start_with(&refuse)
        .err()
        .expect("a damaged snapshot stops the start");
    assert!(logs.contains(&path.display().to_string()), "{logs}");
    assert!(logs.contains("damaged_snapshot: start_fresh"), "{logs}");
    assert!(path.exists(), "the refused file stays where it was");

    // The default: started with nothing held, the file moved aside and counted.
    let config = support::write_config_on(&dir, BackendConfig::Memory, "", STOP_SNAPSHOT_ONLY);
    let daemon = Daemon::start_with(&config).expect("start beside a damaged snapshot");
    assert_eq!((in_use(&daemon, "tpm"), in_use(&daemon, "inflight")), (0, 0));
    assert_eq!(metric(&daemon, "ratelimiterd_memory_snapshot_damaged_total"), 1.0);
    let logs = daemon.logs().join("\n");
    assert!(
        logs.contains("memory snapshot damaged") && logs.contains(".damaged-"),
        "{logs}"
    );
    let aside: Vec<_> = std::fs::read_dir(&*dir)
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|name| name.starts_with("memory-snapshot.bin.damaged-"))
        .collect();
    assert_eq!(aside.len(), 1, "{aside:?}");
    assert!(!path.exists());
}
