//! The gateway benchmark (BENCHMARKS.md, "Gateway"): in one run, the same calls
//! sent straight to `provider-sim` and through `ratelimiterd`'s gateway (memory
//! backend) in front of that same simulator, alternating rounds so the machine's
//! noise falls on both alike.
//!
//! - latency added at a fixed offered rate (open loop, measured from each call's
//!   scheduled start, so a stall is not hidden by the calls that wait behind it):
//!   non-streaming chat completions, p50 and p99 of each path and their difference;
//! - time to first token of streamed chat completions (first content chunk);
//! - the highest rate each path serves (closed loop), and their ratio.
//!
//! ```sh
//! cargo build --release -p ratelimiterd --bin ratelimiterd -p replay --bin provider-sim --example gateway_bench
//! target/release/examples/gateway_bench --bin-dir target/release
//! ```

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::client::conn::http1::SendRequest;
use hyper::{Method, Request};
use hyper_util::rt::TokioIo;

/// Longest wait for a process to listen.
const STARTUP_WAIT_MAX: Duration = Duration::from_secs(30);
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

#[derive(Debug, Clone)]
struct Options {
    bin_dir: PathBuf,
    rate: f64,
    seconds: f64,
    rounds: usize,
    connections: usize,
    stream_rate: f64,
}

fn parse_options() -> Options {
    let mut options = Options {
        bin_dir: PathBuf::from("target/release"),
        rate: 1_000.0,
        seconds: 5.0,
        rounds: 3,
        connections: 64,
        stream_rate: 200.0,
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args.next().unwrap_or_else(|| usage(&format!("{flag} needs a value")));
        let number = || {
            value
                .parse::<f64>()
                .unwrap_or_else(|_| usage(&format!("{flag}: not a number")))
        };
        match flag.as_str() {
            "--bin-dir" => options.bin_dir = PathBuf::from(&value),
            "--rate" => options.rate = number(),
            "--seconds" => options.seconds = number(),
            "--rounds" => options.rounds = number() as usize,
            "--connections" => options.connections = number() as usize,
            "--stream-rate" => options.stream_rate = number(),
            _ => usage(&format!("unknown flag {flag}")),
        }
    }
    let valid = options.rate > 0.0
        && options.stream_rate > 0.0
        && (0.5..=600.0).contains(&options.seconds)
        && (1..=100).contains(&options.rounds)
        && (1..=1_024).contains(&options.connections);
    if !valid {
        usage("rates > 0, --seconds 0.5..=600, --rounds 1..=100, --connections 1..=1024");
    }
    options
}

fn usage(problem: &str) -> ! {
    eprintln!("gateway_bench: {problem}");
    eprintln!(
        "usage: gateway_bench [--bin-dir DIR] [--rate N] [--stream-rate N] [--seconds S] [--rounds N] [--connections N]"
    );
    std::process::exit(2);
}

/// A child process killed when the benchmark ends.
struct Process(Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    listener.local_addr().expect("bound").port()
}

