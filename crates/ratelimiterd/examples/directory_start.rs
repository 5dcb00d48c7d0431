//! A memory-backend server with many gateway keys, each with its own limits
//! (an `rpm` and a $5 daily budget; an `rpm` alone where two a key would pass
//! the memory backend's bound on limits, as a million keys would), against the
//! same server with none, in the same run (BENCHMARKS.md, "Gateway keys"):
//!
//! - its start: the time from spawning `ratelimiterd` to its `listening` line
//!   and its resident memory then (VmRSS), median of alternating rounds;
//! - a key's creation through the admin API (`POST /v1/admin/gateway/keys`
//!   with its `rpm` and budget): the median time of [`CREATIONS`] creations
//!   on each server, alternating, the first key against the key after all
//!   the others.
//!
//! cargo build --release -p ratelimiterd --bin ratelimiterd --example directory_start
//! target/release/examples/directory_start [KEYS]    # default 100000

#[path = "support/directory_file.rs"]
mod directory_file;
#[path = "support/fleet_server.rs"]
#[allow(dead_code)]
mod fleet_server;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ratelimiter::directory::{KeyLimits, JOURNAL_FILE_NAME};

/// Keys of the large directory, unless given.
const KEYS_DEFAULT: usize = 100_000;
/// Rounds of each start, alternating.
const ROUNDS: usize = 3;
/// Keys created through the API on each server, one after the other.
const CREATIONS: usize = 200;

/// A server started on a directory, with the time its start took.
struct Started {
    child: Child,
    addr: SocketAddr,
    elapsed: Duration,
    rss_kib: u64,
}

impl Drop for Started {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts the binary on `dir`; the time to its `listening` line and its VmRSS then.
fn start(dir: &Path) -> Started {
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
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let addr = loop {
        let line = lines.next().expect("the server stopped before listening").unwrap();
        if let Some(rest) = line.split("addr=").nth(1).filter(|_| line.contains("listening")) {
            break rest.split_whitespace().next().unwrap().parse().unwrap();
        }
    };
    let elapsed = started.elapsed();
    // Drained for as long as it runs, so the server never blocks on a full pipe.
    std::thread::spawn(move || lines.for_each(drop));
    let status = std::fs::read_to_string(format!("/proc/{}/status", child.id())).unwrap();
    let rss_kib = (status.lines())
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0);
    Started {
        child,
        addr,
        elapsed,
        rss_kib,
    }
}

/// One `POST` of `body` to `addr`'s `path` on a fresh connection; its status.
fn post(addr: SocketAddr, path: &str, body: &str) -> u16 {
    let mut stream = TcpStream::connect(addr).unwrap();
    let request = format!(
        "POST {path} HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\
         connection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    answer
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

/// The time of one key creation on `server`, with an `rpm` and a daily
/// budget, as the directory's keys have.
fn create_key(server: &Started) -> Duration {
    let body = r#"{"tenant": "acme", "rpm": 600, "budgets": [{"usd": 5, "period": "day"}]}"#;
    let at = Instant::now();
    assert_eq!(post(server.addr, "/v1/admin/gateway/keys", body), 201);
    at.elapsed()
}

/// The median times of [`CREATIONS`] key creations on each server,
/// alternating, so the machine's load weighs on both alike.
fn creation_medians(first: &Started, second: &Started) -> (Duration, Duration) {
    let (a, b): (Vec<Duration>, Vec<Duration>) =
        (0..CREATIONS).map(|_| (create_key(first), create_key(second))).unzip();
    (median(a), median(b))
}

fn median<T: Ord + Copy>(mut values: Vec<T>) -> T {
    values.sort();
    values[values.len() / 2]
}

fn main() {
    let keys: usize = std::env::args()
        .nth(1)
        .map_or(KEYS_DEFAULT, |n| n.parse().expect("KEYS: a number"));
    let root = std::env::temp_dir().join(format!("directory-start-{}", std::process::id()));
    let (empty, full) = (root.join("empty"), root.join("full"));
    let key_text = |i: usize| format!("rlk-start-{i}");
    // Two limits a key while they fit the memory backend's bound on limits,
    // else one (a million keys): the creations add two each.
    let budgets = 2 * (keys + CREATIONS) < ratelimiter::memory::LIMITS_MAX;
    let limits: KeyLimits = serde_json::from_value(if budgets {
        serde_json::json!({"rpm": 600, "budgets": [{"usd": 5, "period": "day"}]})
    } else {
        serde_json::json!({"rpm": 600})
    })
    .unwrap();
    let own = if budgets { "an rpm and a daily budget" } else { "an rpm" };
    directory_file::write_directory(&empty, "acme", 0, key_text, limits.clone());
    directory_file::write_directory(&full, "acme", keys, key_text, limits);
    let (mut times, mut rss) = ((Vec::new(), Vec::new()), (Vec::new(), Vec::new()));
    for _ in 0..ROUNDS {
        let server = start(&empty);
        times.0.push(server.elapsed);
        rss.0.push(server.rss_kib);
        drop(server);
        let server = start(&full);
        times.1.push(server.elapsed);
        rss.1.push(server.rss_kib);
    }
    let size = std::fs::metadata(full.join(JOURNAL_FILE_NAME)).unwrap().len();
    let (t0, t1) = (median(times.0), median(times.1));
    let (r0, r1) = (median(rss.0), median(rss.1));
    println!("start with 0 keys: {t0:?}, {r0} KiB resident");
    println!(
        "start with {keys} keys, each with {own} ({} MB file): {t1:?}, {r1} KiB resident",
        size / 1_000_000
    );
    println!(
        "difference: +{:?}, +{} MiB ({:.0} bytes a key)",
        t1.saturating_sub(t0),
        (r1 - r0.min(r1)) / 1024,
        (r1.saturating_sub(r0) * 1024) as f64 / keys as f64
    );
    if keys + CREATIONS > ratelimiter::directory::KEYS_MAX {
        println!("key creation: not measured, {keys} keys and {CREATIONS} more pass the directory's bound");
    } else {
        let (first, after) = creation_medians(&start(&empty), &start(&full));
        println!(
            "key creation, median of {CREATIONS}: {first:?} from the first key, {after:?} after {keys} keys ({:.2}x)",
            after.as_secs_f64() / first.as_secs_f64()
        );
    }
    let registry = std::fs::read_to_string(full.join("limits.json")).unwrap_or_default();
    println!(
        "registry file after the creations: {} bytes, {} key limits",
        registry.len(),
        registry.matches("\"key:").count()
    );
    let _ = std::fs::remove_dir_all(&root);
}
