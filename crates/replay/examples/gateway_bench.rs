//! The gateway benchmark (BENCHMARKS.md, "Gateway"): in one run, the same calls
//! sent straight to `provider-sim` and through `ratelimiterd`'s gateway (memory
//! backend) in front of that same simulator, alternating rounds so the machine's
//! noise falls on both alike.
//!
//! - latency added at a fixed offered rate (open loop, measured from each call's
//!   scheduled start, so a stall is not hidden by the calls that wait behind it):
//!   non-streaming chat completions, p50 and p99 of each path and their difference;
//! - time to first token of streamed chat completions (first content chunk);
//! - the highest rate each path serves (closed loop), and their ratio;
//! - the CPU each process spends per call (load generator, simulator, gateway),
//!   from `/proc/<pid>/stat` before and after each non-streamed phase: what a call
//!   costs the machine, which the closed loop's ratio is the inverse of.
//!
//! `--baseline-bin DIR` runs a second `ratelimiterd` (another build, e.g. main's)
//! as a third path in the same rounds (the two servers' order alternating by
//! round), so a change is measured against its base under the same noise, and
//! prints each figure's after / before ratio per round as a median and spread; `--snapshots off` turns the servers' memory snapshots off.
//! `--money on` sends the new server's calls with a key of a tenant made through its
//! admin API, with a budget in dollars (`gateway_bench/money.rs`); a baseline from
//! before keys and money serves its plain configuration.
//! `--otel on` has the new server export every call's trace and the GenAI
//! metrics over OTLP to a sink in the bench's process, `--otel down` to a port
//! where nothing listens (`gateway_bench/otel.rs`); with the same build as
//! `--baseline-bin`, the ratios are what the export costs a call.
//! `--count instructions` runs the servers under valgrind's callgrind and counts
//! the instructions a server executes per call instead of its CPU time: a figure
//! the machine's noise does not move (`gateway_bench/instructions.rs`; lower the
//! rates to match callgrind's pace, e.g. `--rate 20 --stream-rate 4`).
//! `--server-cpu N` pins the servers to CPU N (with `taskset`); run the bench itself
//! under `taskset -c M` (its simulators inherit it) to give the gateway a core of its
//! own, as in a deployment where the gateway does not share cores with its callers and
//! the provider, so that the latency it adds is its own work, not their contention.
//!
//! ```sh
//! cargo build --release -p ratelimiterd --bin ratelimiterd -p replay --bin provider-sim --example gateway_bench
//! target/release/examples/gateway_bench --bin-dir target/release [--baseline-bin /path/to/old/release]
//! ```

mod bench_support;
#[path = "gateway_bench/cpu.rs"]
mod cpu;
#[path = "gateway_bench/instructions.rs"]
mod instructions;
#[path = "gateway_bench/meter.rs"]
mod meter;
#[path = "gateway_bench/money.rs"]
mod money;
#[path = "gateway_bench/otel.rs"]
mod otel;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::client::conn::http1::SendRequest;
use hyper::{Method, Request};
use hyper_util::rt::TokioIo;

use bench_support::flags::Flags;
use bench_support::{free_port, wait_listening, Process};
use cpu::{clock_ticks_per_second, Pids};
use meter::Meter;

/// Latency samples kept per phase: a bound on memory, far above a phase's calls.
const SAMPLES_MAX: usize = 4_000_000;
/// The model of non-streamed calls, on a simulator that answers at once.
const MODEL: &str = "gpt-4o-mini";
/// The model of streamed calls, on a simulator that writes a token per ms: a
/// gateway that buffered a stream would show its whole length as time to first token.
const STREAM_MODEL: &str = "gpt-4o";
/// The paced simulator's time per output token, in ms.
const STREAM_MS_PER_TOKEN: u64 = 1;
/// Output tokens of a streamed call: enough events to be a stream.
const STREAM_TOKENS: u64 = 16;

/// The flags, as the usage line shows them.
const USAGE: &str = "[--bin-dir DIR] [--baseline-bin DIR] [--snapshots on|off] [--money on|off] [--otel off|on|down] [--count cpu|instructions] [--server-cpu N] [--rate N] [--stream-rate N] [--seconds S] [--rounds N] [--connections N]";

