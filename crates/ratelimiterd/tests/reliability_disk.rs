//! A full or read-only disk under the registry and the memory snapshots
//! (issue 21), on the real binary with its directory on a small tmpfs of the
//! test's own: the server keeps serving reserves and completes, refuses a PUT
//! it cannot write with an error that says so, counts and logs every failed
//! write, leaves nothing half-written, and recovers as soon as the disk does.
//!
//! Mounting needs root (CI runs as root); elsewhere the test says why it
//! skipped and passes.

mod support;

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use ratelimiter::memory::MemorySnapshot;
use ratelimiter::LeaseId;
use serde_json::{json, Value};
use support::raw::{self, request, Response};
use support::{temp_dir, BackendConfig, Daemon, ADMIN_TOKEN, CLIENT_TOKEN, WAIT_MAX};

/// The tmpfs's size: room for the registry, a snapshot and the filler's
/// first writes, small enough to fill in a moment.
const DISK_BYTES: usize = 1 << 20;
/// Periodic snapshots and decrease checks, often, so a failed write shows at once.
const SNAPSHOTS: &str = "memory:\n  snapshot_interval_ms: 100\ndecrease:\n  check_interval_ms: 100\n";
/// The rolling limit of the test: a window far longer than the test, so every
/// grant is still held at the end and over-admission would show in `in_use`.
const CAPACITY: u64 = 1_000;

/// A tmpfs mounted over a directory, unmounted on drop.
struct Tmpfs {
    path: PathBuf,
}

impl Tmpfs {
    /// Mounts a tmpfs of [`DISK_BYTES`] at `path`; `Err` says why not.
    fn mount(path: &Path) -> Result<Tmpfs, String> {
        std::fs::create_dir_all(path).map_err(|e| e.to_string())?;
        let output = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={DISK_BYTES}"), "tmpfs"])
            .arg(path)
            .output()
            .map_err(|e| format!("cannot run mount: {e}"))?;
        if !output.status.success() {
            return Err(format!(
                "mount -t tmpfs failed (needs root): {}",
                String::from_utf8_lossy(&output.stderr).trim()
            ));
        }
        Ok(Tmpfs { path: path.to_owned() })
    }

    /// Remounts read-only (`true`) or read-write.
    fn set_read_only(&self, read_only: bool) {
        let option = if read_only { "remount,ro" } else { "remount,rw" };
        let status = Command::new("mount")
            .args(["-o", option])
            .arg(&self.path)
            .status()
            .expect("run mount");
        assert!(status.success(), "mount -o {option}");
    }

    /// Fills the disk: a file written until the disk refuses more.
    fn fill(&self) -> PathBuf {
        let filler = self.path.join("filler");
        let mut file = File::create(&filler).expect("create the filler");
        let chunk = vec![0xAB_u8; 4096];
        loop {
            if file.write_all(&chunk).and_then(|()| file.sync_all()).is_err() {
                return filler;
            }
        }
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.path).status();
    }
}

fn put(daemon: &Daemon, definition: &Value) -> Response {
    request(
        daemon.addr,
        "PUT",
        "/v1/admin/limits",
        Some(ADMIN_TOKEN),
        definition.to_string().as_bytes(),
    )
}

fn limit(daemon: &Daemon, key: &str) -> Response {
    request(
        daemon.addr,
        "GET",
        &format!("/v1/admin/limits/{key}"),
        Some(ADMIN_TOKEN),
        b"",
    )
}

fn reserve(daemon: &Daemon, lease: LeaseId, amount: u64) -> Value {
    let body = json!({"lease_id": lease.to_string(), "requirements": [{"key": "tpm", "amount": amount}]});
    raw::ok(daemon.addr, "POST", "/v1/reserve", CLIENT_TOKEN, &body).json()
}

fn metric(daemon: &Daemon, name: &str) -> f64 {
    let text = request(daemon.addr, "GET", "/metrics", None, b"").text();
    text.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in /metrics"))
}

/// Reserves 10 units at a time until denied; returns the grants.
fn reserve_until_denied(daemon: &Daemon) -> u64 {
    let mut granted = 0;
    loop {
        let answer = reserve(daemon, LeaseId::generate(), 10);
        if answer["allowed"] != true {
            assert_eq!(answer["error"], "insufficient_capacity:tpm", "{answer}");
            return granted;
        }
        granted += 1;
    }
}

