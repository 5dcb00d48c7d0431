//! The classes benchmark (BENCHMARKS.md, "Gateway classes"; docs/gateway.md,
//! "Classes"): one model whose token limit binds, shared by a batch tenant
//! offering 3x the limit and an interactive tenant offering 20 % of it, behind
//! `ratelimiterd`'s gateway in front of `provider-sim` (a sliding log of exactly
//! 60 s on tokens, requests and calls in flight far above).
//!
//! Each run starts a fresh simulator and gateway and offers, open loop (calls at
//! fixed times, whatever the answers):
//!
//! - the batch tenant alone for `--alone-windows` one-minute windows: what batch
//!   gets when interactive is idle, against what its ceiling allows;
//! - then both tenants for `--both-windows` windows: interactive calls served and
//!   their latency, batch tokens served, the simulator's charged tokens against
//!   its limit, the simulator's 429s.
//!
//! The same load runs with classes off (no `classes:`: round robin between the
//! two tenants, today's rule) and with each headroom of `--headrooms`, on the
//! memory backend and, with `--tigerbeetle`, on two servers sharing one cluster
//! (each tenant's calls alternating between them).
//!
//! Every call's usage is what the gateway reserved for it: the prompt is words of
//! three letters (one token each by both the simulator's count and `o200k_base`)
//! and the simulator writes exactly `max_tokens`, so a reservation (prompt count
//! plus `max_tokens`, and the chat format's few tokens per message) is reconciled
//! to within those few tokens of what the simulator charges. Output is instant
//! (`--ms-per-output-token 0`): a call's latency is the gateway's admission wait
//! plus its own and the simulator's handling.
//!
//! ```sh
//! cargo build --release -p ratelimiterd --features tigerbeetle --bin ratelimiterd -p replay --bin provider-sim --example class_bench
//! TB_PORT=3741 TB_DATA=/tmp/classbench-tb scripts/tigerbeetle.sh start 1
//! target/release/examples/class_bench --bin-dir target/release --tigerbeetle 127.0.0.1:3741
//! # the defaults: 2 windows alone, 3 with both, classes off then headroom 0.21 and 0.10;
//! # `--off no --headrooms 0.25,0.20`: other headrooms only
//! ```

mod bench_support;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;

use bench_support::flags::Flags;
use bench_support::{free_port, wait_listening, Process};

/// The providers' window: every limit here is per minute.
const WINDOW: Duration = Duration::from_secs(60);
/// The model's token limit per minute: the binding one.
const TPM: u64 = 600_000;
/// The batch tenant's offer, in limits per minute.
const BATCH_OFFER: f64 = 3.0;
/// The interactive tenant's offer, as a fraction of the limit per minute.
const INTERACTIVE_OFFER: f64 = 0.20;
/// A batch call: prompt and output tokens (a document chunk and its summary).
const BATCH_CALL: (u64, u64) = (600, 400);
/// An interactive call: prompt and output tokens (a chat turn).
const INTERACTIVE_CALL: (u64, u64) = (150, 100);
/// How long a denied call may wait in the model's queue: the documented example's.
const MAX_WAIT_MS: u64 = 2_000;
/// The interactive class's share when classes compete for freed capacity.
const INTERACTIVE_SHARE: u32 = 4;
/// The gateway keys of the two tenants.
const INTERACTIVE_KEY: &str = "class-bench-interactive-0123456789";
const BATCH_KEY: &str = "class-bench-batch-tenant-0123456789";
/// Most headroom settings in one run.
const HEADROOMS_MAX: usize = 4;

type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// The flags, as the usage line shows them.
const USAGE: &str = "[--bin-dir DIR] [--tigerbeetle ADDRESSES] [--memory on|off] [--alone-windows N] [--both-windows N] [--headrooms 0.21,0.10] [--off yes|no]";

struct Options {
    bin_dir: PathBuf,
    tigerbeetle: Option<String>,
    /// Whether the memory backend runs (`--memory off`: the fleet's only).
    memory: bool,
    alone_windows: u32,
    both_windows: u32,
    /// Headroom settings of the interactive class.
    headrooms: Vec<f64>,
    /// Whether classes off runs first (`--off no`: the headrooms only).
    off: bool,
}