#[derive(Debug, Clone)]
struct Options {
    bin_dir: PathBuf,
    baseline_bin: Option<PathBuf>,
    snapshots: bool,
    /// Whether the new server's calls carry a tenant key with a budget (`money.rs`).
    money: bool,
    /// Where the new server exports its traces and metrics (`otel.rs`).
    otel: otel::Otel,
    /// Whether the servers run under callgrind, counted in instructions (`instructions.rs`).
    count_instructions: bool,
    /// The CPU the servers are pinned to, if any.
    server_cpu: Option<usize>,
    rate: f64,
    seconds: f64,
    rounds: usize,
    connections: usize,
    stream_rate: f64,
}

fn parse_options() -> Options {
    let mut options = Options {
        bin_dir: PathBuf::from("target/release"),
        baseline_bin: None,
        snapshots: true,
        money: false,
        otel: otel::Otel::Off,
        count_instructions: false,
        server_cpu: None,
        rate: 1_000.0,
        seconds: 5.0,
        rounds: 3,
        connections: 64,
        stream_rate: 200.0,
    };
    let mut flags = Flags::from_env("gateway_bench", USAGE);
    while let Some((flag, value)) = flags.next() {
        let number = || flags.parse::<f64>(&flag, &value, "a number");
        match flag.as_str() {
            "--bin-dir" => options.bin_dir = PathBuf::from(&value),
            "--baseline-bin" => options.baseline_bin = Some(PathBuf::from(&value)),
            "--snapshots" => {
                options.snapshots = match value.as_str() {
                    "on" => true,
                    "off" => false,
                    _ => flags.fail("--snapshots: on or off"),
                }
            }
            "--money" => {
                options.money = match value.as_str() {
                    "on" => true,
                    "off" => false,
                    _ => flags.fail("--money: on or off"),
                }
            }
            "--otel" => {
                options.otel = otel::Otel::parse(&value).unwrap_or_else(|| flags.fail("--otel: off, on or down"))
            }
            "--count" => {
                options.count_instructions = match value.as_str() {
                    "cpu" => false,
                    "instructions" => true,
                    _ => flags.fail("--count: cpu or instructions"),
                }
            }
            "--server-cpu" => options.server_cpu = Some(number() as usize),
            "--rate" => options.rate = number(),
            "--seconds" => options.seconds = number(),
            "--rounds" => options.rounds = number() as usize,
            "--connections" => options.connections = number() as usize,
            "--stream-rate" => options.stream_rate = number(),
            _ => flags.fail(&format!("unknown flag {flag}")),
        }
    }
    let valid = options.rate > 0.0
        && options.stream_rate > 0.0
        && (0.5..=600.0).contains(&options.seconds)
        && (1..=100).contains(&options.rounds)
        && (1..=1_024).contains(&options.connections);
    if !valid {
        flags.fail("rates > 0, --seconds 0.5..=600, --rounds 1..=100, --connections 1..=1024");
    }
    if options.count_instructions && (options.server_cpu.is_some() || !instructions::available()) {
        flags.fail("--count instructions: needs valgrind and callgrind_control, and no --server-cpu");
    }
    options
}

/// provider-sim with limits far above the load, writing a token per `ms_per_token`.
fn start_sim(options: &Options, ms_per_token: u64) -> (Process, SocketAddr) {
    let ms_per_token = ms_per_token.to_string();
    let args = [
        "--rpm",
        "1000000000",
        "--tpm",
        "1000000000000",
        "--concurrency",
        "100000",
    ];
    bench_support::start_sim(
        &options.bin_dir,
        &[&args[..], &["--ms-per-output-token", &ms_per_token]].concat(),
    )
}

/// ratelimiterd, memory backend, with a gateway whose model has limits far above the
/// load: every call is reserved and reconciled, none is refused.
/// A started server: its process, its gateway's address and its API's (for `/metrics`).
struct Server {
    process: Process,
    gateway: SocketAddr,
    api: SocketAddr,
}

