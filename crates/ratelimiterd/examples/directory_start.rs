//! A memory-backend server's start with 100,000 gateway keys against the same
//! server with none, in the same run (BENCHMARKS.md, "Gateway keys"): the time
//! from spawning `ratelimiterd` to its `listening` line and its resident memory
//! then (VmRSS), median of alternating rounds.
//!
//! cargo build --release -p ratelimiterd --bin ratelimiterd --example directory_start
//! target/release/examples/directory_start

#[path = "support/directory_file.rs"]
mod directory_file;
#[path = "support/fleet_server.rs"]
#[allow(dead_code)]
mod fleet_server;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ratelimiter::directory::{KeyLimits, JOURNAL_FILE_NAME};

/// Keys of the large directory.
const KEYS: usize = 100_000;
/// Rounds of each, alternating.
const ROUNDS: usize = 5;

/// Starts the binary on `dir`; the time to its `listening` line and its VmRSS in KiB then.
fn start(dir: &Path) -> (Duration, u64) {
    let config = dir.join("config.yaml");
    std::fs::write(
        &config,
        format!(
            "server:\n  listen_addr: \"127.0.0.1:0\"\nregistry:\n  path: {}\n",
            dir.join("limits.json").display()
        ),
    )
    .unwrap();
    let started = Instant::now();
    let mut child = Command::new(fleet_server::default_binary())
        .arg("--config")
        .arg(&config)
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("build the binary first: cargo build --release -p ratelimiterd --bin ratelimiterd");
    let lines = BufReader::new(child.stderr.take().unwrap()).lines();
    for line in lines {
        if line.unwrap().contains("listening") {
            break;
        }
    }
    let elapsed = started.elapsed();
    let status = std::fs::read_to_string(format!("/proc/{}/status", child.id())).unwrap();
    let rss_kib = (status.lines())
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0);
    let _ = child.kill();
    let _ = child.wait();
    (elapsed, rss_kib)
}

fn median<T: Ord + Copy>(mut values: Vec<T>) -> T {
    values.sort();
    values[values.len() / 2]
}

fn main() {
    let root = std::env::temp_dir().join(format!("directory-start-{}", std::process::id()));
    let (empty, full) = (root.join("empty"), root.join("full"));
    let key_text = |i: usize| format!("rlk-start-{i}");
    let limits = KeyLimits {
        rpm: Some(600),
        ..Default::default()
    };
    directory_file::write_directory(&empty, "acme", 0, key_text, limits.clone());
    directory_file::write_directory(&full, "acme", KEYS, key_text, limits);
    let (mut times, mut rss) = ((Vec::new(), Vec::new()), (Vec::new(), Vec::new()));
    for _ in 0..ROUNDS {
        let (t, r) = start(&empty);
        times.0.push(t);
        rss.0.push(r);
        let (t, r) = start(&full);
        times.1.push(t);
        rss.1.push(r);
    }
    let size = std::fs::metadata(full.join(JOURNAL_FILE_NAME)).unwrap().len();
    let (t0, t1) = (median(times.0), median(times.1));
    let (r0, r1) = (median(rss.0), median(rss.1));
    println!("start with 0 keys: {t0:?}, {r0} KiB resident");
    println!(
        "start with {KEYS} keys ({} MB file): {t1:?}, {r1} KiB resident",
        size / 1_000_000
    );
    println!(
        "difference: +{:?}, +{} MiB ({:.0} bytes a key)",
        t1.saturating_sub(t0),
        (r1 - r0.min(r1)) / 1024,
        (r1.saturating_sub(r0) * 1024) as f64 / KEYS as f64
    );
    let _ = std::fs::remove_dir_all(&root);
}
