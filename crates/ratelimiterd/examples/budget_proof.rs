//! The budgets' proof (BENCHMARKS.md, "Budgets"): 200 concurrent clients with
//! random prompts and output bounds against a $1.00 budget, `provider-sim`
//! answering random usage up to each bound and billing every call it serves on
//! its own ledger (`GET /sim/billing`), in one run:
//!
//! - through the gateway on the memory backend, and on a fleet of two servers on
//!   one TigerBeetle cluster (the clients split between them): the simulator's
//!   bill (never above the budget), the budget's utilization (bill / budget), and
//!   the gateway's own account of the spend (the budget limit's use, from
//!   `GET /v1/admin/limits/gateway:usd:day`, and the spend ledger's report,
//!   `GET /v1/admin/gateway/spend`) against the simulator's bill;
//! - the peers' design at the same concurrency against its own simulator: a
//!   post-hoc check (admit while the spend so far is under the budget, charge the
//!   call's cost when it completes), implemented here as the clients' shared gate,
//!   to show the overspend it allows;
//! - what a call pays for its budgets: p50 and p99 at an offered 1,000 req/s
//!   through a gateway with a budget and a price against one without, in
//!   alternating rounds, as ratios.
//!
//! ```sh
//! cargo build --release -p ratelimiterd --features tigerbeetle --bin ratelimiterd --example budget_proof -p replay --bin provider-sim
//! target/release/examples/budget_proof --bin-dir target/release
//! ```
//!
//! Against `TB_ADDRESS`, or a single replica started here (`TIGERBEETLE_BIN`).

// The benchmarks' command-line reader, shared with the replay's benchmarks.
#[path = "../../replay/examples/bench_support/flags.rs"]
mod flags;
#[path = "support/fleet_server.rs"]
#[allow(dead_code)]
mod fleet_server;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::client::conn::http1::SendRequest;
use hyper::{Method, Request};
use hyper_util::rt::TokioIo;
use rand::{Rng, SeedableRng};
use ratelimiter::tigerbeetle::LocalCluster;

use flags::Flags;
use fleet_server::FleetServer;

/// The model called, at OpenAI's list price for gpt-4o (USD per million tokens,
/// <https://platform.openai.com/docs/pricing>, read 2026-11): the gateway's
/// `price:` and the simulator's `--price` are given the same numbers, and nothing else.
const MODEL: &str = "gpt-4o";
const INPUT_USD_PER_MILLION: &str = "2.50";
const OUTPUT_USD_PER_MILLION: &str = "10.00";
/// The same prices in micro-USD per million tokens, for the post-hoc gate's own
/// charge (a token at `p` micro-USD per million costs `p` pico-USD).
const INPUT_PICO_USD_PER_TOKEN: u64 = 2_500_000;
const OUTPUT_PICO_USD_PER_TOKEN: u64 = 10_000_000;
/// A prompt's tokens and a call's output bound, each drawn uniformly: calls of a
/// few tenths of a cent to about three cents at worst.
const PROMPT_TOKENS: std::ops::RangeInclusive<u64> = 50..=3_000;
const OUTPUT_BOUND: std::ops::RangeInclusive<u64> = 16..=2_048;
/// The simulated model's time per output token: calls last up to two seconds, so
/// the clients' calls overlap as a busy service's do.
const MS_PER_OUTPUT_TOKEN: u64 = 1;
/// A refused client's pause before its next call.
const REFUSED_PAUSE_MS: u64 = 200;
/// Longest wait for a process to listen.
const STARTUP_WAIT_MAX: Duration = Duration::from_secs(30);
/// Pico-USD in a micro-USD, and in a USD.
const PICO_PER_MICRO: u128 = 1_000_000;
const PICO_PER_USD: f64 = 1e12;

/// The flags, as the usage line shows them.
const USAGE: &str = "[--bin-dir DIR] [--clients N] [--seconds S] [--budget-usd N] [--rate N] [--latency-seconds S] [--rounds N] [--seed N]";