fn start_gateway(
    options: &Options,
    (bin_dir, env): (&Path, &[(String, String)]),
    sims: [SocketAddr; 2],
    directory: &Path,
) -> Server {
    std::fs::create_dir_all(directory).expect("a temporary directory");
    let (api_port, gateway_port) = (free_port(), free_port());
    // 0 turns the periodic snapshots off; 1,000 ms is the server's default.
    let snapshot_interval_ms = if options.snapshots { 1_000 } else { 0 };
    let mut config = format!(
        "server:\n  listen_addr: \"127.0.0.1:{api_port}\"\nregistry:\n  path: \"{}\"\nmemory:\n  snapshot_interval_ms: {snapshot_interval_ms}\nlog:\n  level: warn\ngateway:\n  listen_addr: \"127.0.0.1:{gateway_port}\"\n  allow_anonymous: true\n  upstreams:\n",
        directory.join("limits.json").display()
    );
    for (name, sim) in ["fast", "paced"].iter().zip(sims) {
        config += &format!("    - name: {name}\n      kind: openai\n      base_url: \"http://{sim}\"\n");
    }
    config += "  models:\n";
    for (model, upstream) in [(MODEL, "fast"), (STREAM_MODEL, "paced")] {
        config += &format!(
            "    - name: {model}\n      upstream: {upstream}\n      rpm: 1000000000\n      tpm: 1000000000000\n      concurrency: 100000\n      max_output_tokens_default: 16\n      max_wait_ms: 0\n"
        );
    }
    let path = directory.join("ratelimiterd.yaml");
    std::fs::write(&path, config).expect("the config is written");
    let binary = bin_dir.join("ratelimiterd");
    let mut command = match options.server_cpu {
        _ if options.count_instructions => instructions::command(&binary, directory),
        Some(cpu) => {
            let mut taskset = Command::new("taskset");
            taskset.arg("-c").arg(cpu.to_string()).arg(&binary);
            taskset
        }
        None => Command::new(&binary),
    };
    let mut child = command
        .envs(env.iter().cloned())
        .arg("--config")
        .arg(&path)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("ratelimiterd starts (build it with --release)");
    // Drain its log so a full pipe never blocks it.
    let stderr = child.stderr.take().expect("piped");
    std::thread::spawn(move || for _ in BufReader::new(stderr).lines() {});
    let addr: SocketAddr = format!("127.0.0.1:{gateway_port}").parse().expect("an address");
    wait_listening(addr);
    Server {
        process: Process(child),
        gateway: addr,
        api: format!("127.0.0.1:{api_port}").parse().expect("an address"),
    }
}

/// The snapshot pauses a server saw (the copy under the backend's lock that
/// reserves and completes wait for): count, total and the bucket of the longest,
/// from its `/metrics`.
async fn snapshot_pauses(api: SocketAddr) -> String {
    let mut sender = connect(api).await;
    let request = Request::builder()
        .uri("/metrics")
        .header("host", api.to_string())
        .body(Full::new(Bytes::new()))
        .expect("a request");
    let Ok(response) = sender.send_request(request).await else {
        return "no metrics".to_owned();
    };
    let body = response
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let text = String::from_utf8_lossy(&body);
    let name = "ratelimiterd_memory_snapshot_pause_seconds";
    let value = |suffix: &str| {
        (text.lines())
            .find(|l| l.starts_with(&format!("{name}_{suffix} ")))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    let (count, sum) = (value("count"), value("sum"));
    // The first bucket holding every pause bounds the longest.
    let longest = (text.lines())
        .filter(|l| l.starts_with(&format!("{name}_bucket{{")))
        .find(|l| l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()) == Some(count))
        .and_then(|l| l.split("le=\"").nth(1))
        .and_then(|l| l.split('"').next())
        .unwrap_or("?")
        .to_owned();
    format!(
        "{count} snapshot pauses, mean {:.2} ms, longest <= {longest} s",
        if count > 0.0 { sum * 1000.0 / count } else { 0.0 }
    )
}

/// One keep-alive HTTP/1.1 connection.
async fn connect(addr: SocketAddr) -> SendRequest<Full<Bytes>> {
    let stream = tokio::net::TcpStream::connect(addr).await.expect("connects");
    stream.set_nodelay(true).expect("nodelay");
    let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .expect("handshake");
    tokio::spawn(connection);
    sender
}

fn chat_body(stream: bool) -> Bytes {
    let (model, output) = if stream {
        (STREAM_MODEL, STREAM_TOKENS)
    } else {
        (MODEL, 1)
    };
    Bytes::from(format!(
        r#"{{"model":"{model}","messages":[{{"role":"user","content":"the cat sat off her red mat"}}],"max_tokens":{output},"stream":{stream}}}"#
    ))
}

/// The first token of a streamed chat completion (the role chunk before it has
/// empty content).
const FIRST_TOKEN: &[u8] = b"\"content\":\"the ";