fn parse_options() -> Options {
    let mut options = Options {
        bin_dir: PathBuf::from("target/release"),
        tigerbeetle: None,
        memory: true,
        alone_windows: 2,
        both_windows: 3,
        headrooms: vec![0.21, 0.10],
        off: true,
    };
    let mut flags = Flags::from_env("class_bench", USAGE);
    while let Some((flag, value)) = flags.next() {
        let count = || flags.parse::<u32>(&flag, &value, "a count");
        match flag.as_str() {
            "--bin-dir" => options.bin_dir = PathBuf::from(&value),
            "--tigerbeetle" => options.tigerbeetle = Some(value.clone()),
            "--memory" => options.memory = value != "off",
            "--off" => options.off = value != "no",
            "--alone-windows" => options.alone_windows = count(),
            "--both-windows" => options.both_windows = count(),
            "--headrooms" => {
                options.headrooms = (value.split(',').filter(|v| !v.is_empty()))
                    .map(|v| {
                        v.parse::<f64>()
                            .unwrap_or_else(|_| flags.fail("--headrooms: fractions"))
                    })
                    .collect()
            }
            _ => flags.fail(&format!("unknown flag {flag}")),
        }
    }
    let headrooms_ok = options.headrooms.iter().all(|h| (0.0..1.0).contains(h));
    if !(1..=10).contains(&options.alone_windows)
        || !(1..=10).contains(&options.both_windows)
        || !headrooms_ok
        || options.headrooms.len() > HEADROOMS_MAX
    {
        flags.fail("--alone-windows 1..=10, --both-windows 1..=10, at most 4 --headrooms in [0, 1)");
    }
    options
}

/// The provider: `TPM` tokens per minute, requests and calls in flight far above.
fn start_sim(options: &Options) -> (Process, SocketAddr) {
    let tpm = TPM.to_string();
    let args = ["--tpm", &tpm, "--rpm", "1000000000", "--concurrency", "100000"];
    let pace = ["--ms-per-output-token", "0", "--models", "gpt-4o"];
    bench_support::start_sim(&options.bin_dir, &[&args[..], &pace].concat())
}

struct Server {
    _process: Process,
    gateway: SocketAddr,
    api: SocketAddr,
}

/// The gateway's configuration: `gpt-4o` with the simulator's token limit, two
/// tenants, and with `headroom` the two classes (none: classes off).
fn config(
    options: &Options,
    sim: SocketAddr,
    run: &str,
    server: usize,
    ports: (u16, u16),
    headroom: Option<f64>,
) -> String {
    let (api_port, gateway_port) = ports;
    let backend = match &options.tigerbeetle {
        Some(addresses) if run.starts_with("tb") => {
            format!("  backend: tigerbeetle\ntigerbeetle:\n  cluster_id: \"0\"\n  addresses: [{addresses}]\n")
        }
        _ => String::new(),
    };
    let directory = std::env::temp_dir().join(format!("class-bench-{run}-{server}"));
    std::fs::create_dir_all(&directory).expect("a temporary directory");
    let mut config = format!(
        "server:\n  listen_addr: \"127.0.0.1:{api_port}\"\n{backend}registry:\n  path: \"{}\"\nlog:\n  level: warn\n",
        directory.join("limits.json").display()
    );
    config += &format!(
        "gateway:\n  listen_addr: \"127.0.0.1:{gateway_port}\"\n  upstreams:\n    - {{name: {run}, kind: openai-compatible, base_url: \"http://{sim}\"}}\n"
    );
    config += &format!("  models:\n    - {{name: gpt-4o, upstream: {run}, tpm: {TPM}, max_wait_ms: {MAX_WAIT_MS}}}\n");
    let class = |name: &str| headroom.map_or(String::new(), |_| format!(", class: {name}"));
    if let Some(headroom) = headroom {
        config += &format!(
            "  classes:\n    - {{name: interactive, share: {INTERACTIVE_SHARE}, headroom: {headroom}}}\n    - {{name: batch, share: 1}}\n"
        );
    }
    config += &format!(
        "  tenants:\n    - {{name: web, api_key_env: CLASS_BENCH_WEB_KEY{}}}\n    - {{name: etl, api_key_env: CLASS_BENCH_ETL_KEY{}}}\n",
        class("interactive"),
        class("batch")
    );
    config
}

