//! The server benchmark (BENCHMARKS.md, "Server"). Starts the real `ratelimiterd`
//! binary on loopback and drives it over keep-alive HTTP/1.1 connections.
//!
//! `throughput`: in one run, alternating rounds of (a) the JSON echo route, the
//! reference for the cost of HTTP and JSON alone, and (b) reserve+complete pairs
//! of an LLM-shaped lease (rpm, tpm, concurrency, tenant budget); then an
//! open-loop run of pairs at half the measured maximum, reporting latency
//! percentiles measured from each request's scheduled start (no coordinated
//! omission).
//!
//! `memory`: the server's resident memory with 10,000 limits and 100,000
//! outstanding reservations.
//!
//! `reservations` (needs `--features tigerbeetle`; BENCHMARKS.md, "TigerBeetle
//! backend"): reserve-only reservations of four linked transfers per second
//! through the server on the TigerBeetle backend, submitter on and off, against
//! the same chains sent straight to the cluster by the Rust client, closed and
//! open loop; see `loadgen/reservations.rs`.
//!
//! ```sh
//! cargo build --release -p ratelimiterd --bin ratelimiterd --example loadgen
//! target/release/examples/loadgen throughput
//! target/release/examples/loadgen memory
//! cargo build --release -p ratelimiterd --features tigerbeetle --bin ratelimiterd --example loadgen
//! target/release/examples/loadgen reservations --tigerbeetle 127.0.0.1:3950
//! ```

#[cfg(feature = "tigerbeetle")]
#[path = "loadgen/reservations.rs"]
mod reservations;
#[cfg(feature = "tigerbeetle")]
#[path = "loadgen/resources.rs"]
mod resources;
#[cfg(feature = "tigerbeetle")]
#[path = "support/tb_reference.rs"]
mod tb_reference;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::client::conn::http1::SendRequest;
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use ratelimiter::tigerbeetle::ConfigFields;
use ratelimiter::{LeaseId, LimitDefinition, LimitKey, LimitState};

/// Longest wait for the server to start.
const STARTUP_WAIT_MAX: Duration = Duration::from_secs(30);
/// Latency samples kept per run: enough for a stable p99.9, bounded memory.
const SAMPLES_MAX: usize = 2_000_000;

#[derive(Debug, Clone)]
struct Options {
    bin: PathBuf,
    connections: usize,
    seconds: f64,
    rounds: usize,
    limits: usize,
    reservations: usize,
    /// Replica addresses (comma-separated): run the server on the TigerBeetle
    /// backend against them instead of the memory backend.
    tigerbeetle: Option<String>,
    /// The TigerBeetle backend's `submit_mode`.
    submit_mode: String,
    /// The TigerBeetle backend's client sessions (and the reference client's).
    sessions: u32,
    /// The TigerBeetle backend's `flush_interval_micros`, when not the default.
    flush_micros: Option<u64>,
    /// The TigerBeetle backend's `max_batch_events`, when not the default.
    batch_events: Option<u32>,
    /// `reservations`: the offered rate of the open loop, reservations per second.
    rate: f64,
    /// `reservations`: the connections (or reference workers) of the open loop.
    open_connections: usize,
    /// `reservations`: the replica's process id, to measure its CPU.
    replica_pid: Option<u32>,
    /// `reservations`: the variants measured, in order: client, direct, batching.
    variants: Vec<String>,
    /// `reservations`: the loops run, `closed`, `open` or both.
    loops: Vec<String>,
    /// `reservations`: every limit's window (and hold timeout) in seconds, after
    /// which the never-completed reservations expire.
    window_seconds: u32,
}

