//! The wall clock stepping an hour forward and back (issue 21), NTP style, on
//! the real `ratelimiterd` binary: libfaketime, preloaded into the server,
//! reads the offset from a file the test rewrites while the server runs. The
//! monotonic and boot clocks are left alone, as a real step leaves them. Every
//! grant is checked against the test's monotonic clock: no window of real time
//! ever holds more grants than the capacity (nothing over-admitted), and the
//! capacity comes back once the real window has passed (no hold stranded for
//! the hour of the step).
//!
//! On the memory backend the step comes while the server runs and across a
//! restart (the snapshot); on TigerBeetle while the server runs (the cluster
//! keeps the holds and times them), and across a restart for a Complete with
//! usage above its reservation (timed by the cluster's clock). libfaketime comes from
//! `scripts/tigerbeetle.sh faketime-lib`, which `scripts/test.sh` runs; without
//! it the tests say why they skipped and pass.

mod support;

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use ratelimiter::LeaseId;
use serde_json::{json, Value};
use support::raw::{self, request};
use support::{temp_dir, BackendConfig, Daemon, ADMIN_TOKEN, CLIENT_TOKEN, WAIT_MAX};

/// Where `scripts/test.sh` says libfaketime is.
const FAKETIME_LIB_ENV: &str = "RATELIMITER_FAKETIME_LIB";
/// Where Debian's `libfaketime` puts it, for a run without the script.
const FAKETIME_LIB_DEBIAN: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";
/// The step: an hour, as a time zone or NTP mistake makes.
const STEP_MS: i64 = 3_600_000;
/// How far the server's log clock may be from the expected offset: the
/// test's and the server's readings are a moment apart.
const LOG_CLOCK_SLACK_MS: i64 = 60_000;
/// The rolling limit of the running-step test: short, so windows turn over
/// several times within the test.
const CAPACITY: usize = 10;
const WINDOW: Duration = Duration::from_secs(2);
/// The concurrency timeout of the running-step test: longer than the moment
/// between a grant and the step, so an early end would show.
const TIMEOUT: Duration = Duration::from_secs(5);
/// The pause between two reserves of one phase.
const PACE: Duration = Duration::from_millis(10);

/// libfaketime's library, or why there is none.
fn faketime_lib() -> Result<PathBuf, String> {
    let path = std::env::var_os(FAKETIME_LIB_ENV).map_or_else(|| PathBuf::from(FAKETIME_LIB_DEBIAN), PathBuf::from);
    if path.exists() {
        Ok(path)
    } else {
        Err(format!(
            "no libfaketime at {} (set {FAKETIME_LIB_ENV}, or run scripts/tigerbeetle.sh faketime-lib)",
            path.display()
        ))
    }
}

/// libfaketime's library, or `None` after saying why `what` is skipped
/// without it.
fn faketime_or_skip(what: &str) -> Option<PathBuf> {
    faketime_lib()
        .map_err(|reason| eprintln!("SKIPPED {what}: {reason}"))
        .ok()
}

/// A server whose wall clock is offset by what `offset_file` says.
struct SteppedServer {
    daemon: Daemon,
    offset_file: PathBuf,
    lib: PathBuf,
}

impl SteppedServer {
    /// Starts the binary on `config` with its wall clock at `offset_ms` from ours.
    fn start(config: &Path, lib: &Path, offset_ms: i64) -> SteppedServer {
        let offset_file = config.with_file_name("faketime-offset");
        write_offset(&offset_file, offset_ms);
        let env: [(&str, &OsStr); 4] = [
            ("LD_PRELOAD", lib.as_os_str()),
            ("FAKETIME_TIMESTAMP_FILE", offset_file.as_os_str()),
            // Read the file on every call, so a rewrite steps the clock at once.
            ("FAKETIME_NO_CACHE", OsStr::new("1")),
            // A step moves the wall clock only, as NTP and `date -s` do.
            ("FAKETIME_DONT_FAKE_MONOTONIC", OsStr::new("1")),
        ];
        let daemon = Daemon::start_with_env(config, &env).unwrap_or_else(|logs| panic!("did not start:\n{logs}"));
        SteppedServer {
            daemon,
            offset_file,
            lib: lib.to_owned(),
        }
    }