fn wait_listening(addr: SocketAddr) {
    let deadline = Instant::now() + STARTUP_WAIT_MAX;
    while std::net::TcpStream::connect(addr).is_err() {
        assert!(Instant::now() < deadline, "nothing listens on {addr}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// provider-sim with limits far above the load, writing a token per `ms_per_token`.
fn start_sim(options: &Options, ms_per_token: u64) -> (Process, SocketAddr) {
    let port = free_port();
    let child = Command::new(options.bin_dir.join("provider-sim"))
        .args([
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--rpm",
            "1000000000",
            "--tpm",
            "1000000000000",
        ])
        .args([
            "--concurrency",
            "100000",
            "--ms-per-output-token",
            &ms_per_token.to_string(),
        ])
        .stderr(Stdio::null())
        .spawn()
        .expect("provider-sim starts (build it with --release)");
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().expect("an address");
    wait_listening(addr);
    (Process(child), addr)
}

/// ratelimiterd, memory backend, with a gateway whose model has limits far above the
/// load: every call is reserved and reconciled, none is refused.
fn start_gateway(options: &Options, sims: [SocketAddr; 2], directory: &std::path::Path) -> (Process, SocketAddr) {
    let (api_port, gateway_port) = (free_port(), free_port());
    let mut config = format!(
        "server:\n  listen_addr: \"127.0.0.1:{api_port}\"\nregistry:\n  path: \"{}\"\nlog:\n  level: warn\ngateway:\n  listen_addr: \"127.0.0.1:{gateway_port}\"\n  upstreams:\n",
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
    let mut child = Command::new(options.bin_dir.join("ratelimiterd"))
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
    addr: SocketAddr,
    body: &Bytes,
    stream: bool,
    since: Instant,
) -> Duration {
    sender.ready().await.expect("the connection stays up");
    let request = Request::builder()
        .method(Method::POST)
        .uri("/v1/chat/completions")
        .header("host", addr.to_string())
        .header("content-type", "application/json")
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
    first_token.unwrap_or_else(|| since.elapsed())
}

/// Open loop at `rate` for `seconds` over `connections`: each connection sends its
/// share of a fixed schedule; latency counts from the scheduled start.
async fn open_loop(addr: SocketAddr, rate: f64, seconds: f64, connections: usize, stream: bool) -> Vec<u64> {
    let total = (rate * seconds) as usize;
    let start = Instant::now() + Duration::from_millis(50);
    let body = chat_body(stream);
    let mut workers = Vec::with_capacity(connections);
    for worker in 0..connections {
        let body = body.clone();
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
    let mut samples = Vec::new();
    for worker in workers {
        samples.extend(worker.await.expect("a worker"));
    }
    samples.truncate(SAMPLES_MAX);
    samples.sort_unstable();
    samples
}

/// Closed loop: `connections` callers back to back for `seconds`; calls per second.
async fn closed_loop(addr: SocketAddr, seconds: f64, connections: usize) -> f64 {
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let body = chat_body(false);
    let mut workers = Vec::new();
    for _ in 0..connections {
        let (stop, done, body) = (Arc::clone(&stop), Arc::clone(&done), body.clone());
        workers.push(tokio::spawn(async move {
            let mut sender = connect(addr).await;
            while !stop.load(Ordering::Relaxed) {
                call(&mut sender, addr, &body, false, Instant::now()).await;
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
    counted as f64 / elapsed
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

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let options = parse_options();
    let directory = std::env::temp_dir().join(format!("gateway-bench-{}", std::process::id()));
    std::fs::create_dir_all(&directory).expect("a temporary directory");
    let (_sim, sim) = start_sim(&options, 0);
    let (_paced_sim, paced_sim) = start_sim(&options, STREAM_MS_PER_TOKEN);
    let (_gateway, gateway) = start_gateway(&options, [sim, paced_sim], &directory);
    println!(
        "provider-sim {sim} (streams: {paced_sim}, {STREAM_MS_PER_TOKEN} ms per token, {STREAM_TOKENS} tokens), gateway {gateway}; {} rounds of {} s; open loop {} req/s (streams {} req/s) over {} connections",
        options.rounds, options.seconds, options.rate, options.stream_rate, options.connections
    );
    // Warm-up: connections, allocators, the tokenizer's tables.
    for addr in [sim, gateway] {
        closed_loop(addr, 1.0, options.connections).await;
    }
    // Direct calls of each model go to the simulator the gateway forwards that model to.
    let paths = [("direct", sim, paced_sim), ("gateway", gateway, gateway)];
    let mut latency = [Figures::default(), Figures::default()];
    let mut ttft = [Figures::default(), Figures::default()];
    let mut max_rate = [Vec::new(), Vec::new()];
    for round in 0..options.rounds {
        for (i, (name, addr, stream_addr)) in paths.iter().enumerate() {
            let samples = open_loop(*addr, options.rate, options.seconds, options.connections, false).await;
            latency[i].add(&samples);
            let streams = open_loop(
                *stream_addr,
                options.stream_rate,
                options.seconds,
                options.connections,
                true,
            )
            .await;
            ttft[i].add(&streams);
            let rate = closed_loop(*addr, options.seconds, options.connections).await;
            max_rate[i].push(rate);
            println!(
                "round {round} {name:>7}: latency p50 {} p99 {} | ttft p50 {} p99 {} | max {rate:.0} req/s",
                ms(percentile(&samples, 0.5)),
                ms(percentile(&samples, 0.99)),
                ms(percentile(&streams, 0.5)),
                ms(percentile(&streams, 0.99)),
            );
        }
    }
    let med = |f: &Figures| (Figures::median(&f.p50), Figures::median(&f.p99));
    let ((d50, d99), (g50, g99)) = (med(&latency[0]), med(&latency[1]));
    let ((t50, t99), (u50, u99)) = (med(&ttft[0]), med(&ttft[1]));
    let median_rate = |rates: &[f64]| {
        let mut rates = rates.to_vec();
        rates.sort_by(f64::total_cmp);
        rates[rates.len() / 2]
    };
    let (direct_max, gateway_max) = (median_rate(&max_rate[0]), median_rate(&max_rate[1]));
    println!("\nmedian over {} rounds:", options.rounds);
    println!("| figure | direct | gateway | added (median of the rounds' differences) |");
    println!("| --- | --- | --- | --- |");
    let (l, t) = (&latency, &ttft);
    println!(
        "| latency p50 at {} req/s | {} | {} | {} |",
        options.rate,
        ms(d50),
        ms(g50),
        added_ms(&l[1].p50, &l[0].p50)
    );
    println!(
        "| latency p99 at {} req/s | {} | {} | {} |",
        options.rate,
        ms(d99),
        ms(g99),
        added_ms(&l[1].p99, &l[0].p99)
    );
    println!(
        "| time to first token p50 ({} req/s) | {} | {} | {} |",
        options.stream_rate,
        ms(t50),
        ms(u50),
        added_ms(&t[1].p50, &t[0].p50)
    );
    println!(
        "| time to first token p99 ({} req/s) | {} | {} | {} |",
        options.stream_rate,
        ms(t99),
        ms(u99),
        added_ms(&t[1].p99, &t[0].p99)
    );
    let mut ratios: Vec<f64> = max_rate[1].iter().zip(&max_rate[0]).map(|(g, d)| g / d).collect();
    ratios.sort_by(f64::total_cmp);
    println!(
        "| max rate, {} connections | {direct_max:.0} req/s | {gateway_max:.0} req/s | ratio {:.2} (median of the rounds' ratios) |",
        options.connections,
        ratios[ratios.len() / 2]
    );
    let _ = std::fs::remove_dir_all(&directory);
}
