//! What a Bedrock deployment costs a call (BENCHMARKS.md, "Bedrock: what signing and
//! re-framing cost a call"): the same Claude Messages calls, non-streamed and
//! streamed, sent straight to `provider-sim`'s `/v1/messages` and through one
//! `ratelimiterd` gateway (memory backend) whose models are served by that same
//! simulator as (a) a `kind: anthropic` upstream and (b) a `kind: bedrock` one, every
//! Bedrock request signed with AWS Signature Version 4 and checked by the simulator
//! (`--aws-sigv4`), its stream re-framed from AWS event-stream to server-sent events.
//! The three paths run in the same rounds, the two upstreams' order alternating by
//! round, so the machine's noise falls on all alike.
//!
//! Per path and round: the latency of non-streamed calls at a fixed offered rate
//! (open loop, from each call's scheduled start), the time to first token of
//! streamed calls (the first text delta), and the CPU each process spends per call
//! (`/proc/<pid>/stat` before and after each phase). The summary gives each
//! gateway path's figures added over direct, and Bedrock's against Anthropic's
//! per round as a median with its spread: the cost of signing and re-framing.
//!
//! ```sh
//! cargo build --release -p ratelimiterd --bin ratelimiterd -p replay --bin provider-sim --example bedrock_bench
//! target/release/examples/bedrock_bench --bin-dir target/release --rounds 5 --seconds 4
//! ```

mod bench_support;
#[path = "gateway_bench/cpu.rs"]
mod cpu;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::client::conn::http1::SendRequest;
use hyper::{Method, Request};
use hyper_util::rt::TokioIo;

use bench_support::flags::Flags;
use bench_support::{free_port, wait_listening, Process};
use cpu::{clock_ticks_per_second, cpu_per_call_us, Pids};

/// The model as Anthropic's API names it, served by the simulator.
const ANTHROPIC_MODEL: &str = "claude-haiku-4-5";
/// The same model as Bedrock names it: a cross-region inference profile, whose id
/// holds `.` and `:` as real ones do (the path is escaped and signed as such).
const BEDROCK_MODEL: &str = "us.anthropic.claude-haiku-4-5-20251001-v1:0";
/// The region the Bedrock upstream signs for (any: the simulator checks the scope the
/// request names).
const BEDROCK_REGION: &str = "us-east-1";
/// The simulator's and the gateway's AWS keys: the simulator recomputes every
/// signature with this secret.
const AWS_ACCESS_KEY_ID: &str = "AKIABENCHMARK0000001";
const AWS_SECRET_ACCESS_KEY: &str = "benchmark/secret+key000000000000000000000";
/// The paced simulator's time per output token, in ms: a gateway that buffered a
/// stream would show its whole length as time to first token.
const STREAM_MS_PER_TOKEN: u64 = 1;
/// Output tokens of a streamed call: one `content_block_delta` each, plus six
/// events around them (start, block start, ping, block stop, delta, stop).
const STREAM_TOKENS: u64 = 32;
/// Output tokens of a non-streamed call, on the simulator that answers at once.
const CALL_TOKENS: u64 = 16;
/// The first token of a streamed message: the first text delta (the block's start
/// carries an empty text).
const FIRST_TOKEN: &[u8] = b"\"text\":\"the ";

/// The flags, as the usage line shows them.
const USAGE: &str = "[--bin-dir DIR] [--rate N] [--stream-rate N] [--seconds S] [--rounds N] [--connections N]";

#[derive(Debug, Clone)]
struct Options {
    bin_dir: PathBuf,
    rate: f64,
    stream_rate: f64,
    seconds: f64,
    rounds: usize,
    connections: usize,
}