/// `ratelimiterd` with the gateway of [`config`]. The upstream is named after the
/// run (and this process): a TigerBeetle cluster keeps the windows of the runs before.
fn start_server(options: &Options, sim: SocketAddr, run: &str, server: usize, headroom: Option<f64>) -> Server {
    let ports = (free_port(), free_port());
    let run = format!("{run}{}", std::process::id());
    let text = config(options, sim, &run, server, ports, headroom);
    let path = std::env::temp_dir().join(format!("class-bench-{run}-{server}/ratelimiterd.yaml"));
    std::fs::write(&path, text).expect("the config is written");
    let mut child = Command::new(options.bin_dir.join("ratelimiterd"))
        .arg("--config")
        .arg(&path)
        .env("CLASS_BENCH_WEB_KEY", INTERACTIVE_KEY)
        .env("CLASS_BENCH_ETL_KEY", BATCH_KEY)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("ratelimiterd starts (build it with --release)");
    let stderr = child.stderr.take().expect("piped");
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if line.contains("ERROR") {
                eprintln!("ratelimiterd: {line}");
            }
        }
    });
    let gateway: SocketAddr = format!("127.0.0.1:{}", ports.1).parse().expect("an address");
    wait_listening(gateway);
    Server {
        _process: Process(child),
        gateway,
        api: format!("127.0.0.1:{}", ports.0).parse().expect("an address"),
    }
}

fn client() -> HttpClient {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(1_024)
        .build(connector)
}

async fn get_json(client: &HttpClient, url: String) -> Value {
    let request = hyper::Request::get(url)
        .body(Full::new(Bytes::new()))
        .expect("a request");
    let response = client.request(request).await.expect("an answer");
    let body = response.into_body().collect().await.expect("a body").to_bytes();
    serde_json::from_slice(&body).expect("JSON")
}

/// A prompt of `tokens` tokens by both counts: three-letter words.
fn prompt(tokens: u64) -> String {
    let words = ["the", "cat", "sat"];
    (0..tokens).map(|i| words[i as usize % 3]).collect::<Vec<_>>().join(" ")
}

/// One tenant's offer: its key, its call, its calls per second.
#[derive(Clone, Copy)]
struct Offer {
    key: &'static str,
    call: (u64, u64),
    rate: f64,
}

/// What one call came to.
#[derive(Debug, Clone, Copy)]
struct Outcome {
    status: u16,
    /// From its scheduled start to the end of its answer.
    latency_us: u64,
    /// `usage.total_tokens` of a served call.
    tokens: u64,
    /// Since the load started, when it was scheduled.
    scheduled: Duration,
}

/// Open loop from `start + from` for `seconds`: `offer.rate` calls a second,
/// spread over `gateways` in turn, each at a fixed time.
async fn open_loop(
    client: HttpClient,
    gateways: Vec<SocketAddr>,
    offer: Offer,
    start: Instant,
    from: Duration,
    seconds: f64,
) -> Vec<Outcome> {
    let total = (offer.rate * seconds).round() as usize;
    let body = Bytes::from(
        serde_json::json!({
            "model": "gpt-4o",
            "messages": [{"role": "user", "content": prompt(offer.call.0)}],
            "max_tokens": offer.call.1,
        })
        .to_string(),
    );
    let mut calls = Vec::with_capacity(total);
    for i in 0..total {
        let at = from + Duration::from_secs_f64(i as f64 / offer.rate);
        let scheduled = start + at;
        let (client, body, gateway) = (client.clone(), body.clone(), gateways[i % gateways.len()]);
        tokio::time::sleep_until(scheduled.into()).await;
        calls.push(tokio::spawn(async move {
            let request = hyper::Request::post(format!("http://{gateway}/v1/chat/completions"))
                .header("content-type", "application/json")
                .header("authorization", format!("Bearer {}", offer.key))
                .body(Full::new(body))
                .expect("a request");
            let (status, tokens) = match client.request(request).await {
                Ok(response) => {
                    let status = response.status().as_u16();
                    let body = response.into_body().collect().await.map(|b| b.to_bytes());
                    let tokens = (body.ok())
                        .filter(|_| status == 200)
                        .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
                        .and_then(|v| v["usage"]["total_tokens"].as_u64())
                        .unwrap_or(0);
                    (status, tokens)
                }
                Err(_) => (0, 0),
            };
            Outcome {
                status,
                latency_us: scheduled.elapsed().as_micros() as u64,
                tokens,
                scheduled: at,
            }
        }));
    }
    let mut outcomes = Vec::with_capacity(total);
    for call in calls {
        outcomes.push(call.await.expect("a call"));
    }
    outcomes
}

fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// The simulator's ledger counts: (charged tokens, 429s).
async fn sim_counts(client: &HttpClient, sim: SocketAddr) -> (u64, u64) {
    let stats = get_json(client, format!("http://{sim}/sim/stats")).await;
    let counts = &stats["counts"];
    (
        counts["charged_tokens"].as_u64().unwrap_or(0),
        counts["throttled"].as_u64().unwrap_or(0),
    )
}

/// One run's figures.
struct Figures {
    label: String,
    /// Batch alone: tokens the simulator charged, and what the rule allows.
    alone_tokens: u64,
    alone_allowed: u64,
    interactive_offered: usize,
    interactive_served: usize,
    /// Interactive latency: p50, p99, max, in µs.
    interactive_us: (u64, u64, u64),
    /// The simulator's charged tokens with both tenants, less interactive's served ones.
    batch_tokens: u64,
    /// The simulator's charged tokens with both tenants.
    both_tokens: u64,
    provider_429: u64,
    /// The gateway's per-class figures: (class, queued, queue wait p99 bound ms).
    classes: Vec<(String, u64, u64)>,
}

/// The two tenants' offers: batch at `BATCH_OFFER` limits a minute, interactive
/// at `INTERACTIVE_OFFER` of one.
fn offers() -> (Offer, Offer) {
    let per_second = |offer: f64, call: (u64, u64)| offer * TPM as f64 / (call.0 + call.1) as f64 / 60.0;
    let batch = Offer {
        key: BATCH_KEY,
        call: BATCH_CALL,
        rate: per_second(BATCH_OFFER, BATCH_CALL),
    };
    let interactive = Offer {
        key: INTERACTIVE_KEY,
        call: INTERACTIVE_CALL,
        rate: per_second(INTERACTIVE_OFFER, INTERACTIVE_CALL),
    };
    (batch, interactive)
}

/// The gateway's per-class figures over the fleet: (class, calls queued, the
/// largest queue wait p99 bound in ms).
async fn gateway_classes(client: &HttpClient, fleet: &[Server]) -> Vec<(String, u64, u64)> {
    let mut classes: Vec<(String, u64, u64)> = Vec::new();
    for server in fleet {
        let reports = get_json(client, format!("http://{}/v1/admin/gateway/classes", server.api)).await;
        for report in reports.as_array().into_iter().flatten() {
            let name = report["class"].as_str().unwrap_or("?").to_owned();
            let queued = report["queued"].as_u64().unwrap_or(0);
            let p99 = report["queue_wait_p99_ms"].as_u64().unwrap_or(0);
            match classes.iter_mut().find(|entry| entry.0 == name) {
                Some(entry) => {
                    entry.1 += queued;
                    entry.2 = entry.2.max(p99);
                }
                None => classes.push((name, queued, p99)),
            }
        }
    }
    classes
}

/// Answers by status.
fn statuses(outcomes: &[Outcome]) -> std::collections::BTreeMap<u16, usize> {
    let mut counts = std::collections::BTreeMap::new();
    for o in outcomes {
        *counts.entry(o.status).or_default() += 1;
    }
    counts
}