fn parse_options() -> (String, Options) {
    let mut args = std::env::args().skip(1);
    let mode = args.next().unwrap_or_else(|| usage("missing mode"));
    let mut options = Options {
        bin: PathBuf::from("target/release/ratelimiterd"),
        connections: 32,
        seconds: 3.0,
        rounds: 3,
        limits: 10_000,
        reservations: 100_000,
        tigerbeetle: None,
        submit_mode: "batching".to_owned(),
        sessions: ConfigFields::default().sessions,
        flush_micros: None,
        batch_events: None,
        rate: 10_000.0,
        open_connections: 256,
        replica_pid: None,
        variants: ["client", "direct", "batching"].map(str::to_owned).to_vec(),
        window_seconds: 1,
        loops: vec!["closed".to_owned(), "open".to_owned()],
    };
    while let Some(flag) = args.next() {
        let value = args.next().unwrap_or_else(|| usage(&format!("{flag} needs a value")));
        let number = || {
            value
                .parse::<f64>()
                .unwrap_or_else(|_| usage(&format!("{flag}: not a number")))
        };
        match flag.as_str() {
            "--bin" => options.bin = PathBuf::from(&value),
            "--connections" => options.connections = number() as usize,
            "--seconds" => options.seconds = number(),
            "--rounds" => options.rounds = number() as usize,
            "--limits" => options.limits = number() as usize,
            "--reservations" => options.reservations = number() as usize,
            "--tigerbeetle" => options.tigerbeetle = Some(value.clone()),
            "--submit-mode" => options.submit_mode = value.clone(),
            "--sessions" => options.sessions = number() as u32,
            "--flush-micros" => options.flush_micros = Some(number() as u64),
            "--batch-events" => options.batch_events = Some(number() as u32),
            "--rate" => options.rate = number(),
            "--open-connections" => options.open_connections = number() as usize,
            "--replica-pid" => options.replica_pid = Some(number() as u32),
            "--variants" => options.variants = value.split(',').map(str::to_owned).collect(),
            "--window-seconds" => options.window_seconds = number() as u32,
            "--loops" => options.loops = value.split(',').map(str::to_owned).collect(),
            _ => usage(&format!("unknown flag {flag}")),
        }
    }
    (mode, options)
}

fn usage(problem: &str) -> ! {
    eprintln!(
        "loadgen: {problem}\nusage: loadgen throughput|memory|reservations [--bin PATH] [--connections N] \
         [--seconds S] [--rounds N] [--limits N] [--reservations N] [--tigerbeetle ADDRESSES] \
         [--submit-mode batching|direct] [--sessions N] [--flush-micros N] [--batch-events N] \
         [--rate R] [--open-connections N] [--replica-pid PID] [--variants client,direct,batching[:servers=N][:bin=PATH]] \
         [--window-seconds N] [--loops closed,open]"
    );
    std::process::exit(2)
}

/// The server under test, killed on drop.
struct Server {
    child: Child,
    addr: SocketAddr,
    dir: PathBuf,
}

