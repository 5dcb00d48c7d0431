//! The signals a running `ratelimiterd serve` outlives (`src/signals.rs`): only
//! SIGTERM (and SIGINT, SIGKILL) stop it. A server without a gateway logs a
//! SIGHUP as nothing to reload and ignores SIGUSR1, SIGUSR2 and SIGALRM; a
//! gateway server sent SIGHUP the moment it is spawned, before its reload
//! listener exists, starts all the same; SIGTERM still stops both cleanly.

mod support;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use support::gateway_setup::start_sim;
use support::{raw, temp_dir, write_config_on, BackendConfig, Daemon};

/// How long a signal is given to take effect before the server is checked.
const SETTLE: Duration = Duration::from_millis(300);

/// Sends `signal` to the process `pid`.
fn send(pid: u32, signal: libc::c_int) {
    let pid = libc::pid_t::try_from(pid).expect("a pid fits");
    // SAFETY: kill(2) with a child's pid and a valid signal number.
    assert_eq!(unsafe { libc::kill(pid, signal) }, 0, "kill {signal}");
}

/// Waits, without sleeping, until the process `pid` runs its `main`, whose
/// first instruction ignores SIGHUP (Linux's `SigIgn` mask in
/// `/proc/<pid>/status`); panics when it does not within [`MAIN_WAIT`]. A
/// signal sent before `main` reaches the dynamic loader, which no program
/// can guard.
fn until_main_runs(pid: u32) {
    let hup_bit = 1u64 << (libc::SIGHUP - 1);
    let started = Instant::now();
    while started.elapsed() < MAIN_WAIT {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        let ignored = (status.lines())
            .find_map(|line| line.strip_prefix("SigIgn:"))
            .and_then(|mask| u64::from_str_radix(mask.trim(), 16).ok());
        if ignored.is_some_and(|mask| mask & hup_bit != 0) {
            return;
        }
        std::thread::yield_now();
    }
    panic!("the server's main never ignored SIGHUP while it starts");
}

/// The longest wait for a spawned server to reach its `main`.
const MAIN_WAIT: Duration = Duration::from_secs(5);

/// Asserts that the server still runs and answers `/healthz`.
fn answers(daemon: &mut Daemon, after: &str) {
    assert!(
        daemon.is_running(),
        "the server died of {after}:\n{}",
        daemon.logs().join("\n")
    );
    assert_eq!(
        raw::request(daemon.addr, "GET", "/healthz", None, b"").status,
        200,
        "{after}"
    );
}

/// Waits (bounded) for a log line containing `text`.
fn until_logged(daemon: &Daemon, text: &str) {
    let started = Instant::now();
    while !daemon.logs().iter().any(|line| line.contains(text)) {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "never logged {text:?}:\n{}",
            daemon.logs().join("\n")
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_server_without_a_gateway_outlives_sighup_and_stray_signals_and_stops_on_sigterm() {
    let dir = temp_dir("signals-memory");
    let mut daemon = Daemon::start_on(&dir, BackendConfig::Memory, "", "");
    send(daemon.pid(), libc::SIGHUP);
    until_logged(&daemon, "nothing to reload");
    answers(&mut daemon, "SIGHUP");
    for (signal, name) in [
        (libc::SIGUSR1, "SIGUSR1"),
        (libc::SIGUSR2, "SIGUSR2"),
        (libc::SIGALRM, "SIGALRM"),
    ] {
        send(daemon.pid(), signal);
        std::thread::sleep(SETTLE);
        answers(&mut daemon, name);
    }
    assert!(daemon.terminate().success(), "SIGTERM stops it cleanly");
}

/// A gateway of one model in front of the simulator at `sim`.
fn gateway_section(sim: SocketAddr) -> String {
    std::env::set_var("SIGNALS_TEST_KEY", "signals-test-tenant-key-0123456789");
    format!(
        "gateway:\n  listen_addr: \"127.0.0.1:0\"\n  upstreams:\n    - {{name: sim, kind: openai, base_url: \"http://{sim}\"}}\n  models:\n    - {{name: gpt-4o-mini, upstream: sim, rpm: 1000, tpm: 1000000, max_output_tokens_default: 64}}\n  tenants:\n    - {{name: acme, api_key_env: SIGNALS_TEST_KEY}}\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_server_sent_sighup_as_it_starts_starts_all_the_same() {
    let sim = start_sim().await;
    let dir = temp_dir("signals-gateway");
    let config = write_config_on(&dir, BackendConfig::Memory, "", &gateway_section(sim));
    // No sleep: the signal reaches the server while it builds its parts, long
    // before its reload listener exists.
    let started = Daemon::start_and_at_spawn(&config, |pid| {
        until_main_runs(pid);
        send(pid, libc::SIGHUP)
    });
    let mut daemon = started.unwrap_or_else(|logs| panic!("a SIGHUP at start ended the server:\n{logs}"));
    answers(&mut daemon, "SIGHUP at start");
    send(daemon.pid(), libc::SIGHUP);
    until_logged(&daemon, "prices reloaded on SIGHUP");
    answers(&mut daemon, "SIGHUP");
    assert!(daemon.terminate().success(), "SIGTERM stops it cleanly");
}