    /// Steps the running server's wall clock to `offset_ms` from ours, and
    /// checks that it did by the time stamp of a log line written after.
    fn step_to(&self, offset_ms: i64, key: &str) {
        write_offset(&self.offset_file, offset_ms);
        let logged = self.daemon.logs().len();
        // A PUT of an unchanged definition logs a line, with the server's time.
        let unchanged = limit(&self.daemon, key);
        let mut definition = unchanged.clone();
        for field in ["in_use", "debt", "status", "pending_decrease_to"] {
            definition.as_object_mut().unwrap().remove(field);
        }
        raw::ok(self.daemon.addr, "PUT", "/v1/admin/limits", ADMIN_TOKEN, &definition);
        let deadline = Instant::now() + WAIT_MAX;
        let line = loop {
            if let Some(line) = self.daemon.logs()[logged..]
                .iter()
                .find(|l| l.contains("limit defined"))
            {
                break line.clone();
            }
            assert!(Instant::now() < deadline, "no log line after the step");
            std::thread::sleep(PACE);
        };
        let server_ms = log_time_ms(&line);
        let ours_ms = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as i64;
        assert!(
            (server_ms - ours_ms - offset_ms).abs() < LOG_CLOCK_SLACK_MS,
            "the server's clock is not at {offset_ms} ms from ours: {line}"
        );
    }
}

fn write_offset(path: &Path, offset_ms: i64) {
    // libfaketime reads "+<seconds>" / "-<seconds>" as an offset from the real clock.
    let text = format!("{:+}\n", offset_ms / 1_000);
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// The Unix ms of a log line's RFC 3339 time stamp (`2026-11-25T08:41:51.779394Z ...`).
fn log_time_ms(line: &str) -> i64 {
    let start = line.find(|c: char| c.is_ascii_digit()).expect("a time stamp");
    let stamp = &line[start..start + 19];
    let number = |range: std::ops::Range<usize>| stamp[range].parse::<i64>().expect("a time stamp");
    let (year, month, day) = (number(0..4), number(5..7), number(8..10));
    let seconds = number(11..13) * 3_600 + number(14..16) * 60 + number(17..19);
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * ((month + 9) % 12) + 2) / 5 + day - 1;
    let days = era * 146_097 + yoe * 365 + yoe / 4 - yoe / 100 + doy - 719_468;
    (days * 86_400 + seconds) * 1_000
}

fn put(daemon: &Daemon, definition: Value) {
    raw::ok(daemon.addr, "PUT", "/v1/admin/limits", ADMIN_TOKEN, &definition);
}

fn limit(daemon: &Daemon, key: &str) -> Value {
    let answer = request(
        daemon.addr,
        "GET",
        &format!("/v1/admin/limits/{key}"),
        Some(ADMIN_TOKEN),
        b"",
    );
    assert_eq!(answer.status, 200, "{}", answer.text());
    answer.json()
}

fn reserve(daemon: &Daemon, lease: LeaseId, key: &str, amount: u64) -> Value {
    let body = json!({"lease_id": lease.to_string(), "requirements": [{"key": key, "amount": amount}]});
    raw::ok(daemon.addr, "POST", "/v1/reserve", CLIENT_TOKEN, &body).json()
}

fn allowed(answer: &Value, key: &str) -> bool {
    if answer["allowed"] == true {
        return true;
    }
    assert_eq!(answer["error"], format!("insufficient_capacity:{key}"), "{answer}");
    false
}

fn complete(daemon: &Daemon, lease: LeaseId) {
    let body = json!({"lease_id": lease.to_string(), "actuals": []});
    raw::ok(daemon.addr, "POST", "/v1/complete", CLIENT_TOKEN, &body);
}

/// Every grant of the rolling limit, as (sent, answered) on our monotonic clock.
type Grants = Vec<(Instant, Instant)>;

/// Reserves one unit of `key` every [`PACE`] for at least `WINDOW` and a bit,
/// and on until a grant sent a whole window after the phase began (bounded):
/// the capacity came back after its real window, whatever the clock did.
fn phase(daemon: &Daemon, key: &str, grants: &mut Grants) {
    let start = Instant::now();
    loop {
        let sent = Instant::now();
        let answer = reserve(daemon, LeaseId::generate(), key, 1);
        if allowed(&answer, key) {
            grants.push((sent, Instant::now()));
        }
        let came_back = grants.last().is_some_and(|&(sent, _)| sent >= start + WINDOW);
        if came_back && start.elapsed() >= WINDOW + WINDOW / 4 {
            return;
        }
        assert!(
            start.elapsed() < WAIT_MAX,
            "no grant {WINDOW:?} after the phase began: a hold stranded"
        );
        std::thread::sleep(PACE);
    }
}

/// No real window holds more than the capacity: grants j and i (i before j)
/// surely shared a window when j's answer came less than a window after i was
/// sent (the server granted i no earlier and j no later).
fn assert_never_over_capacity(grants: &Grants) {
    for (j, &(_, answered)) in grants.iter().enumerate() {
        let together = grants[..=j]
            .iter()
            .filter(|&&(sent, _)| answered.duration_since(sent) < WINDOW)
            .count();
        assert!(
            together <= CAPACITY,
            "{together} grants within one {WINDOW:?} window (capacity {CAPACITY}), grant {j} of {}",
            grants.len()
        );
    }
}