#[derive(Debug, Clone)]
struct Options {
    bin_dir: PathBuf,
    clients: usize,
    seconds: f64,
    budget_usd: u64,
    rate: f64,
    latency_seconds: f64,
    rounds: usize,
    seed: u64,
}

fn parse_options() -> Options {
    let mut options = Options {
        bin_dir: PathBuf::from("target/release"),
        clients: 200,
        seconds: 15.0,
        budget_usd: 1,
        rate: 1_000.0,
        latency_seconds: 5.0,
        rounds: 3,
        seed: 1,
    };
    let mut flags = Flags::from_env("budget_proof", USAGE);
    while let Some((flag, value)) = flags.next() {
        let number = || flags.parse::<f64>(&flag, &value, "a number");
        match flag.as_str() {
            "--bin-dir" => options.bin_dir = PathBuf::from(&value),
            "--clients" => options.clients = number() as usize,
            "--seconds" => options.seconds = number(),
            "--budget-usd" => options.budget_usd = number() as u64,
            "--rate" => options.rate = number(),
            "--latency-seconds" => options.latency_seconds = number(),
            "--rounds" => options.rounds = number() as usize,
            "--seed" => options.seed = number() as u64,
            _ => flags.fail(&format!("unknown flag {flag}")),
        }
    }
    let valid = (2..=2_000).contains(&options.clients)
        && (1.0..=600.0).contains(&options.seconds)
        && (1..=1_000).contains(&options.budget_usd)
        && options.rate > 0.0
        && (0.5..=600.0).contains(&options.latency_seconds)
        && (1..=50).contains(&options.rounds);
    if !valid {
        flags.fail("--clients 2..=2000, --seconds 1..=600, --budget-usd 1..=1000, --rate > 0, --latency-seconds 0.5..=600, --rounds 1..=50");
    }
    options
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

fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// provider-sim, priced as the gateway is, with limits far above the load;
/// `random`: each call writes a number of tokens drawn in 1..=its bound.
fn start_sim(options: &Options, random: bool, ms_per_token: u64) -> (Process, SocketAddr) {
    let port = free_port();
    let price = format!("{MODEL}=input:{INPUT_USD_PER_MILLION},output:{OUTPUT_USD_PER_MILLION}");
    let mut command = Command::new(options.bin_dir.join("provider-sim"));
    command
        .args([
            "--listen",
            &loopback(port).to_string(),
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
        .args(["--price", &price, "--seed", &options.seed.to_string()]);
    if random {
        command.args(["--output-tokens", "random"]);
    }
    let child = command
        .stderr(Stdio::null())
        .spawn()
        .expect("provider-sim starts (build it with --release)");
    wait_listening(loopback(port));
    (Process(child), loopback(port))
}

/// The `gateway:` block: one model on `sim`, limits far above the load, no wait
/// in a queue; with `budget_usd`, a price and the gateway's daily budget.
fn gateway_yaml(port: u16, sim: SocketAddr, budget_usd: Option<u64>) -> String {
    let mut yaml = format!(
        "gateway:\n  listen_addr: \"127.0.0.1:{port}\"\n  allow_anonymous: true\n  upstreams:\n    - name: sim\n      kind: openai\n      base_url: \"http://{sim}\"\n  models:\n    - name: {MODEL}\n      upstream: sim\n      rpm: 1000000000\n      tpm: 1000000000000\n      concurrency: 100000\n      max_wait_ms: 0\n"
    );
    if let Some(usd) = budget_usd {
        yaml += &format!("      price: {{input: {INPUT_USD_PER_MILLION}, output: {OUTPUT_USD_PER_MILLION}}}\n");
        yaml += &format!("  budgets: [{{usd: {usd}, period: day}}]\n");
    }
    yaml
}

/// A memory-backend server with `gateway_yaml`; its API's address and its gateway's.
fn start_memory(options: &Options, dir: &Path, gateway: &str, gateway_port: u16) -> (Process, SocketAddr, SocketAddr) {
    std::fs::create_dir_all(dir).expect("a temporary directory");
    let api_port = free_port();
    let config = format!(
        "server:\n  listen_addr: \"127.0.0.1:{api_port}\"\nregistry:\n  path: \"{}\"\nlog:\n  level: warn\n{gateway}",
        dir.join("limits.json").display()
    );
    let path = dir.join("ratelimiterd.yaml");
    std::fs::write(&path, config).expect("the config is written");
    let child = Command::new(options.bin_dir.join("ratelimiterd"))
        .arg("--config")
        .arg(&path)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("ratelimiterd starts (build it with --release)");
    wait_listening(loopback(gateway_port));
    (Process(child), loopback(api_port), loopback(gateway_port))
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

/// Sends one request; the status and the body.
async fn send(
    sender: &mut SendRequest<Full<Bytes>>,
    addr: SocketAddr,
    method: Method,
    path: &str,
    body: Bytes,
) -> (u16, Bytes) {
    sender.ready().await.expect("the connection stays up");
    let request = Request::builder()
        .method(method)
        .uri(path)
        .header("host", addr.to_string())
        .header("content-type", "application/json")
        .body(Full::new(body))
        .expect("a request");
    let response = sender.send_request(request).await.expect("an answer");
    let status = response.status().as_u16();
    let body = response
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    (status, body)
}

async fn get_json(addr: SocketAddr, path: &str) -> serde_json::Value {
    let mut sender = connect(addr).await;
    let (status, body) = send(&mut sender, addr, Method::GET, path, Bytes::new()).await;
    assert_eq!(status, 200, "GET {path}: {}", String::from_utf8_lossy(&body));
    serde_json::from_slice(&body).expect("JSON")
}

/// A chat call of `prompt_tokens` words that both the simulator (four bytes a
/// token) and OpenAI's tokenizer count one token each, bounded by `bound`.
fn chat_body(prompt_tokens: u64, bound: u64) -> Bytes {
    const WORDS: [&str; 7] = ["the ", "cat ", "sat ", "off ", "her ", "red ", "mat "];
    let text: String = (0..prompt_tokens as usize).map(|i| WORDS[i % WORDS.len()]).collect();
    Bytes::from(format!(
        r#"{{"model":"{MODEL}","messages":[{{"role":"user","content":"{}"}}],"max_tokens":{bound}}}"#,
        text.trim_end()
    ))
}

/// What the clients of one phase saw.
#[derive(Default)]
struct Outcome {
    served: AtomicU64,
    refused: AtomicU64,
    failed: AtomicU64,
}

/// The post-hoc gate of the peers' design: a call is let through while the spend
/// recorded so far is under the budget; its cost is recorded when it completes.
struct PostHoc {
    budget_pico_usd: u64,
    spent_pico_usd: AtomicU64,
}

impl PostHoc {
    fn admits(&self) -> bool {
        self.spent_pico_usd.load(Ordering::SeqCst) < self.budget_pico_usd
    }

    /// Charges a completed call from the usage in its answer.
    fn charge(&self, answer: &[u8]) {
        let answer: serde_json::Value = serde_json::from_slice(answer).expect("a JSON answer");
        let tokens = |name: &str| answer["usage"][name].as_u64().expect("usage");
        let cost = tokens("prompt_tokens") * INPUT_PICO_USD_PER_TOKEN
            + tokens("completion_tokens") * OUTPUT_PICO_USD_PER_TOKEN;
        self.spent_pico_usd.fetch_add(cost, Ordering::SeqCst);
    }
}

/// `clients` callers, spread over `targets`, each sending random calls back to
/// back until `seconds` have passed; with `gate`, only while the gate admits.
async fn run_clients(targets: &[SocketAddr], options: &Options, gate: Option<Arc<PostHoc>>) -> Arc<Outcome> {
    let outcome = Arc::new(Outcome::default());
    let deadline = Instant::now() + Duration::from_secs_f64(options.seconds);
    let mut workers = Vec::new();
    for client in 0..options.clients {
        let addr = targets[client % targets.len()];
        let (outcome, gate) = (Arc::clone(&outcome), gate.clone());
        let seed = options.seed.wrapping_mul(1_000_003).wrapping_add(client as u64);
        workers.push(tokio::spawn(async move {
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
            let mut sender = connect(addr).await;
            while Instant::now() < deadline {
                if gate.as_ref().is_some_and(|g| !g.admits()) {
                    outcome.refused.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(REFUSED_PAUSE_MS)).await;
                    continue;
                }
                let body = chat_body(rng.gen_range(PROMPT_TOKENS), rng.gen_range(OUTPUT_BOUND));
                let (status, answer) = send(&mut sender, addr, Method::POST, "/v1/chat/completions", body).await;
                match status {
                    200 => {
                        outcome.served.fetch_add(1, Ordering::Relaxed);
                        if let Some(gate) = &gate {
                            gate.charge(&answer);
                        }
                    }
                    429 => {
                        outcome.refused.fetch_add(1, Ordering::Relaxed);
                        tokio::time::sleep(Duration::from_millis(REFUSED_PAUSE_MS)).await;
                    }
                    _ => {
                        if outcome.failed.fetch_add(1, Ordering::Relaxed) == 0 {
                            eprintln!("budget_proof: {status} {}", String::from_utf8_lossy(&answer));
                        }
                        sender = connect(addr).await;
                    }
                }
            }
        }));
    }
    for worker in workers {
        worker.await.expect("a client");
    }
    outcome
}

/// The simulator's bill: calls and pico-USD.
async fn sim_bill(sim: SocketAddr) -> (u64, u128, u64) {
    let bill = get_json(sim, "/sim/billing").await;
    let pico: u128 = bill["total"]["pico_usd"]
        .as_str()
        .and_then(|p| p.parse().ok())
        .expect("pico_usd");
    let unpriced = bill["unpriced_calls"].as_u64().unwrap_or(0);
    (bill["total"]["calls"].as_u64().unwrap_or(0), pico, unpriced)
}

/// The gateway's account of the budget's spend: the daily budget limit's use
/// (held and owed), micro-USD, read from `api`.
async fn budget_used_micro_usd(api: SocketAddr) -> u64 {
    let report = get_json(api, "/v1/admin/limits/gateway:usd:day").await;
    report["in_use"].as_u64().unwrap_or(0) + report["debt"].as_u64().unwrap_or(0)
}

/// The spend ledger's report of every call (`GET /v1/admin/gateway/spend`,
/// today, all groups summed): calls and micro-USD, read from `api` once it
/// counts `served` calls (it records off the calls' path) or after 10 s.
async fn spend_report(api: SocketAddr, served: u64) -> (u64, u64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let report = get_json(api, "/v1/admin/gateway/spend").await;
        let rows = report["rows"].as_array().cloned().unwrap_or_default();
        let calls: u64 = rows.iter().map(|r| r["calls"].as_u64().unwrap_or(0)).sum();
        let micro: u64 = rows
            .iter()
            .map(|r| {
                r["micro_usd"]
                    .as_str()
                    .and_then(|m| m.parse().ok())
                    .or(r["micro_usd"].as_u64())
                    .unwrap_or(0)
            })
            .sum();
        if calls >= served || Instant::now() >= deadline {
            return (calls, micro);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The spend report's cell: its sum against the simulator's bill.
fn report_cell(report: Option<(u64, u64)>, bill_pico: u128) -> String {
    match report {
        Some((calls, micro)) => {
            let gap = i128::try_from(u128::from(micro) * PICO_PER_MICRO).unwrap_or(i128::MAX) - bill_pico as i128;
            format!(
                "${:.6} ({calls} calls; report - simulator: {:+.6} µ$)",
                micro as f64 / 1e6,
                gap as f64 / 1e6
            )
        }
        None => String::new(),
    }
}

/// One row of the proof's table.
fn proof_row(
    name: &str,
    options: &Options,
    outcome: &Outcome,
    bill: (u64, u128, u64),
    gateway_micro_usd: Option<u64>,
    report: Option<(u64, u64)>,
) -> bool {
    let budget_pico = u128::from(options.budget_usd) * 1_000_000 * PICO_PER_MICRO;
    let (calls, pico, unpriced) = bill;
    let spend = match gateway_micro_usd {
        Some(micro) => {
            // The gateway rounds each call's cost up to a micro-dollar.
            let gap = i128::try_from(u128::from(micro) * PICO_PER_MICRO).unwrap_or(i128::MAX) - pico as i128;
            format!(
                "${:.6} (gateway - simulator: {:+.6} µ$, {calls} calls)",
                micro as f64 / 1e6,
                gap as f64 / 1e6
            )
        }
        None => "(not the gateway's)".to_owned(),
    };
    let report = report_cell(report, pico);
    println!(
        "| {name} | {} | {} | {} | ${:.6} | {:.4} | {spend} | {report} |",
        outcome.served.load(Ordering::Relaxed),
        outcome.refused.load(Ordering::Relaxed),
        outcome.failed.load(Ordering::Relaxed),
        pico as f64 / PICO_PER_USD,
        pico as f64 / budget_pico as f64,
    );
    if unpriced > 0 {
        println!("  ({unpriced} calls of an unpriced model: the bill is incomplete)");
    }
    pico <= budget_pico
}

/// The proof on memory, on a fleet of two, and the post-hoc gate.
async fn proof(options: &Options, directory: &Path) {
    println!(
        "\n{} clients for {} s each, ${} budget per day, prompts {PROMPT_TOKENS:?} tokens, output bounds {OUTPUT_BOUND:?}, output drawn in 1..=bound, {MS_PER_OUTPUT_TOKEN} ms per output token, {MODEL} at ${INPUT_USD_PER_MILLION}/${OUTPUT_USD_PER_MILLION} per million\n",
        options.clients, options.seconds, options.budget_usd
    );
    println!("| path | calls served | refused | failed | billed by the simulator | utilization (billed / budget) | the gateway's spend (budget limit) | the spend report |");
    println!("| --- | ---: | ---: | ---: | ---: | ---: | --- | --- |");
    let (_sim, sim) = start_sim(options, true, MS_PER_OUTPUT_TOKEN);
    let port = free_port();
    let yaml = gateway_yaml(port, sim, Some(options.budget_usd));
    let (server, api, gateway) = start_memory(options, &directory.join("memory"), &yaml, port);
    let outcome = run_clients(&[gateway], options, None).await;
    let served = outcome.served.load(Ordering::Relaxed);
    let within = proof_row(
        "gateway, memory",
        options,
        &outcome,
        sim_bill(sim).await,
        Some(budget_used_micro_usd(api).await),
        Some(spend_report(api, served).await),
    );
    drop(server);

    let (_cluster, addresses) = LocalCluster::from_env_or_start().expect("a TigerBeetle cluster");
    let (_sim, sim) = start_sim(options, true, MS_PER_OUTPUT_TOKEN);
    let binary = options.bin_dir.join("ratelimiterd");
    let mut servers = Vec::new();
    let mut gateways = Vec::new();
    for _ in 0..2 {
        let port = free_port();
        let yaml = gateway_yaml(port, sim, Some(options.budget_usd));
        servers.push(FleetServer::start(&binary, &addresses, &yaml).expect("a fleet server starts"));
        wait_listening(loopback(port));
        gateways.push(loopback(port));
    }
    let outcome = run_clients(&gateways, options, None).await;
    let used = budget_used_micro_usd(servers[0].addr).await;
    // Read from the other server: the report is the fleet's, from the cluster.
    let report = spend_report(servers[1].addr, outcome.served.load(Ordering::Relaxed)).await;
    let within_fleet = proof_row(
        "gateway, fleet of 2 on TigerBeetle",
        options,
        &outcome,
        sim_bill(sim).await,
        Some(used),
        Some(report),
    );
    drop(servers);

    let (_sim, sim) = start_sim(options, true, MS_PER_OUTPUT_TOKEN);
    let gate = Arc::new(PostHoc {
        budget_pico_usd: options.budget_usd * 1_000_000_000_000,
        spent_pico_usd: AtomicU64::new(0),
    });
    let outcome = run_clients(&[sim], options, Some(gate)).await;
    proof_row(
        "post-hoc check (admit while spent < budget)",
        options,
        &outcome,
        sim_bill(sim).await,
        None,
        None,
    );
    println!("\nthe gateway's bills within the budget: memory {within}, fleet {within_fleet}");
}

/// Open loop at `rate` for `seconds` over `connections`: latencies in µs from
/// each call's scheduled start, sorted.
async fn open_loop(addr: SocketAddr, rate: f64, seconds: f64, connections: usize) -> Vec<u64> {
    let total = (rate * seconds) as usize;
    let start = Instant::now() + Duration::from_millis(50);
    let body = chat_body(20, 1);
    let mut workers = Vec::with_capacity(connections);
    for worker in 0..connections {
        let body = body.clone();
        workers.push(tokio::spawn(async move {
            let mut sender = connect(addr).await;
            let mut samples = Vec::new();
            for i in (worker..total).step_by(connections) {
                let scheduled = start + Duration::from_secs_f64(i as f64 / rate);
                tokio::time::sleep_until(scheduled.into()).await;
                let (status, _) = send(&mut sender, addr, Method::POST, "/v1/chat/completions", body.clone()).await;
                assert_eq!(status, 200, "every call is served");
                samples.push(scheduled.elapsed().as_micros() as u64);
            }
            samples
        }));
    }
    let mut samples = Vec::new();
    for worker in workers {
        samples.extend(worker.await.expect("a worker"));
    }
    samples.sort_unstable();
    samples
}

fn percentile(sorted: &[u64], p: f64) -> u64 {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// What a call pays for its budgets: the same calls at `rate` through a gateway
/// with a price and a budget (far above the run's spend) and one without, in
/// alternating order by round.
async fn cost_of_budgets(options: &Options, directory: &Path) {
    const CONNECTIONS: usize = 64;
    const BUDGET_USD_HIGH: u64 = 1_000_000;
    let (_sim, sim) = start_sim(options, false, 0);
    let (port_with, port_without) = (free_port(), free_port());
    let with_yaml = gateway_yaml(port_with, sim, Some(BUDGET_USD_HIGH));
    let (_with, _, with) = start_memory(options, &directory.join("with"), &with_yaml, port_with);
    let without_yaml = gateway_yaml(port_without, sim, None);
    let (_without, _, without) = start_memory(options, &directory.join("without"), &without_yaml, port_without);
    for addr in [with, without] {
        open_loop(addr, options.rate, 1.0, CONNECTIONS).await;
    }
    println!(
        "\nlatency at {} req/s over {CONNECTIONS} connections, {} rounds of {} s (non-streamed, 1 output token):",
        options.rate, options.rounds, options.latency_seconds
    );
    let (mut p50, mut p99) = (Vec::new(), Vec::new());
    for round in 0..options.rounds {
        let mut order = [(true, with), (false, without)];
        if round % 2 == 1 {
            order.reverse();
        }
        let mut figures = [(0, 0); 2];
        for (budgets, addr) in order {
            let samples = open_loop(addr, options.rate, options.latency_seconds, CONNECTIONS).await;
            figures[usize::from(!budgets)] = (percentile(&samples, 0.5), percentile(&samples, 0.99));
        }
        let [(with50, with99), (without50, without99)] = figures;
        println!(
            "round {round}: with budgets p50 {:.3} ms p99 {:.3} ms; without p50 {:.3} ms p99 {:.3} ms",
            with50 as f64 / 1e3,
            with99 as f64 / 1e3,
            without50 as f64 / 1e3,
            without99 as f64 / 1e3
        );
        p50.push(with50 as f64 / without50.max(1) as f64);
        p99.push(with99 as f64 / without99.max(1) as f64);
    }
    println!(
        "with / without budgets, median over rounds: p50 {:.2}, p99 {:.2}",
        median(&mut p50),
        median(&mut p99)
    );
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let options = parse_options();
    let directory = std::env::temp_dir().join(format!("budget-proof-{}", std::process::id()));
    proof(&options, &directory).await;
    cost_of_budgets(&options, &directory).await;
    let _ = std::fs::remove_dir_all(&directory);
}