/// Waits until the snapshot on disk holds `leases` live leases: a save after
/// the disk came back. Returns how long it took.
fn wait_for_snapshot_with(path: &Path, leases: usize) -> Duration {
    let start = Instant::now();
    loop {
        if let Ok(Some(snapshot)) = MemorySnapshot::read(path) {
            if snapshot.leases_len() == leases {
                return start.elapsed();
            }
        }
        assert!(start.elapsed() < WAIT_MAX, "no snapshot with {leases} leases");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// What a refused PUT must leave: an answer that says why, nothing defined or
/// changed, no temporary file, the registry and snapshot on disk whole.
fn check_refused_put(daemon: &Daemon, disk: &Path, why: &str) {
    let answer = put(
        daemon,
        &json!({"key": "rpm", "kind": "rolling", "capacity": 50, "window_seconds": 60}),
    );
    assert_eq!(answer.status, 500, "{}", answer.text());
    let error = answer.error();
    assert!(
        error.starts_with("internal_error: the registry file could not be written") && error.contains(why),
        "{error}"
    );
    assert!(
        !error.contains(&disk.display().to_string()),
        "no path in the answer: {error}"
    );
    assert_eq!(limit(daemon, "rpm").status, 404, "nothing defined");
    let raise = put(
        daemon,
        &json!({"key": "tpm", "kind": "rolling", "capacity": 2 * CAPACITY, "window_seconds": 3600}),
    );
    assert_eq!(raise.status, 500, "{}", raise.text());
    assert_eq!(limit(daemon, "tpm").json()["capacity"], CAPACITY, "nothing changed");
    let leftovers: Vec<String> = std::fs::read_dir(disk)
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|name| name.ends_with(".tmp"))
        .collect();
    assert!(leftovers.is_empty(), "half-written files left: {leftovers:?}");
    let registry = ratelimiter::registry::load(&disk.join("limits.json")).expect("the registry reads whole");
    assert_eq!(registry.len(), 2);
    MemorySnapshot::read(&disk.join("memory-snapshot.bin")).expect("the last snapshot reads whole");
}

#[test]
fn a_full_or_read_only_disk_refuses_puts_keeps_serving_and_recovers() {
    let dir = temp_dir("disk");
    let disk = dir.join("disk");
    let tmpfs = match Tmpfs::mount(&disk) {
        Ok(tmpfs) => tmpfs,
        Err(reason) => {
            eprintln!("SKIPPED a_full_or_read_only_disk_refuses_puts_keeps_serving_and_recovers: {reason}");
            return;
        }
    };
    let config = support::write_config_on(&disk, BackendConfig::Memory, "", SNAPSHOTS);
    let mut daemon = Daemon::start_with(&config).expect("start on the tmpfs");
    let snapshot = disk.join("memory-snapshot.bin");
    raw::ok(
        daemon.addr,
        "PUT",
        "/v1/admin/limits",
        ADMIN_TOKEN,
        &json!({"key": "tpm", "kind": "rolling", "capacity": CAPACITY, "window_seconds": 3600}),
    );
    assert_eq!(reserve(&daemon, LeaseId::generate(), 100)["allowed"], true);
    // A concurrency limit lowered while both its units are held: a decrease waits.
    raw::ok(
        daemon.addr,
        "PUT",
        "/v1/admin/limits",
        ADMIN_TOKEN,
        &json!({"key": "inflight", "kind": "concurrency", "capacity": 2, "timeout_seconds": 3600}),
    );
    let held = LeaseId::generate();
    let body = json!({"lease_id": held.to_string(), "requirements": [{"key": "inflight", "amount": 2}]});
    raw::ok(daemon.addr, "POST", "/v1/reserve", CLIENT_TOKEN, &body);
    let lowered = json!({"key": "inflight", "kind": "concurrency", "capacity": 1, "timeout_seconds": 3600});
    assert_eq!(put(&daemon, &lowered).json()["status"], "decreasing");
    wait_for_snapshot_with(&snapshot, 2);

    // Full: PUTs refused with the reason, reserves served to the capacity exactly.
    let filler = tmpfs.fill();
    check_refused_put(&daemon, &disk, "no storage space");
    // Half of the 900 units left, in tens.
    let granted_full = 45;
    for _ in 0..granted_full {
        assert_eq!(reserve(&daemon, LeaseId::generate(), 10)["allowed"], true);
    }
    let deadline = Instant::now() + WAIT_MAX;
    while metric(&daemon, "ratelimiterd_memory_snapshot_failures_total") < 1.0 {
        assert!(Instant::now() < deadline, "no failed snapshot counted");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(metric(&daemon, "ratelimiterd_registry_persist_failures_total"), 2.0);
    // The decrease is carried out while the disk is full: applied, its write retried.
    let body = json!({"lease_id": held.to_string(), "actuals": []});
    raw::ok(daemon.addr, "POST", "/v1/complete", CLIENT_TOKEN, &body);
    while limit(&daemon, "inflight").json()["status"] != "active" {
        assert!(Instant::now() < deadline, "the decrease was not carried out");
        std::thread::sleep(Duration::from_millis(20));
    }
    while metric(&daemon, "ratelimiterd_registry_persist_failures_total") < 3.0 {
        assert!(Instant::now() < deadline, "the decrease's failed write was not counted");
        std::thread::sleep(Duration::from_millis(20));
    }
    let logs = daemon.logs().join("\n");
    assert!(logs.contains("could not persist a carried-out decrease"), "{logs}");
    assert!(logs.contains("the registry file could not be written"), "{logs}");
    assert!(logs.contains("memory snapshot not saved"), "{logs}");

    // Space returns: the next PUT is stored, the next snapshot holds every lease.
    std::fs::remove_file(&filler).unwrap();
    raw::ok(
        daemon.addr,
        "PUT",
        "/v1/admin/limits",
        ADMIN_TOKEN,
        &json!({"key": "rpm", "kind": "rolling", "capacity": 50, "window_seconds": 60}),
    );
    let recovered = wait_for_snapshot_with(&snapshot, 46);
    // The carried-out decrease reached the file too, on a later check.
    let registry = disk.join("limits.json");
    let decreased = |path: &Path| {
        ratelimiter::registry::load(path)
            .unwrap()
            .iter()
            .any(|s| s.definition().key().as_str() == "inflight" && s.definition().capacity() == 1)
    };
    while !decreased(&registry) {
        assert!(
            Instant::now() < deadline + WAIT_MAX,
            "the decrease never reached the registry"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    eprintln!("full disk: {granted_full} reserves answered while full; snapshot saved again {recovered:?} after space returned");

    // Read-only: the same, with its own reason.
    tmpfs.set_read_only(true);
    let failures_before = metric(&daemon, "ratelimiterd_memory_snapshot_failures_total");
    let rpm_only = json!({"key": "rpm2", "kind": "rolling", "capacity": 5, "window_seconds": 60});
    let answer = put(&daemon, &rpm_only);
    assert_eq!(answer.status, 500, "{}", answer.text());
    assert!(answer.error().contains("read-only"), "{}", answer.error());
    assert_eq!(limit(&daemon, "rpm2").status, 404);
    let granted_read_only = reserve_until_denied(&daemon);
    assert_eq!(granted_read_only, 45, "the other 450 units; then denied");
    while metric(&daemon, "ratelimiterd_memory_snapshot_failures_total") <= failures_before {
        assert!(Instant::now() < deadline + WAIT_MAX, "no failed snapshot counted");
        std::thread::sleep(Duration::from_millis(20));
    }
    tmpfs.set_read_only(false);
    raw::ok(daemon.addr, "PUT", "/v1/admin/limits", ADMIN_TOKEN, &rpm_only);
    let recovered = wait_for_snapshot_with(&snapshot, 91);
    eprintln!("read-only disk: {granted_read_only} reserves answered; snapshot saved again {recovered:?} after rw");

    // A SIGKILL now: everything answered is on disk, nothing over capacity.
    daemon.kill9();
    let daemon = Daemon::start_with(&config).expect("restart after the disk faults");
    let tpm = limit(&daemon, "tpm").json();
    assert_eq!(tpm["in_use"], CAPACITY, "{tpm}");
    let inflight = limit(&daemon, "inflight").json();
    assert_eq!(
        (&inflight["capacity"], &inflight["status"]),
        (&json!(1), &json!("active")),
        "{inflight}"
    );
    assert_eq!(limit(&daemon, "rpm").status, 200);
    assert_eq!(limit(&daemon, "rpm2").status, 200);
    assert_eq!(reserve(&daemon, LeaseId::generate(), 1)["allowed"], false);
    drop(daemon);
    drop(tmpfs);
}