/// Sends one call; returns when the whole answer (or, for a stream, its first
/// token) has arrived, relative to `since`.
async fn call(
    sender: &mut SendRequest<Full<Bytes>>,
    (addr, key): (SocketAddr, Option<&str>),
    body: &Bytes,
    stream: bool,
    since: Instant,
) -> Duration {
    sender.ready().await.expect("the connection stays up");
    let mut request = Request::builder()
        .method(Method::POST)
        .uri("/v1/chat/completions")
        .header("host", addr.to_string())
        .header("content-type", "application/json");
    if let Some(key) = key {
        request = request.header("authorization", format!("Bearer {key}"));
    }
    let request = request.body(Full::new(body.clone())).expect("a request");
    let response = sender.send_request(request).await.expect("an answer");
    assert_eq!(response.status(), 200, "every call is served");
    let mut body = response.into_body();
    let mut first_token = None;
    let mut seen = Vec::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.expect("the body arrives");
        if let (true, None, Some(data)) = (stream, first_token, frame.data_ref()) {
            seen.extend_from_slice(data);
            if seen.windows(FIRST_TOKEN.len()).any(|w| w == FIRST_TOKEN) {
                first_token = Some(since.elapsed());
            }
        }
    }
    first_token.unwrap_or_else(|| since.elapsed())
}

/// Open loop at `rate` for `seconds` over `connections`: each connection sends its
/// share of a fixed schedule; latency counts from the scheduled start.
async fn open_loop(
    (addr, key): (SocketAddr, Option<Arc<str>>),
    rate: f64,
    seconds: f64,
    connections: usize,
    stream: bool,
) -> Vec<u64> {
    let total = (rate * seconds) as usize;
    let start = Instant::now() + Duration::from_millis(50);
    let body = chat_body(stream);
    let mut workers = Vec::with_capacity(connections);
    for worker in 0..connections {
        let (body, key) = (body.clone(), key.clone());
        workers.push(tokio::spawn(async move {
            let mut sender = connect(addr).await;
            let mut samples = Vec::new();
            for i in (worker..total).step_by(connections) {
                let scheduled = start + Duration::from_secs_f64(i as f64 / rate);
                tokio::time::sleep_until(scheduled.into()).await;
                let latency = call(&mut sender, (addr, key.as_deref()), &body, stream, scheduled).await;
                samples.push(latency.as_micros() as u64);
            }
            samples
        }));
    }
    let mut samples = Vec::new();
    for worker in workers {
        samples.extend(worker.await.expect("a worker"));
    }
    samples.truncate(SAMPLES_MAX);
    samples.sort_unstable();
    samples
}