/// One run: fresh simulator and servers, batch alone, then both tenants.
async fn run(options: &Options, backend: &str, headroom: Option<f64>) -> Figures {
    let setting = headroom.map_or("off".to_owned(), |h| format!("h{:02}", (h * 100.0).round() as u64));
    let label = format!("{backend}-{setting}");
    let (_sim, sim) = start_sim(options);
    let servers = if backend == "tb" { 2 } else { 1 };
    let fleet: Vec<Server> = (0..servers)
        .map(|i| start_server(options, sim, &format!("{backend}{setting}"), i, headroom))
        .collect();
    let gateways: Vec<SocketAddr> = fleet.iter().map(|s| s.gateway).collect();
    let client = client();
    let (alone, both) = (WINDOW * options.alone_windows, WINDOW * options.both_windows);
    let start = Instant::now() + Duration::from_millis(200);
    let (batch, interactive) = offers();
    let seconds = (alone + both).as_secs_f64();
    let batch_load = tokio::spawn(open_loop(
        client.clone(),
        gateways.clone(),
        batch,
        start,
        Duration::ZERO,
        seconds,
    ));
    let interactive_load = tokio::spawn(open_loop(
        client.clone(),
        gateways,
        interactive,
        start,
        alone,
        both.as_secs_f64(),
    ));
    // The simulator's charged tokens at every window's end: alone, then both.
    let mut at_window_ends = Vec::new();
    for window in 1..=options.alone_windows + options.both_windows {
        tokio::time::sleep_until((start + WINDOW * window).into()).await;
        at_window_ends.push(sim_counts(&client, sim).await.0);
    }
    let alone_tokens = at_window_ends[options.alone_windows as usize - 1];
    let both_tokens = at_window_ends[at_window_ends.len() - 1] - alone_tokens;
    let per_window: Vec<u64> = (0..at_window_ends.len())
        .map(|i| at_window_ends[i] - if i == 0 { 0 } else { at_window_ends[i - 1] })
        .collect();
    let batch_outcomes = batch_load.await.expect("the batch load");
    let interactive_outcomes = interactive_load.await.expect("the interactive load");
    let (_, provider_429) = sim_counts(&client, sim).await;
    let classes = gateway_classes(&client, &fleet).await;
    let ceiling = (TPM as f64 * (1.0 - headroom.unwrap_or(0.0))).floor() as u64;
    let mut latencies: Vec<u64> = (interactive_outcomes.iter())
        .filter(|o| o.status == 200)
        .map(|o| o.latency_us)
        .collect();
    latencies.sort_unstable();
    let interactive_tokens: u64 = interactive_outcomes.iter().map(|o| o.tokens).sum();
    let batch_scheduled_tokens: u64 = (batch_outcomes.iter())
        .filter(|o| o.scheduled >= alone)
        .map(|o| o.tokens)
        .sum();
    println!(
        "{label}: batch statuses {:?}, interactive statuses {:?}; interactive served {interactive_tokens} tokens, batch calls scheduled with both served {batch_scheduled_tokens}; simulator charged per window {per_window:?}",
        statuses(&batch_outcomes),
        statuses(&interactive_outcomes)
    );
    Figures {
        label,
        alone_tokens,
        alone_allowed: ceiling * u64::from(options.alone_windows),
        interactive_offered: interactive_outcomes.len(),
        interactive_served: latencies.len(),
        interactive_us: (
            percentile(&latencies, 0.5),
            percentile(&latencies, 0.99),
            latencies.last().copied().unwrap_or(0),
        ),
        batch_tokens: both_tokens.saturating_sub(interactive_tokens),
        both_tokens,
        provider_429,
        classes,
    }
}

fn report(options: &Options, f: &Figures) {
    let limit = TPM * u64::from(options.both_windows);
    let ms = |us: u64| us as f64 / 1_000.0;
    println!(
        "{}: batch alone {} / {} tokens = {:.1} % of its ceiling; both: interactive {}/{} served ({:.1} %), latency p50 {:.1} ms p99 {:.1} ms max {:.1} ms; batch {} tokens (the simulator's, less interactive's); simulator charged {} / {} = {:.1} % of the limit; provider 429s {}; gateway classes (class, queued, wait p99 bound ms) {:?}",
        f.label,
        f.alone_tokens,
        f.alone_allowed,
        100.0 * f.alone_tokens as f64 / f.alone_allowed as f64,
        f.interactive_served,
        f.interactive_offered,
        100.0 * f.interactive_served as f64 / f.interactive_offered.max(1) as f64,
        ms(f.interactive_us.0),
        ms(f.interactive_us.1),
        ms(f.interactive_us.2),
        f.batch_tokens,
        f.both_tokens,
        limit,
        100.0 * f.both_tokens as f64 / limit as f64,
        f.provider_429,
        f.classes
    );
}

#[tokio::main]
async fn main() {
    let options = parse_options();
    let mut backends = Vec::new();
    if options.memory {
        backends.push("memory");
    }
    if options.tigerbeetle.is_some() {
        backends.push("tb");
    }
    let settings: Vec<Option<f64>> = (options.off.then_some(None).into_iter())
        .chain(options.headrooms.iter().copied().map(Some))
        .collect();
    let mut all = Vec::new();
    for backend in backends {
        for headroom in &settings {
            let figures = run(&options, backend, *headroom).await;
            report(&options, &figures);
            all.push(figures);
        }
    }
    println!(
        "\nsummary ({} alone windows, {} both windows):",
        options.alone_windows, options.both_windows
    );
    for f in &all {
        report(&options, f);
    }
}