impl Server {
    fn start(options: &Options, states: &[LimitState], leases_max: usize) -> Server {
        static STARTED: AtomicUsize = AtomicUsize::new(0);
        let bin = &options.bin;
        let n = STARTED.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("ratelimiterd-loadgen-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let registry = dir.join("limits.json");
        ratelimiter::registry::save(&registry, states).unwrap();
        let config = dir.join("config.yaml");
        std::fs::write(
            &config,
            format!(
                "server:\n  listen_addr: \"127.0.0.1:0\"\n  backend: {}\n  echo_route: true\n  concurrent_requests_max: 100000\n\
                 registry:\n  path: {}\nmemory:\n  leases_max: {leases_max}\nlog:\n  level: \"warn,ratelimiterd::server=info\"\n{}",
                if options.tigerbeetle.is_some() { "tigerbeetle" } else { "memory" },
                registry.display(),
                tigerbeetle_yaml(options)
            ),
        )
        .unwrap();
        let mut child = Command::new(bin)
            .arg("--config")
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e} (build it with --release first)", bin.display()));
        let stderr = child.stderr.take().unwrap();
        // Owned by a `Server` at once, so a failed start still kills the process.
        let mut server = Server {
            child,
            addr: SocketAddr::from(([0, 0, 0, 0], 0)),
            dir,
        };
        let (sender, receiver) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let _ = sender.send(line);
            }
        });
        let deadline = Instant::now() + STARTUP_WAIT_MAX;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = receiver.recv_timeout(left).expect("the server starts in time");
            if let Some(rest) = line.split("addr=").nth(1).filter(|_| line.contains("listening")) {
                server.addr = rest.split_whitespace().next().unwrap().parse().unwrap();
                return server;
            }
        }
    }

    /// Resident and peak resident memory, in KiB.
    fn rss_kib(&self) -> (u64, u64) {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        let field = |name: &str| {
            status
                .lines()
                .find(|l| l.starts_with(name))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
                .unwrap_or(0)
        };
        (field("VmRSS:"), field("VmHWM:"))
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

async fn connect(addr: SocketAddr) -> SendRequest<Full<Bytes>> {
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream.set_nodelay(true).unwrap();
    let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(connection);
    sender
}

/// Sends one request and reads the whole answer; panics on an unexpected status.
async fn call(sender: &mut SendRequest<Full<Bytes>>, path: &'static str, body: String) -> Bytes {
    sender.ready().await.unwrap();
    let request = Request::builder()
        .method(Method::POST)
        .uri(path)
        .header("host", "bench")
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body)))
        .unwrap();
    let response = sender.send_request(request).await.unwrap();
    let status = response.status();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(status, StatusCode::OK, "{path}: {}", String::from_utf8_lossy(&bytes));
    bytes
}

const KEYS: [&str; 4] = [
    "bench:rpm",
    "bench:tpm",
    "bench:inflight",
    "tenant:bench:llm:daily_tokens",
];

/// The configuration that puts the server on the TigerBeetle backend, if asked.
fn tigerbeetle_yaml(options: &Options) -> String {
    let Some(addresses) = &options.tigerbeetle else {
        return String::new();
    };
    let list: Vec<String> = addresses.split(',').map(|a| format!("\"{a}\"")).collect();
    let mut yaml = format!(
        "tigerbeetle:\n  addresses: [{}]\n  sessions: {}\n  submit_mode: {}\n",
        list.join(", "),
        options.sessions,
        options.submit_mode
    );
    if let Some(micros) = options.flush_micros {
        yaml.push_str(&format!("  flush_interval_micros: {micros}\n"));
    }
    if let Some(events) = options.batch_events {
        yaml.push_str(&format!("  max_batch_events: {events}\n"));
    }
    yaml
}

fn bench_limits() -> Vec<LimitState> {
    // Capacities far above what a run can use: the benchmark measures the cost of
    // deciding, not of denying.
    let big = 1_000_000_000_000;
    let key = |k: &str| LimitKey::new(k).unwrap();
    vec![
        LimitState::active(LimitDefinition::rolling(key(KEYS[0]), big, 60).unwrap()),
        LimitState::active(LimitDefinition::rolling(key(KEYS[1]), big, 60).unwrap()),
        LimitState::active(LimitDefinition::concurrency(key(KEYS[2]), big, 300).unwrap()),
        LimitState::active(LimitDefinition::rolling(key(KEYS[3]), big, 86_400).unwrap()),
    ]
}

fn reserve_body(lease: &str) -> String {
    format!(
        r#"{{"lease_id":"{lease}","requirements":[{{"key":"{}","amount":1}},{{"key":"{}","amount":1800}},{{"key":"{}","amount":1}},{{"key":"{}","amount":1800}}]}}"#,
        KEYS[0], KEYS[1], KEYS[2], KEYS[3]
    )
}

fn complete_body(lease: &str) -> String {
    format!(
        r#"{{"lease_id":"{lease}","actuals":[{{"key":"{}","actual_amount":740}},{{"key":"{}","actual_amount":740}}]}}"#,
        KEYS[1], KEYS[3]
    )
}