fn parse_options() -> Options {
    let mut options = Options {
        bin_dir: PathBuf::from("target/release"),
        rate: 500.0,
        stream_rate: 100.0,
        seconds: 4.0,
        rounds: 5,
        connections: 32,
    };
    let mut flags = Flags::from_env("bedrock_bench", USAGE);
    while let Some((flag, value)) = flags.next() {
        let number = || flags.parse::<f64>(&flag, &value, "a number");
        match flag.as_str() {
            "--bin-dir" => options.bin_dir = PathBuf::from(&value),
            "--rate" => options.rate = number(),
            "--stream-rate" => options.stream_rate = number(),
            "--seconds" => options.seconds = number(),
            "--rounds" => options.rounds = number() as usize,
            "--connections" => options.connections = number() as usize,
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
    options
}

/// provider-sim checking every Bedrock signature with the keys of the environment
/// (`main` sets them), with limits far above the load, writing a token per
/// `ms_per_token`, serving the model under both names.
fn start_sim(bin_dir: &Path, ms_per_token: u64) -> (Process, SocketAddr) {
    let (ms_per_token, models) = (ms_per_token.to_string(), format!("{ANTHROPIC_MODEL},{BEDROCK_MODEL}"));
    let args = [
        "--rpm",
        "1000000000",
        "--tpm",
        "1000000000000",
        "--concurrency",
        "100000",
        "--ms-per-output-token",
        &ms_per_token,
        "--models",
        &models,
        "--aws-sigv4",
    ];
    bench_support::start_sim(bin_dir, &args)
}

/// ratelimiterd, memory backend, snapshots off, with four models far above the
/// load (every call reserved and reconciled, none refused): each kind of upstream
/// on the fast simulator (non-streamed calls) and on the paced one (streams).
fn start_gateway(bin_dir: &Path, [fast, paced]: [SocketAddr; 2], directory: &Path) -> (Process, SocketAddr) {
    std::fs::create_dir_all(directory).expect("a temporary directory");
    let (api_port, gateway_port) = (free_port(), free_port());
    let (mut upstreams, mut models) = (String::new(), String::new());
    for (sim, pace) in [(fast, "fast"), (paced, "paced")] {
        upstreams += &format!("    - {{name: anthropic-{pace}, kind: anthropic, base_url: \"http://{sim}\"}}\n");
        upstreams += &format!(
            "    - {{name: bedrock-{pace}, kind: bedrock, region: {BEDROCK_REGION}, base_url: \"http://{sim}\"}}\n"
        );
        for (kind, model) in [("anthropic", ANTHROPIC_MODEL), ("bedrock", BEDROCK_MODEL)] {
            models += &format!(
                "    - name: {kind}-{pace}\n      max_wait_ms: 0\n      deployments:\n        - {{upstream: {kind}-{pace}, model: \"{model}\", rpm: 1000000000, tpm: 1000000000000, concurrency: 100000}}\n"
            );
        }
    }
    let config = format!(
        "server:\n  listen_addr: \"127.0.0.1:{api_port}\"\nregistry:\n  path: \"{}\"\nmemory:\n  snapshot_interval_ms: 0\nlog:\n  level: warn\ngateway:\n  listen_addr: \"127.0.0.1:{gateway_port}\"\n  allow_anonymous: true\n  upstreams:\n{upstreams}  models:\n{models}",
        directory.join("limits.json").display()
    );
    let path = directory.join("ratelimiterd.yaml");
    std::fs::write(&path, config).expect("the config is written");
    // Its log, kept with the run's files: why it did not start, if it did not.
    let log = directory.join("ratelimiterd.log");
    let child = Command::new(bin_dir.join("ratelimiterd"))
        .arg("--config")
        .arg(&path)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).expect("the log file"))
        .spawn()
        .expect("ratelimiterd starts (build it with --release)");
    let addr: SocketAddr = format!("127.0.0.1:{gateway_port}").parse().expect("an address");
    wait_listening(addr);
    (Process(child), addr)
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

/// A Messages request with a small prompt: `model` names the simulator's model
/// (direct) or the gateway's.
fn messages_body(model: &str, stream: bool) -> Bytes {
    let output = if stream { STREAM_TOKENS } else { CALL_TOKENS };
    Bytes::from(format!(
        r#"{{"model":"{model}","max_tokens":{output},"stream":{stream},"messages":[{{"role":"user","content":"the cat sat off her red mat"}}]}}"#
    ))
}

/// Sends one call; returns when the whole answer (or, for a stream, its first
/// token) has arrived, relative to `since`.
async fn call(
    sender: &mut SendRequest<Full<Bytes>>,
    addr: SocketAddr,
    body: &Bytes,
    stream: bool,
    since: Instant,
) -> Duration {
    sender.ready().await.expect("the connection stays up");
    let request = Request::builder()
        .method(Method::POST)
        .uri("/v1/messages")
        .header("host", addr.to_string())
        .header("content-type", "application/json")
        .header("anthropic-version", "2023-06-01")
        .body(Full::new(body.clone()))
        .expect("a request");
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
    assert!(!stream || first_token.is_some(), "a stream carries its text");
    first_token.unwrap_or_else(|| since.elapsed())
}

/// Open loop at `rate` for `seconds` over `connections`: each connection sends its
/// share of a fixed schedule; latency, in µs, counts from the scheduled start.
async fn open_loop(addr: SocketAddr, body: Bytes, stream: bool, rate: f64, options: &Options) -> Vec<u64> {
    let total = (rate * options.seconds) as usize;
    let start = Instant::now() + Duration::from_millis(50);
    let mut workers = Vec::with_capacity(options.connections);
    for worker in 0..options.connections {
        let (body, connections) = (body.clone(), options.connections);
        workers.push(tokio::spawn(async move {
            let mut sender = connect(addr).await;
            let mut samples = Vec::new();
            for i in (worker..total).step_by(connections) {
                let scheduled = start + Duration::from_secs_f64(i as f64 / rate);
                tokio::time::sleep_until(scheduled.into()).await;
                let latency = call(&mut sender, addr, &body, stream, scheduled).await;
                samples.push(latency.as_micros() as u64);
            }
            samples
        }));
    }
    let mut samples = Vec::with_capacity(total);
    for worker in workers {
        samples.extend(worker.await.expect("a worker"));
    }
    samples.sort_unstable();
    samples
}

fn percentile(sorted: &[u64], p: f64) -> u64 {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// One path the calls take.
struct Route {
    name: &'static str,
    addr: SocketAddr,
    /// The model of non-streamed calls (on the fast simulator) and of streams (on
    /// the paced one): direct, the simulators differ by address instead.
    models: [&'static str; 2],
    stream_addr: SocketAddr,
    /// The simulator each phase's calls reach, for their CPU.
    pids: [Pids; 2],
}

/// A path's figures, one entry per round.
#[derive(Default)]
struct PathFigures {
    latency_p50_us: Vec<u64>,
    latency_p99_us: Vec<u64>,
    ttft_p50_us: Vec<u64>,
    ttft_p99_us: Vec<u64>,
    /// CPU µs per non-streamed call of (generator, simulator, server).
    cpu_call_us: Vec<[u64; 3]>,
    /// The same per streamed call.
    cpu_stream_us: Vec<[u64; 3]>,
}

/// One round of one path: the non-streamed calls, then the streams.
async fn run_round(options: &Options, route: &Route, hz: u64, figures: &mut PathFigures) -> String {
    let phases = [
        (route.addr, route.models[0], false, options.rate),
        (route.stream_addr, route.models[1], true, options.stream_rate),
    ];
    let mut line = format!("{:>9}:", route.name);
    for (phase, (addr, model, stream, rate)) in phases.into_iter().enumerate() {
        let before = route.pids[phase].ticks();
        let samples = open_loop(addr, messages_body(model, stream), stream, rate, options).await;
        let cpu = cpu_per_call_us(before, route.pids[phase].ticks(), samples.len() as u64, hz);
        let (p50, p99) = (percentile(&samples, 0.50), percentile(&samples, 0.99));
        let (label, p50s, p99s, cpus) = match stream {
            false => (
                "latency",
                &mut figures.latency_p50_us,
                &mut figures.latency_p99_us,
                &mut figures.cpu_call_us,
            ),
            true => (
                "ttft",
                &mut figures.ttft_p50_us,
                &mut figures.ttft_p99_us,
                &mut figures.cpu_stream_us,
            ),
        };
        p50s.push(p50);
        p99s.push(p99);
        cpus.push(cpu);
        line += &format!(
            " {label} p50 {} p99 {} CPU µs/call (gen, sim, server) {cpu:?} |",
            ms(p50),
            ms(p99)
        );
    }
    line
}

fn ms(us: u64) -> String {
    format!("{:.3} ms", us as f64 / 1000.0)
}

/// `median [lowest, highest]` of one value per round.
fn spread(values: &[f64], decimals: usize) -> String {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let (low, high, median) = (sorted[0], sorted[sorted.len() - 1], sorted[sorted.len() / 2]);
    format!("{median:.decimals$} [{low:.decimals$}, {high:.decimals$}]")
}

/// Per round, `path` minus `direct`, in ms.
fn added_ms(path: &[u64], direct: &[u64]) -> Vec<f64> {
    (path.iter().zip(direct))
        .map(|(p, d)| (*p as f64 - *d as f64) / 1000.0)
        .collect()
}

/// Per round, `after / before`.
fn ratio(after: &[f64], before: &[f64]) -> Vec<f64> {
    after.iter().zip(before).map(|(a, b)| a / b).collect()
}

/// The table: each figure direct, added by each upstream kind over direct, and
/// Bedrock's cost against Anthropic's (difference and ratio of the added), every
/// cell the median over rounds with its spread.
fn print_summary(direct: &PathFigures, anthropic: &PathFigures, bedrock: &PathFigures) {
    println!("| figure, per round: median [lowest, highest] | direct | added through `anthropic` | added through `bedrock` | bedrock − anthropic | bedrock / anthropic (latency: of the added; CPU: of the whole) |");
    println!("| --- | ---: | ---: | ---: | ---: | ---: |");
    type Pick = fn(&PathFigures) -> &[u64];
    let rows: [(&str, Pick); 4] = [
        ("latency p50, ms", |f| &f.latency_p50_us),
        ("latency p99, ms", |f| &f.latency_p99_us),
        ("ttft p50, ms", |f| &f.ttft_p50_us),
        ("ttft p99, ms", |f| &f.ttft_p99_us),
    ];
    for (name, pick) in rows {
        let direct_ms: Vec<f64> = pick(direct).iter().map(|us| *us as f64 / 1000.0).collect();
        let (a, b) = (
            added_ms(pick(anthropic), pick(direct)),
            added_ms(pick(bedrock), pick(direct)),
        );
        let difference: Vec<f64> = b.iter().zip(&a).map(|(b, a)| b - a).collect();
        println!(
            "| {name} | {} | {} | {} | {} | {} |",
            spread(&direct_ms, 3),
            spread(&a, 3),
            spread(&b, 3),
            spread(&difference, 3),
            spread(&ratio(&b, &a), 2)
        );
    }
    type PickCpu = fn(&PathFigures) -> &[[u64; 3]];
    let cpu_rows: [(&str, PickCpu); 2] = [("non-streamed", |f| &f.cpu_call_us), ("streamed", |f| &f.cpu_stream_us)];
    for (name, pick) in cpu_rows {
        for (process, column) in [("server", 2), ("simulator", 1)] {
            let of = |f: &PathFigures| -> Vec<f64> { pick(f).iter().map(|c| c[column] as f64).collect() };
            let (d, a, b) = (of(direct), of(anthropic), of(bedrock));
            let difference: Vec<f64> = b.iter().zip(&a).map(|(b, a)| b - a).collect();
            let (a_cell, b_cell) = match column {
                // The server's CPU is all added: direct has no server.
                2 => (spread(&a, 0), spread(&b, 0)),
                _ => (
                    spread(&a.iter().zip(&d).map(|(a, d)| a - d).collect::<Vec<_>>(), 0),
                    spread(&b.iter().zip(&d).map(|(b, d)| b - d).collect::<Vec<_>>(), 0),
                ),
            };
            println!(
                "| {process} CPU µs per {name} call | {} | {a_cell} | {b_cell} | {} | {} |",
                spread(&d, 0),
                spread(&difference, 0),
                spread(&ratio(&b, &a), 2)
            );
        }
    }
}

fn main() {
    let options = parse_options();
    // Before any thread: the simulators and the gateway inherit the keys, the
    // simulators to check every signature with, the gateway to sign with.
    std::env::set_var("AWS_ACCESS_KEY_ID", AWS_ACCESS_KEY_ID);
    std::env::set_var("AWS_SECRET_ACCESS_KEY", AWS_SECRET_ACCESS_KEY);
    std::env::remove_var("AWS_SESSION_TOKEN");
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime")
        .block_on(run(options));
}

async fn run(options: Options) {
    let directory = std::env::temp_dir().join(format!("bedrock-bench-{}", std::process::id()));
    let (fast_process, fast) = start_sim(&options.bin_dir, 0);
    let (paced_process, paced) = start_sim(&options.bin_dir, STREAM_MS_PER_TOKEN);
    let (server, gateway) = start_gateway(&options.bin_dir, [fast, paced], &directory);
    println!(
        "provider-sim {fast} (pid {}; streams: {paced}, pid {}, {STREAM_MS_PER_TOKEN} ms per token, {STREAM_TOKENS} tokens), SigV4 checked; gateway {gateway} (pid {}); {} rounds of {} s; open loop {} req/s (streams {} req/s) over {} connections",
        fast_process.pid(), paced_process.pid(), server.pid(),
        options.rounds, options.seconds, options.rate, options.stream_rate, options.connections
    );
    let pids = |simulator: &Process, server: Option<&Process>| Pids {
        generator: std::process::id(),
        simulator: simulator.pid(),
        server: server.map(Process::pid),
    };
    let phase_pids = |server| [pids(&fast_process, server), pids(&paced_process, server)];
    let routes = [
        Route {
            name: "direct",
            addr: fast,
            stream_addr: paced,
            models: [ANTHROPIC_MODEL, ANTHROPIC_MODEL],
            pids: phase_pids(None),
        },
        Route {
            name: "anthropic",
            addr: gateway,
            stream_addr: gateway,
            models: ["anthropic-fast", "anthropic-paced"],
            pids: phase_pids(Some(&server)),
        },
        Route {
            name: "bedrock",
            addr: gateway,
            stream_addr: gateway,
            models: ["bedrock-fast", "bedrock-paced"],
            pids: phase_pids(Some(&server)),
        },
    ];
    // Warm-up: connections, allocators, the signing key's derivation, the tokenizer.
    let warm_up = Options {
        seconds: 1.0,
        ..options.clone()
    };
    for route in &routes {
        run_round(&warm_up, route, 1, &mut PathFigures::default()).await;
    }
    let hz = clock_ticks_per_second();
    let mut figures: [PathFigures; 3] = Default::default();
    for round in 0..options.rounds {
        // Direct first, then the two upstreams, their order alternating by round.
        let order = if round % 2 == 0 { [0, 1, 2] } else { [0, 2, 1] };
        for i in order {
            let line = run_round(&options, &routes[i], hz, &mut figures[i]).await;
            println!("round {round} {line}");
        }
    }
    println!(
        "\nover {} rounds (added: each round's figure minus the same round's direct one):",
        options.rounds
    );
    let [direct, anthropic, bedrock] = &figures;
    print_summary(direct, anthropic, bedrock);
    let _ = std::fs::remove_dir_all(&directory);
}