/// The running-step scenario on `backend`: a rolling limit hammered while the
/// clock steps forward an hour, then back two; a concurrency limit full at
/// the forward step.
fn steps_while_running(backend: BackendConfig, label: &str) {
    let Some(lib) = faketime_or_skip(&format!("clock steps on {label}")) else {
        return;
    };
    let dir = temp_dir(&format!("clock-{label}"));
    let config = support::write_config_on(&dir, backend, "", "");
    let server = SteppedServer::start(&config, &lib, 0);
    let daemon = &server.daemon;
    let prefix = format!("clock{:x}", rand::random::<u32>());
    let (tpm, inflight) = (format!("{prefix}:tpm"), format!("{prefix}:inflight"));
    put(
        daemon,
        json!({"key": tpm, "kind": "rolling", "capacity": CAPACITY, "window_seconds": WINDOW.as_secs(), "window_margin_ms": 0}),
    );
    put(
        daemon,
        json!({"key": inflight, "kind": "concurrency", "capacity": 2, "timeout_seconds": TIMEOUT.as_secs()}),
    );
    let mut grants = Grants::new();
    phase(daemon, &tpm, &mut grants);

    // The concurrency limit full, then an hour forward: its holds stay.
    let (a, b) = (LeaseId::generate(), LeaseId::generate());
    let held_since = Instant::now();
    assert!(allowed(&reserve(daemon, a, &inflight, 1), &inflight));
    assert!(allowed(&reserve(daemon, b, &inflight, 1), &inflight));
    server.step_to(STEP_MS, &tpm);
    let third = reserve(daemon, LeaseId::generate(), &inflight, 1);
    if held_since.elapsed() < TIMEOUT {
        assert!(!allowed(&third, &inflight), "a hold ended early at the step: {third}");
    }
    complete(daemon, a);
    let c = LeaseId::generate();
    assert!(allowed(&reserve(daemon, c, &inflight, 1), &inflight));
    phase(daemon, &tpm, &mut grants);

    // Two hours back: nothing held for the two hours.
    server.step_to(-STEP_MS, &tpm);
    phase(daemon, &tpm, &mut grants);
    complete(daemon, c);
    // b was never completed: its timeout ends it in real time.
    let deadline = Instant::now() + WAIT_MAX;
    while !allowed(&reserve(daemon, LeaseId::generate(), &inflight, 2), &inflight) {
        assert!(Instant::now() < deadline, "the abandoned hold stranded");
        std::thread::sleep(PACE);
    }
    assert!(held_since.elapsed() >= TIMEOUT, "the abandoned hold ended early");
    assert_never_over_capacity(&grants);
    eprintln!(
        "clock steps on {label}: {} grants of a {CAPACITY}/{WINDOW:?} limit over {:?}, none over capacity (libfaketime {})",
        grants.len(),
        grants.first().map(|g| g.0.elapsed()).unwrap_or_default(),
        server.lib.display()
    );
}

#[test]
fn the_memory_backend_over_admits_nothing_and_strands_nothing_when_the_clock_steps() {
    steps_while_running(BackendConfig::Memory, "memory");
}