/// What one connection does once: an echo, or a reserve then a complete.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Work {
    Echo,
    Pair,
}

async fn do_work(sender: &mut SendRequest<Full<Bytes>>, work: Work) {
    let lease = LeaseId::generate().to_string();
    match work {
        // The echo carries the reserve body: same bytes in, parsed as JSON, sent back.
        Work::Echo => drop(call(sender, "/v1/echo", reserve_body(&lease)).await),
        Work::Pair => {
            let answer = call(sender, "/v1/reserve", reserve_body(&lease)).await;
            assert!(
                answer.starts_with(br#"{"allowed":true"#),
                "{}",
                String::from_utf8_lossy(&answer)
            );
            call(sender, "/v1/complete", complete_body(&lease)).await;
        }
    }
}

/// Closed loop: every connection does `work` back to back for `seconds`.
/// Returns operations per second.
async fn closed_loop(addr: SocketAddr, connections: usize, seconds: f64, work: Work) -> f64 {
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for _ in 0..connections {
        let stop = stop.clone();
        tasks.push(tokio::spawn(async move {
            let mut sender = connect(addr).await;
            let mut done = 0u64;
            while !stop.load(Ordering::Relaxed) {
                do_work(&mut sender, work).await;
                done += 1;
            }
            done
        }));
    }
    let started = Instant::now();
    tokio::time::sleep(Duration::from_secs_f64(seconds)).await;
    stop.store(true, Ordering::Relaxed);
    let mut total = 0;
    for task in tasks {
        total += task.await.unwrap();
    }
    total as f64 / started.elapsed().as_secs_f64()
}

/// Open loop: pairs started on a fixed schedule at `rate` per second in total;
/// each request's latency counts from when it was due, so a stalled server
/// shows as latency rather than as a lower rate. Returns latencies in µs of
/// reserve from when it was due, reserve from when it was sent, and complete.
async fn open_loop(addr: SocketAddr, connections: usize, seconds: f64, rate: f64) -> [Vec<u64>; 3] {
    let per_connection = rate / connections as f64;
    let interval = Duration::from_secs_f64(1.0 / per_connection);
    let count = (seconds * per_connection) as usize;
    let mut tasks = Vec::new();
    let start = tokio::time::Instant::now() + Duration::from_millis(50);
    for c in 0..connections {
        tasks.push(tokio::spawn(async move {
            let mut sender = connect(addr).await;
            let offset = interval.mul_f64(c as f64 / connections as f64);
            let mut reserve = Vec::with_capacity(count);
            let mut reserve_sent = Vec::with_capacity(count);
            let mut complete = Vec::with_capacity(count);
            for i in 0..count.min(SAMPLES_MAX / connections) {
                let due = start + offset + interval * i as u32;
                tokio::time::sleep_until(due).await;
                let lease = LeaseId::generate().to_string();
                let sent = tokio::time::Instant::now();
                call(&mut sender, "/v1/reserve", reserve_body(&lease)).await;
                reserve.push(due.elapsed().as_micros() as u64);
                reserve_sent.push(sent.elapsed().as_micros() as u64);
                let sent = tokio::time::Instant::now();
                call(&mut sender, "/v1/complete", complete_body(&lease)).await;
                complete.push(sent.elapsed().as_micros() as u64);
            }
            [reserve, reserve_sent, complete]
        }));
    }
    let mut all: [Vec<u64>; 3] = Default::default();
    for task in tasks {
        for (into, from) in all.iter_mut().zip(task.await.unwrap()) {
            into.extend(from);
        }
    }
    for samples in &mut all {
        samples.sort_unstable();
    }
    all
}

fn percentile(sorted: &[u64], p: f64) -> u64 {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

async fn throughput(options: &Options) {
    let server = Server::start(options, &bench_limits(), 100_000);
    let addr = server.addr;
    println!(
        "server {addr}, {} connections, {} s per phase, {} rounds",
        options.connections, options.seconds, options.rounds
    );
    // Warm-up: connections, allocator, caches.
    closed_loop(addr, options.connections, 1.0, Work::Pair).await;
    closed_loop(addr, options.connections, 1.0, Work::Echo).await;
    let mut ratios = Vec::new();
    let mut pair_rates = Vec::new();
    for round in 1..=options.rounds {
        let echo = closed_loop(addr, options.connections, options.seconds, Work::Echo).await;
        let pairs = closed_loop(addr, options.connections, options.seconds, Work::Pair).await;
        let ratio = pairs / echo;
        pair_rates.push(pairs);
        ratios.push(ratio);
        println!(
            "round {round}: echo {echo:.0} req/s, reserve+complete {pairs:.0} pairs/s, ratio {:.1}%",
            ratio * 100.0
        );
    }
    ratios.sort_by(f64::total_cmp);
    println!("median ratio pairs/echo: {:.1}%", ratios[ratios.len() / 2] * 100.0);
    pair_rates.sort_by(f64::total_cmp);
    let rate = pair_rates[pair_rates.len() / 2] / 2.0;
    // Neighbours on a shared machine come and go: the latency phase is repeated
    // and each run reported, with the median p99 of the runs.
    let mut p99s = Vec::new();
    for run in 1..=options.rounds {
        let before = server_histogram(addr).await;
        let [reserve, reserve_sent, complete] = open_loop(addr, options.connections, options.seconds, rate).await;
        let after = server_histogram(addr).await;
        println!(
            "open loop {run} at {rate:.0} pairs/s (half the median maximum), {} pairs:",
            reserve.len()
        );
        for (name, samples) in [
            ("reserve from due", &reserve),
            ("reserve from sent", &reserve_sent),
            ("complete from sent", &complete),
        ] {
            println!(
                "  {name}: p50 {} µs, p99 {} µs, p99.9 {} µs, max {} µs",
                percentile(samples, 0.5),
                percentile(samples, 0.99),
                percentile(samples, 0.999),
                samples[samples.len() - 1]
            );
        }
        println!(
            "  reserve, server side: p50 <= {} ms, p99 <= {} ms, p99.9 <= {} ms (histogram bucket bounds)",
            histogram_percentile(&before, &after, 0.5) * 1e3,
            histogram_percentile(&before, &after, 0.99) * 1e3,
            histogram_percentile(&before, &after, 0.999) * 1e3
        );
        p99s.push((percentile(&reserve_sent, 0.99), percentile(&complete, 0.99)));
    }
    p99s.sort_unstable();
    let (reserve_p99, complete_p99) = p99s[p99s.len() / 2];
    println!("median over runs of p99 from sent: reserve {reserve_p99} µs, complete {complete_p99} µs");
}

/// The server's own reserve latency histogram: (upper bound in seconds, cumulative count).
async fn server_histogram(addr: SocketAddr) -> Vec<(f64, u64)> {
    histogram(
        &scrape_metrics(addr).await,
        "ratelimiterd_request_duration_seconds_bucket{endpoint=\"reserve\",",
    )
}

/// The server's `/metrics` text.
async fn scrape_metrics(addr: SocketAddr) -> String {
    let mut sender = connect(addr).await;
    sender.ready().await.unwrap();
    let request = Request::builder()
        .uri("/metrics")
        .header("host", "bench")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let response = sender.send_request(request).await.unwrap();
    let text = response.into_body().collect().await.unwrap().to_bytes();
    String::from_utf8_lossy(&text).into_owned()
}

/// The buckets of one histogram in a `/metrics` text: (upper bound in seconds,
/// cumulative count). `prefix` is the bucket line up to the `le` label.
fn histogram(text: &str, prefix: &str) -> Vec<(f64, u64)> {
    let prefix = format!("{prefix}le=\"");
    text.lines()
        .filter_map(|line| line.strip_prefix(prefix.as_str()))
        .filter_map(|rest| {
            let (bound, count) = rest.split_once("\"} ")?;
            Some((bound.parse().unwrap_or(f64::INFINITY), count.parse().ok()?))
        })
        .collect()
}

/// The smallest bucket bound under which `p` of the observations between two
/// snapshots fall.
fn histogram_percentile(before: &[(f64, u64)], after: &[(f64, u64)], p: f64) -> f64 {
    let total = after.last().map_or(0, |b| b.1) - before.last().map_or(0, |b| b.1);
    let wanted = (total as f64 * p).ceil() as u64;
    before
        .iter()
        .zip(after)
        .find(|((_, a), (_, b))| b - a >= wanted)
        .map_or(f64::INFINITY, |(_, (bound, _))| *bound)
}

async fn memory(options: &Options) {
    // Half rolling (1 h window), half concurrency (1 h timeout), so every
    // reservation below is still outstanding when memory is read.
    let limits: Vec<LimitState> = (0..options.limits)
        .map(|i| {
            let key = LimitKey::new(format!("tenant:t{i}:llm:budget")).unwrap();
            let definition = if i % 2 == 0 {
                LimitDefinition::rolling(key, 1_000_000, 3_600).unwrap()
            } else {
                LimitDefinition::concurrency(key, 1_000_000, 3_600).unwrap()
            };
            LimitState::active(definition)
        })
        .collect();
    let empty = Server::start(options, &[], options.reservations * 2);
    let (empty_rss, _) = empty.rss_kib();
    drop(empty);
    let server = Server::start(options, &limits, options.reservations * 2);
    let (limits_rss, _) = server.rss_kib();
    let addr = server.addr;
    let per_connection = options.reservations / options.connections;
    let limits_count = options.limits;
    let mut tasks = Vec::new();
    for c in 0..options.connections {
        tasks.push(tokio::spawn(async move {
            let mut sender = connect(addr).await;
            for i in 0..per_connection {
                let n = c * per_connection + i;
                // Each lease holds one rolling and one concurrency limit.
                let (a, b) = ((2 * n) % limits_count, (2 * n + 1) % limits_count);
                let body = format!(
                    r#"{{"lease_id":"{}","requirements":[{{"key":"tenant:t{a}:llm:budget","amount":100}},{{"key":"tenant:t{b}:llm:budget","amount":1}}]}}"#,
                    LeaseId::generate()
                );
                let answer = call(&mut sender, "/v1/reserve", body).await;
                assert!(answer.starts_with(br#"{"allowed":true"#));
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let outstanding = per_connection * options.connections;
    let (rss, hwm) = server.rss_kib();
    println!(
        "RSS, empty server:                     {:>8.1} MiB",
        empty_rss as f64 / 1024.0
    );
    println!(
        "RSS, {} limits:                     {:>8.1} MiB",
        options.limits,
        limits_rss as f64 / 1024.0
    );
    println!(
        "RSS, {} limits + {outstanding} outstanding: {:>8.1} MiB (peak {:.1} MiB)",
        options.limits,
        rss as f64 / 1024.0,
        hwm as f64 / 1024.0
    );
    println!(
        "per outstanding reservation (2 requirements): {:.0} bytes",
        (rss.saturating_sub(limits_rss) * 1024) as f64 / outstanding as f64
    );
}

fn main() {
    let (mode, options) = parse_options();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        match mode.as_str() {
            "throughput" => throughput(&options).await,
            "memory" => memory(&options).await,
            #[cfg(feature = "tigerbeetle")]
            "reservations" => reservations::run(&options).await,
            #[cfg(not(feature = "tigerbeetle"))]
            "reservations" => usage("reservations needs --features tigerbeetle"),
            other => usage(&format!("unknown mode {other}")),
        }
    });
}