/// Closed loop: `connections` callers back to back for `seconds`; calls per
/// second, and every call made (those still in flight at the stop included).
async fn closed_loop((addr, key): (SocketAddr, Option<Arc<str>>), seconds: f64, connections: usize) -> (f64, u64) {
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let body = chat_body(false);
    let mut workers = Vec::new();
    for _ in 0..connections {
        let (stop, done, body, key) = (Arc::clone(&stop), Arc::clone(&done), body.clone(), key.clone());
        workers.push(tokio::spawn(async move {
            let mut sender = connect(addr).await;
            while !stop.load(Ordering::Relaxed) {
                call(&mut sender, (addr, key.as_deref()), &body, false, Instant::now()).await;
                done.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    let started = Instant::now();
    tokio::time::sleep(Duration::from_secs_f64(seconds)).await;
    let counted = done.load(Ordering::Relaxed);
    let elapsed = started.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    for worker in workers {
        worker.await.expect("a worker");
    }
    (counted as f64 / elapsed, done.load(Ordering::Relaxed))
}

fn percentile(sorted: &[u64], p: f64) -> u64 {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// The p50 and p99 of each round, in µs, and their median over rounds.
#[derive(Default)]
struct Figures {
    p50: Vec<u64>,
    p99: Vec<u64>,
}

impl Figures {
    fn add(&mut self, sorted: &[u64]) {
        self.p50.push(percentile(sorted, 0.50));
        self.p99.push(percentile(sorted, 0.99));
    }

    fn median(values: &[u64]) -> u64 {
        let mut values = values.to_vec();
        values.sort_unstable();
        values[values.len() / 2]
    }
}

fn ms(us: u64) -> String {
    format!("{:.3} ms", us as f64 / 1000.0)
}

/// The median over rounds of each round's gateway figure minus the same round's
/// direct figure: the rounds ran back to back, so a round's noise falls on both.
fn added_ms(gateway_us: &[u64], direct_us: &[u64]) -> String {
    let mut added: Vec<i64> = gateway_us
        .iter()
        .zip(direct_us)
        .map(|(g, d)| *g as i64 - *d as i64)
        .collect();
    added.sort_unstable();
    format!("{:+.3} ms", added[added.len() / 2] as f64 / 1000.0)
}

/// One path the calls take: straight to the simulators, or through a server.
struct Route {
    name: &'static str,
    addr: SocketAddr,
    stream_addr: SocketAddr,
    /// The key its calls carry, if any.
    key: Option<Arc<str>>,
    meter: Meter,
}

/// A path's figures over the rounds.
#[derive(Default)]
struct PathFigures {
    latency: Figures,
    ttft: Figures,
    max_rate: Vec<f64>,
    /// CPU µs per call of (generator, simulator, server) at the offered rate (the
    /// server's in instructions under `--count instructions`).
    cpu_open: Vec<[u64; 3]>,
    /// The same in the closed loop.
    cpu_closed: Vec<[u64; 3]>,
}

/// One round of one path: the open loop, the streams, the closed loop.
async fn run_round(options: &Options, path: &Route, hz: u64, figures: &mut PathFigures) -> String {
    let idle_per_second = path.meter.idle_per_second(options.seconds).await;
    let before = path.meter.start();
    let started = Instant::now();
    let samples = open_loop(
        (path.addr, path.key.clone()),
        options.rate,
        options.seconds,
        options.connections,
        false,
    )
    .await;
    let phase = (samples.len() as u64, started.elapsed());
    let cpu_open = path.meter.per_call(before, phase, idle_per_second, hz);
    figures.latency.add(&samples);
    let streams = open_loop(
        (path.stream_addr, path.key.clone()),
        options.stream_rate,
        options.seconds,
        options.connections,
        true,
    )
    .await;
    figures.ttft.add(&streams);
    let before = path.meter.start();
    let started = Instant::now();
    let (rate, calls) = closed_loop((path.addr, path.key.clone()), options.seconds, options.connections).await;
    let cpu_closed = path
        .meter
        .per_call(before, (calls, started.elapsed()), idle_per_second, hz);
    figures.max_rate.push(rate);
    figures.cpu_open.push(cpu_open);
    figures.cpu_closed.push(cpu_closed);
    format!(
        "{:>8}: latency p50 {} p99 {} | ttft p50 {} p99 {} | max {rate:.0} req/s | {} open {cpu_open:?} closed {cpu_closed:?}",
        path.name,
        ms(percentile(&samples, 0.5)),
        ms(percentile(&samples, 0.99)),
        ms(percentile(&streams, 0.5)),
        ms(percentile(&streams, 0.99)),
        per_call_label(options),
    )
}

/// What the per-call figures are: every process's CPU time, or the servers'
/// instructions.
fn per_call_label(options: &Options) -> &'static str {
    match options.count_instructions {
        true => "per call (gen CPU µs, sim CPU µs, server instructions)",
        false => "CPU µs per call (generator, simulator, server)",
    }
}

fn median_f64(values: &[f64]) -> f64 {
    let mut values = values.to_vec();
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// The median over rounds of each process's CPU per call.
fn median_cpu(rounds: &[[u64; 3]]) -> [u64; 3] {
    let column = |i: usize| Figures::median(&rounds.iter().map(|r| r[i]).collect::<Vec<_>>());
    [column(0), column(1), column(2)]
}

/// The table of one server path against direct (`reference`), and against
/// `baseline` when given.
fn print_summary(options: &Options, direct: &PathFigures, paths: &[(&str, &PathFigures)]) {
    println!(
        "| figure | direct | {} |",
        paths.iter().map(|p| p.0).collect::<Vec<_>>().join(" | ")
    );
    println!("| --- | --- |{}", " --- |".repeat(paths.len()));
    type Pick = fn(&PathFigures) -> &[u64];
    let rows: [(&str, Pick); 4] = [
        ("latency p50", |f| &f.latency.p50),
        ("latency p99", |f| &f.latency.p99),
        ("ttft p50", |f| &f.ttft.p50),
        ("ttft p99", |f| &f.ttft.p99),
    ];
    for (name, pick) in rows {
        let cells: Vec<String> = (paths.iter())
            .map(|(_, f)| format!("{} ({})", ms(Figures::median(pick(f))), added_ms(pick(f), pick(direct))))
            .collect();
        println!(
            "| {name} | {} | {} |",
            ms(Figures::median(pick(direct))),
            cells.join(" | ")
        );
    }
    let cells: Vec<String> = (paths.iter())
        .map(|(_, f)| {
            let ratios: Vec<f64> = f.max_rate.iter().zip(&direct.max_rate).map(|(g, d)| g / d).collect();
            format!(
                "{:.0} req/s (ratio {:.2})",
                median_f64(&f.max_rate),
                median_f64(&ratios)
            )
        })
        .collect();
    println!(
        "| max rate, {} connections | {:.0} req/s | {} |",
        options.connections,
        median_f64(&direct.max_rate),
        cells.join(" | ")
    );
    for (label, pick) in [("open loop", 0), ("closed loop", 1)] {
        let cpu = |f: &PathFigures| median_cpu(if pick == 0 { &f.cpu_open } else { &f.cpu_closed });
        let cells: Vec<String> = paths.iter().map(|(_, f)| format!("{:?}", cpu(f))).collect();
        println!(
            "| {}, {label} | {:?} | {} |",
            per_call_label(options),
            cpu(direct),
            cells.join(" | ")
        );
    }
}

/// The median of `values` and their spread over the rounds, as `median [min, max]`.
fn spread(values: &[f64], decimals: usize) -> String {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let (low, high) = (sorted[0], sorted[sorted.len() - 1]);
    format!(
        "{:.decimals$} [{low:.decimals$}, {high:.decimals$}]",
        median_f64(&sorted)
    )
}

/// The gateway against the baseline build, round by round (the two ran in the
/// same round, under the same noise): after / before ratios of each figure, and
/// the latency each adds over the same round's direct path, as the median of the
/// rounds with their spread.
fn print_against_baseline(options: &Options, direct: &PathFigures, gateway: &PathFigures, baseline: &PathFigures) {
    let ratio = |after: &[u64], before: &[u64]| -> Vec<f64> {
        after
            .iter()
            .zip(before)
            .map(|(a, b)| *a as f64 / (*b).max(1) as f64)
            .collect()
    };
    let added_ms = |path: &[u64], direct: &[u64]| -> Vec<f64> {
        path.iter()
            .zip(direct)
            .map(|(p, d)| (*p as f64 - *d as f64) / 1000.0)
            .collect()
    };
    println!("\ngateway against baseline, per round (median [min, max] over the rounds):");
    println!("| figure | gateway / baseline | added by gateway, ms | added by baseline, ms |");
    println!("| --- | ---: | ---: | ---: |");
    type Pick = fn(&PathFigures) -> &[u64];
    let rows: [(&str, Pick); 4] = [
        ("latency p50", |f| &f.latency.p50),
        ("latency p99", |f| &f.latency.p99),
        ("ttft p50", |f| &f.ttft.p50),
        ("ttft p99", |f| &f.ttft.p99),
    ];
    for (name, pick) in rows {
        println!(
            "| {name} | {} | {} | {} |",
            spread(&ratio(pick(gateway), pick(baseline)), 3),
            spread(&added_ms(pick(gateway), pick(direct)), 3),
            spread(&added_ms(pick(baseline), pick(direct)), 3),
        );
    }
    let rates: Vec<f64> = (gateway.max_rate.iter())
        .zip(&baseline.max_rate)
        .map(|(g, b)| g / b)
        .collect();
    println!("| max rate, closed loop | {} | | |", spread(&rates, 3));
    let server_cpu = |f: &PathFigures, closed: bool| -> Vec<u64> {
        (if closed { &f.cpu_closed } else { &f.cpu_open })
            .iter()
            .map(|c| c[2])
            .collect()
    };
    for (label, closed) in [("open loop", false), ("closed loop", true)] {
        println!(
            "| server {} per call, {label} | {} | | |",
            if options.count_instructions {
                "instructions"
            } else {
                "CPU"
            },
            spread(&ratio(&server_cpu(gateway, closed), &server_cpu(baseline, closed)), 3)
        );
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let options = parse_options();
    let directory = std::env::temp_dir().join(format!("gateway-bench-{}", std::process::id()));
    let (sim_process, sim) = start_sim(&options, 0);
    let (_paced_sim, paced_sim) = start_sim(&options, STREAM_MS_PER_TOKEN);
    let sims = [sim, paced_sim];
    let (otel_env, otel_received) = otel::environment(options.otel);
    let server = start_gateway(&options, (&options.bin_dir, &otel_env), sims, &directory.join("new"));
    let gateway = server.gateway;
    let baseline = (options.baseline_bin.as_ref())
        .map(|dir| start_gateway(&options, (dir, &[]), sims, &directory.join("baseline")));
    println!(
        "provider-sim {sim} (streams: {paced_sim}, {STREAM_MS_PER_TOKEN} ms per token, {STREAM_TOKENS} tokens), gateway {gateway}{}; snapshots {}; {}; servers on CPU {}; {} rounds of {} s; open loop {} req/s (streams {} req/s) over {} connections",
        baseline.as_ref().map_or(String::new(), |b| format!(", baseline {}", b.gateway)),
        if options.snapshots { "every 1 s" } else { "off" },
        if options.money { "the gateway's calls with a tenant key and a budget" } else { "anonymous calls" },
        options.server_cpu.map_or("any".to_string(), |cpu| cpu.to_string()),
        options.rounds, options.seconds, options.rate, options.stream_rate, options.connections
    );
    let key: Option<Arc<str>> = match options.money {
        true => Some(Arc::from(money::tenant_key(server.api).await)),
        false => None,
    };
    let meter = |server: Option<(&Process, &str)>| Meter {
        pids: Pids {
            generator: std::process::id(),
            simulator: sim_process.pid(),
            server: server.map(|(process, _)| process.pid()),
        },
        callgrind: (server.filter(|_| options.count_instructions)).map(|(_, name)| directory.join(name)),
    };
    // Direct calls of each model go to the simulator the gateway forwards that model to.
    let mut paths = vec![
        Route {
            name: "direct",
            addr: sim,
            stream_addr: paced_sim,
            key: None,
            meter: meter(None),
        },
        Route {
            name: "gateway",
            addr: gateway,
            stream_addr: gateway,
            key,
            meter: meter(Some((&server.process, "new"))),
        },
    ];
    if let Some(base) = &baseline {
        paths.push(Route {
            name: "baseline",
            addr: base.gateway,
            stream_addr: base.gateway,
            key: None,
            meter: meter(Some((&base.process, "baseline"))),
        });
    }
    // Warm-up: connections, allocators, the tokenizer's tables.
    for path in &paths {
        closed_loop((path.addr, path.key.clone()), 1.0, options.connections).await;
    }
    let hz = clock_ticks_per_second();
    let mut figures: Vec<PathFigures> = paths.iter().map(|_| PathFigures::default()).collect();
    for round in 0..options.rounds {
        // Direct first, then the servers, their order alternating by round.
        let mut order: Vec<usize> = (1..paths.len()).collect();
        if round % 2 == 1 {
            order.reverse();
        }
        for i in std::iter::once(0).chain(order) {
            let line = run_round(&options, &paths[i], hz, &mut figures[i]).await;
            println!("round {round} {line}");
        }
    }
    println!(
        "\nmedian over {} rounds (added: median of the rounds' differences from direct):",
        options.rounds
    );
    let servers: Vec<(&str, &PathFigures)> = paths.iter().zip(&figures).skip(1).map(|(p, f)| (p.name, f)).collect();
    print_summary(&options, &figures[0], &servers);
    if let [direct, gateway, baseline] = &figures[..] {
        print_against_baseline(&options, direct, gateway, baseline);
    }
    for (name, api) in std::iter::once(("gateway", server.api)).chain(baseline.as_ref().map(|b| ("baseline", b.api))) {
        println!("{name}: {}", snapshot_pauses(api).await);
    }
    if let Some(received) = otel_received {
        let requests = received.requests.load(std::sync::atomic::Ordering::Relaxed);
        let bytes = received.bytes.load(std::sync::atomic::Ordering::Relaxed);
        println!("otel sink: {requests} exports, {bytes} bytes");
    }
    match options.count_instructions {
        // Each phase's dump, for `callgrind_annotate`.
        true => println!("callgrind dumps: {}/{{new,baseline}}", directory.display()),
        false => {
            let _ = std::fs::remove_dir_all(&directory);
        }
    }
}