/// The clock step of the server's log line after a restore.
fn restored_clock_step_ms(daemon: &Daemon) -> i64 {
    let logs = daemon.logs();
    let line = logs
        .iter()
        .find(|l| l.contains("memory snapshot restored"))
        .expect("a restore logged");
    line.split("clock_step_ms=").nth(1).expect("clock_step_ms logged")[..]
        .split(|c: char| !(c.is_ascii_digit() || c == '-'))
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

/// The wall clock steps while the memory backend is down (between its stop's
/// snapshot and the next start): the snapshot's holds still end after the
/// real time they were granted for, not an hour early (over-admission) or an
/// hour late (capacity idle).
#[test]
fn a_clock_step_across_a_restart_moves_no_hold_end_on_the_memory_backend() {
    let Some(lib) = faketime_or_skip("clock steps across a restart") else {
        return;
    };
    let dir = temp_dir("clock-restart");
    let config = support::write_config_on(&dir, BackendConfig::Memory, "", "memory:\n  snapshot_interval_ms: 0\n");
    let mut server = SteppedServer::start(&config, &lib, 0);
    let (long, short) = ("long", "short");
    put(
        &server.daemon,
        json!({"key": long, "kind": "rolling", "capacity": 10, "window_seconds": 600, "window_margin_ms": 0}),
    );
    put(
        &server.daemon,
        json!({"key": short, "kind": "rolling", "capacity": 10, "window_seconds": 3, "window_margin_ms": 0}),
    );
    let granted_at = Instant::now();
    assert!(allowed(&reserve(&server.daemon, LeaseId::generate(), long, 10), long));
    assert!(allowed(&reserve(&server.daemon, LeaseId::generate(), short, 10), short));

    for (offset_ms, expected_step_ms) in [(STEP_MS, STEP_MS), (-STEP_MS, -2 * STEP_MS)] {
        assert!(server.daemon.terminate().success());
        server = SteppedServer::start(&config, &lib, offset_ms);
        let more = reserve(&server.daemon, LeaseId::generate(), long, 1);
        assert!(
            !allowed(&more, long),
            "the 600 s window ended early after a step to {offset_ms} ms"
        );
        assert_eq!(limit(&server.daemon, long)["in_use"], 10);
        let step_ms = restored_clock_step_ms(&server.daemon);
        assert!(
            (step_ms - expected_step_ms).abs() < LOG_CLOCK_SLACK_MS,
            "restored with a step of {step_ms} ms, not about {expected_step_ms}"
        );
    }
    // The short window ends in real time: 3 s after its grant, not 2 h later.
    let deadline = Instant::now() + WAIT_MAX;
    while !allowed(&reserve(&server.daemon, LeaseId::generate(), short, 10), short) {
        assert!(Instant::now() < deadline, "the 3 s window stranded after the steps");
        std::thread::sleep(PACE);
    }
    assert!(
        granted_at.elapsed() >= Duration::from_secs(3),
        "the short window ended early"
    );
}

#[cfg(feature = "tigerbeetle")]
#[test]
fn the_tigerbeetle_backend_over_admits_nothing_and_strands_nothing_when_the_clock_steps() {
    let cluster = ratelimiter::tigerbeetle::LocalCluster::start().expect("a local TigerBeetle replica");
    let settings = "  sessions: 2\n  max_batch_events: 200\n";
    let backend = BackendConfig::TigerBeetle {
        addresses: cluster.address(),
        settings,
    };
    steps_while_running(backend, "tigerbeetle");
}

/// The value of the unlabelled counter `name` in `daemon`'s `/metrics`.
#[cfg(feature = "tigerbeetle")]
fn metric(daemon: &Daemon, name: &str) -> u64 {
    let text = request(daemon.addr, "GET", "/metrics", None, b"").text();
    let line = (text.lines())
        .find(|l| l.split_whitespace().next() == Some(name))
        .unwrap_or_else(|| panic!("{name} missing from /metrics:\n{text}"));
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// A lease reserved before a restart and completed after it, the wall clock
/// stepped an hour forward meanwhile, with usage above the reservation: the
/// restarted server does not have the lease and reads it back from the
/// cluster, and times what is left of the window on the cluster's clock. The
/// overage is held for the rest of the window, so the capacity is used up;
/// measured on the two processes' wall clocks, the window looked an hour over
/// and the overage was dropped (a further reserve was granted: over-admission
/// against the provider's window).
#[cfg(feature = "tigerbeetle")]
#[test]
fn an_overage_completed_after_a_restart_across_a_clock_step_is_held_for_the_rest_of_the_window() {
    let Some(lib) = faketime_or_skip("an overage across a clock step") else {
        return;
    };
    let cluster = ratelimiter::tigerbeetle::LocalCluster::start().expect("a local TigerBeetle replica");
    let backend = BackendConfig::TigerBeetle {
        addresses: cluster.address(),
        settings: "  sessions: 2\n  max_batch_events: 200\n",
    };
    let dir = temp_dir("clock-overage");
    let config = support::write_config_on(&dir, backend, "", "");
    let mut server = SteppedServer::start(&config, &lib, 0);
    let key = format!("clock{:x}:tpm", rand::random::<u32>());
    put(
        &server.daemon,
        json!({"key": key, "kind": "rolling", "capacity": 100, "window_seconds": 600, "window_margin_ms": 0}),
    );
    let lease = LeaseId::generate();
    assert!(allowed(&reserve(&server.daemon, lease, &key, 10), &key));
    assert!(server.daemon.terminate().success());

    server = SteppedServer::start(&config, &lib, STEP_MS);
    let body = json!({"lease_id": lease.to_string(), "actuals": [{"key": key, "actual_amount": 100}]});
    raw::ok(server.daemon.addr, "POST", "/v1/complete", CLIENT_TOKEN, &body);
    assert_eq!(limit(&server.daemon, &key)["in_use"], 100, "the overage was not held");
    let further = reserve(&server.daemon, LeaseId::generate(), &key, 1);
    assert!(!allowed(&further, &key), "over-admitted after the step: {further}");
    assert_eq!(
        metric(&server.daemon, "ratelimiterd_tigerbeetle_completes_from_cluster_total"),
        1
    );
    assert_eq!(
        metric(&server.daemon, "ratelimiterd_tigerbeetle_cluster_clock_probes_total"),
        1
    );
}
