//! The pool benchmark (BENCHMARKS.md, "Gateway pools"): one model served by three
//! deployments of 60, 30 and 10 % of the pool, each a `provider-sim` process with
//! its own limit, in front of `ratelimiterd`'s gateway.
//!
//! - utilization: load at 120 % of the pool's summed rpm for several one-minute
//!   windows, on the memory backend (one server) and, with `--tigerbeetle`, on a
//!   fleet of two servers sharing one cluster: each deployment's calls admitted by
//!   its simulator against its limit, the pool's against the sum, provider 429s;
//! - failover: at 50 % load, the largest deployment answers 429 (then, separately,
//!   500) for 10 s: errors the clients see, calls sent to it meanwhile, and the
//!   others' share per second;
//! - routing latency: at 1,000 req/s, the pooled model against a one-deployment
//!   model in the same run, alternating rounds (p50, p99 and the difference);
//! - with `--tigerbeetle`, at 80 % load on the fleet: the share of calls reserved
//!   on the first deployment tried (`admitted_after_denial` of the admin API).
//!
//! ```sh
//! cargo build --release -p ratelimiterd --bin ratelimiterd -p replay --bin provider-sim --example pool_bench
//! scripts/tigerbeetle.sh start   # optional: a local cluster on 127.0.0.1:3000
//! target/release/examples/pool_bench --bin-dir target/release [--tigerbeetle 127.0.0.1:3000] [--windows 3]
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

/// The pool's summed requests per minute: 100 calls a second at 100 % load.
const POOL_RPM: u64 = 6_000;
/// The deployments' shares of the pool, in percent.
const SHARES: [u64; 3] = [60, 30, 10];
/// The gateway key of the benchmark's tenant.
const TENANT_KEY: &str = "pool-bench-tenant-key-0123456789";

type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// The flags, as the usage line shows them.
const USAGE: &str = "[--bin-dir DIR] [--tigerbeetle ADDRESSES] [--memory on|off] [--windows N] [--latency-rate N] [--latency-seconds S] [--rounds N]";

struct Options {
    bin_dir: PathBuf,
    tigerbeetle: Option<String>,
    /// Whether the memory-backend phases run (`--memory off`: the fleet's only).
    memory: bool,
    windows: u64,
    latency_rate: f64,
    latency_seconds: f64,
    rounds: usize,
}

fn parse_options() -> Options {
    let mut options = Options {
        bin_dir: PathBuf::from("target/release"),
        tigerbeetle: None,
        memory: true,
        windows: 3,
        latency_rate: 1_000.0,
        latency_seconds: 5.0,
        rounds: 3,
    };
    let mut flags = Flags::from_env("pool_bench", USAGE);
    while let Some((flag, value)) = flags.next() {
        let number = || flags.parse::<f64>(&flag, &value, "a number");
        match flag.as_str() {
            "--bin-dir" => options.bin_dir = PathBuf::from(&value),
            "--tigerbeetle" => options.tigerbeetle = Some(value.clone()),
            "--memory" => options.memory = value != "off",
            "--windows" => options.windows = number() as u64,
            "--latency-rate" => options.latency_rate = number(),
            "--latency-seconds" => options.latency_seconds = number(),
            "--rounds" => options.rounds = number() as usize,
            _ => flags.fail(&format!("unknown flag {flag}")),
        }
    }
    if !(1..=30).contains(&options.windows) || !(1..=20).contains(&options.rounds) || options.latency_rate <= 0.0 {
        flags.fail("--windows 1..=30, --rounds 1..=20, --latency-rate > 0");
    }
    options
}

/// A deployment: provider-sim enforcing `rpm` (tokens and concurrency far above).
fn start_sim(options: &Options, rpm: u64) -> (Process, SocketAddr) {
    let rpm = rpm.to_string();
    let args = ["--rpm", &rpm, "--tpm", "1000000000000", "--concurrency", "100000"];
    let pace = ["--ms-per-output-token", "0", "--models", "gpt-4o,gpt-4o-mini"];
    bench_support::start_sim(&options.bin_dir, &[&args[..], &pace].concat())
}

struct Server {
    _process: Process,
    gateway: SocketAddr,
    api: SocketAddr,
}

/// ratelimiterd with a gateway: `gpt-4o` pooled over `sims` with `rpms`, and
/// `gpt-4o-mini` on the first sim alone (the one-deployment reference).
/// Upstreams are named `<run>d<i>`: each run's deployments have keys of their own
/// (a TigerBeetle cluster keeps the windows of the run before).
fn start_server(
    options: &Options,
    sims: &[SocketAddr],
    rpms: &[u64],
    run: &str,
    server: usize,
    tigerbeetle: bool,
) -> Server {
    let directory = std::env::temp_dir().join(format!("pool-bench-{}-{run}-{server}", std::process::id()));
    std::fs::create_dir_all(&directory).expect("a temporary directory");
    let (api_port, gateway_port) = (free_port(), free_port());
    // A rerun on the same cluster starts from fresh keys too.
    let run = format!("{run}{}", std::process::id());
    let backend = match &options.tigerbeetle {
        Some(addresses) if tigerbeetle => {
            format!("  backend: tigerbeetle\ntigerbeetle:\n  cluster_id: \"0\"\n  addresses: [{addresses}]\n")
        }
        _ => String::new(),
    };
    let mut config = format!(
        "server:\n  listen_addr: \"127.0.0.1:{api_port}\"\n{backend}registry:\n  path: \"{}\"\nlog:\n  level: warn\ngateway:\n  listen_addr: \"127.0.0.1:{gateway_port}\"\n  upstreams:\n",
        directory.join("limits.json").display()
    );
    for (i, sim) in sims.iter().enumerate() {
        config += &format!("    - {{name: {run}d{i}, kind: openai-compatible, base_url: \"http://{sim}\"}}\n");
    }
    config +=
        "  models:\n    - name: gpt-4o\n      max_output_tokens_default: 1\n      max_wait_ms: 0\n      deployments:\n";
    for (i, rpm) in rpms.iter().enumerate() {
        config += &format!("        - {{upstream: {run}d{i}, rpm: {rpm}}}\n");
    }
    config +=
        &format!("    - {{name: gpt-4o-mini, upstream: {run}d0, rpm: 1000000000, max_output_tokens_default: 1}}\n");
    config += "  tenants:\n    - {name: bench, api_key_env: POOL_BENCH_KEY}\n";
    let path = directory.join("ratelimiterd.yaml");
    std::fs::write(&path, config).expect("the config is written");
    let mut child = Command::new(options.bin_dir.join("ratelimiterd"))
        .arg("--config")
        .arg(&path)
        .env("POOL_BENCH_KEY", TENANT_KEY)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("ratelimiterd starts (build it with --release)");
    let stderr = child.stderr.take().expect("piped");
    std::thread::spawn(move || for _ in BufReader::new(stderr).lines() {});
    let gateway: SocketAddr = format!("127.0.0.1:{gateway_port}").parse().expect("an address");
    wait_listening(gateway);
    Server {
        _process: Process(child),
        gateway,
        api: format!("127.0.0.1:{api_port}").parse().expect("an address"),
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
    let response = client
        .request(
            hyper::Request::get(url)
                .body(Full::new(Bytes::new()))
                .expect("a request"),
        )
        .await
        .expect("an answer");
    let body = response.into_body().collect().await.expect("a body").to_bytes();
    serde_json::from_slice(&body).expect("JSON")
}

async fn arm(client: &HttpClient, sim: SocketAddr, fault: Value) {
    let request = hyper::Request::post(format!("http://{sim}/sim/faults"))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(fault.to_string())))
        .expect("a request");
    let response = client.request(request).await.expect("an answer");
    assert_eq!(response.status(), 204, "the fault is armed");
}

/// What one call came to: the status, whether the provider's own answer (it names
/// a deployment) or the gateway's, and its latency from its scheduled start.
#[derive(Debug, Clone, Copy)]
struct Outcome {
    status: u16,
    from_provider: bool,
    latency_us: u64,
    /// Seconds since the load started, when it was scheduled.
    second: u64,
}

/// Open loop: `rate` calls a second of `model` for `seconds`, spread over
/// `gateways` in turn, each scheduled at a fixed time.
async fn open_loop(client: &HttpClient, gateways: &[SocketAddr], model: &str, rate: f64, seconds: f64) -> Vec<Outcome> {
    let total = (rate * seconds) as usize;
    let start = Instant::now() + Duration::from_millis(50);
    let body = Bytes::from(format!(
        r#"{{"model":"{model}","messages":[{{"role":"user","content":"the cat sat"}}],"max_tokens":1}}"#
    ));
    let mut calls = Vec::with_capacity(total);
    for i in 0..total {
        let scheduled = start + Duration::from_secs_f64(i as f64 / rate);
        let (client, body, gateway) = (client.clone(), body.clone(), gateways[i % gateways.len()]);
        tokio::time::sleep_until(scheduled.into()).await;
        calls.push(tokio::spawn(async move {
            let request = hyper::Request::post(format!("http://{gateway}/v1/chat/completions"))
                .header("content-type", "application/json")
                .header("authorization", format!("Bearer {TENANT_KEY}"))
                .body(Full::new(body))
                .expect("a request");
            let (status, from_provider) = match client.request(request).await {
                Ok(response) => {
                    let status = response.status().as_u16();
                    let from_provider = response.headers().contains_key("x-ratelimit-deployment");
                    let _ = response.into_body().collect().await;
                    (status, from_provider)
                }
                Err(_) => (0, false),
            };
            Outcome {
                status,
                from_provider,
                latency_us: scheduled.elapsed().as_micros() as u64,
                second: (scheduled - start).as_secs(),
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
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn rpms(pool_rpm: u64) -> Vec<u64> {
    SHARES.iter().map(|share| pool_rpm * share / 100).collect()
}

/// Deployments at their limits: 120 % load for `windows` minutes on `servers`.
async fn utilization(options: &Options, label: &str, servers: usize) {
    let rpms = rpms(POOL_RPM);
    let sims: Vec<_> = rpms.iter().map(|rpm| start_sim(options, *rpm)).collect();
    let addrs: Vec<SocketAddr> = sims.iter().map(|s| s.1).collect();
    let fleet: Vec<Server> = (0..servers)
        .map(|i| start_server(options, &addrs, &rpms, label, i, servers > 1))
        .collect();
    let gateways: Vec<SocketAddr> = fleet.iter().map(|s| s.gateway).collect();
    let client = client();
    let seconds = (options.windows * 60) as f64;
    let outcomes = open_loop(&client, &gateways, "gpt-4o", 1.2 * POOL_RPM as f64 / 60.0, seconds).await;
    let served = outcomes.iter().filter(|o| o.status == 200).count();
    let provider_429 = outcomes.iter().filter(|o| o.status == 429 && o.from_provider).count();
    let mut line = format!(
        "{label}: {} calls at 120 % for {} windows: {served} served",
        outcomes.len(),
        options.windows
    );
    let mut total = 0;
    for (i, (sim, rpm)) in addrs.iter().zip(&rpms).enumerate() {
        let stats = get_json(&client, format!("http://{sim}/sim/stats")).await;
        let admitted = stats["counts"]["admitted"].as_u64().unwrap_or(0);
        let throttled = stats["counts"]["throttled"].as_u64().unwrap_or(0);
        total += admitted;
        let capacity = rpm * options.windows;
        line += &format!(
            "; d{i} ({}%): {admitted}/{capacity} = {:.1} %, {throttled} provider 429s",
            SHARES[i],
            100.0 * admitted as f64 / capacity as f64
        );
    }
    let capacity = POOL_RPM * options.windows;
    line += &format!(
        "; pool {total}/{capacity} = {:.1} %; provider 429s seen by clients: {provider_429}",
        100.0 * total as f64 / capacity as f64
    );
    println!("{line}");
}

/// The largest deployment fails for 10 s of a 20 s run at 50 % load.
async fn failover(options: &Options, fault: Value, label: &str) {
    let rpms = rpms(POOL_RPM);
    let sims: Vec<_> = rpms.iter().map(|rpm| start_sim(options, *rpm)).collect();
    let addrs: Vec<SocketAddr> = sims.iter().map(|s| s.1).collect();
    let server = start_server(options, &addrs, &rpms, &format!("failover{label}"), 0, false);
    let client = client();
    let load = {
        let client = client.clone();
        let gateway = server.gateway;
        tokio::spawn(async move { open_loop(&client, &[gateway], "gpt-4o", 0.5 * POOL_RPM as f64 / 60.0, 20.0).await })
    };
    tokio::time::sleep(Duration::from_secs(5)).await;
    let before = get_json(&client, format!("http://{}/sim/stats", addrs[0])).await["calls"]
        .as_u64()
        .unwrap_or(0);
    arm(&client, addrs[0], fault).await;
    tokio::time::sleep(Duration::from_secs(10)).await;
    let during = get_json(&client, format!("http://{}/sim/stats", addrs[0])).await["calls"]
        .as_u64()
        .unwrap_or(0)
        - before;
    let outcomes = load.await.expect("the load");
    let errors = outcomes.iter().filter(|o| o.status != 200).count();
    let mut per_second = [0u64; 20];
    for o in outcomes.iter().filter(|o| o.status == 200) {
        if let Some(slot) = per_second.get_mut(o.second as usize) {
            *slot += 1;
        }
    }
    let deployments = get_json(&client, format!("http://{}/v1/admin/gateway/deployments", server.api)).await;
    let failed_over = deployments[0]["failed_over"].as_u64().unwrap_or(0);
    println!(
        "failover {label}: {} calls at 50 %, {errors} client-visible errors; d0 received {during} calls in its 10 s of failure ({failed_over} failed over); served per second {per_second:?}",
        outcomes.len()
    );
}

/// The latency a pool adds: the pooled model against the one-deployment model.
async fn latency(options: &Options) {
    let rpms = [1_000_000_000u64; 3];
    let sims: Vec<_> = rpms.iter().map(|rpm| start_sim(options, *rpm)).collect();
    let addrs: Vec<SocketAddr> = sims.iter().map(|s| s.1).collect();
    let server = start_server(options, &addrs, &rpms, "latency", 0, false);
    let client = client();
    let (mut pool, mut single) = (Vec::new(), Vec::new());
    for round in 0..options.rounds {
        for (model, figures) in [("gpt-4o-mini", &mut single), ("gpt-4o", &mut pool)] {
            let outcomes = open_loop(
                &client,
                &[server.gateway],
                model,
                options.latency_rate,
                options.latency_seconds,
            )
            .await;
            assert!(outcomes.iter().all(|o| o.status == 200), "every call is served");
            let mut us: Vec<u64> = outcomes.iter().map(|o| o.latency_us).collect();
            us.sort_unstable();
            figures.push((percentile(&us, 0.5), percentile(&us, 0.99)));
            println!(
                "round {round} {model}: p50 {} us, p99 {} us",
                percentile(&us, 0.5),
                percentile(&us, 0.99)
            );
        }
    }
    let median = |values: &mut Vec<u64>| {
        values.sort_unstable();
        values[values.len() / 2]
    };
    let (mut p50s, mut p99s): (Vec<u64>, Vec<u64>) = single.iter().copied().unzip();
    let (single50, single99) = (median(&mut p50s), median(&mut p99s));
    let (mut p50s, mut p99s): (Vec<u64>, Vec<u64>) = pool.iter().copied().unzip();
    let (pool50, pool99) = (median(&mut p50s), median(&mut p99s));
    println!(
        "latency at {} req/s (median of {} rounds): one deployment p50 {single50} us p99 {single99} us; pool of 3 p50 {pool50} us p99 {pool99} us; added p50 {} us, p99 {} us",
        options.latency_rate,
        options.rounds,
        pool50 as i64 - single50 as i64,
        pool99 as i64 - single99 as i64
    );
}

/// On the TigerBeetle fleet at 80 % load: the share reserved on the first deployment tried.
async fn first_try(options: &Options) {
    let rpms = rpms(POOL_RPM);
    let sims: Vec<_> = rpms.iter().map(|rpm| start_sim(options, *rpm)).collect();
    let addrs: Vec<SocketAddr> = sims.iter().map(|s| s.1).collect();
    let fleet: Vec<Server> = (0..2)
        .map(|i| start_server(options, &addrs, &rpms, "tb80", i, true))
        .collect();
    let gateways: Vec<SocketAddr> = fleet.iter().map(|s| s.gateway).collect();
    let client = client();
    let outcomes = open_loop(&client, &gateways, "gpt-4o", 0.8 * POOL_RPM as f64 / 60.0, 60.0).await;
    let (mut admitted, mut after_denial) = (0, 0);
    for server in &fleet {
        let deployments = get_json(&client, format!("http://{}/v1/admin/gateway/deployments", server.api)).await;
        for d in deployments.as_array().into_iter().flatten() {
            admitted += d["admitted"].as_u64().unwrap_or(0);
            after_denial += d["admitted_after_denial"].as_u64().unwrap_or(0);
        }
    }
    let served = outcomes.iter().filter(|o| o.status == 200).count();
    println!(
        "tigerbeetle fleet at 80 %: {} calls, {served} served; {admitted} reserved, {} on the first deployment tried = {:.2} %",
        outcomes.len(),
        admitted - after_denial,
        100.0 * (admitted - after_denial) as f64 / admitted.max(1) as f64
    );
}

#[tokio::main]
async fn main() {
    let options = parse_options();
    if options.memory {
        latency(&options).await;
        let fault_429 = serde_json::json!({"mode": "status", "status": 429, "retry_after_ms": 1000, "for_ms": 10000});
        failover(&options, fault_429, "429").await;
        let fault_500 = serde_json::json!({"mode": "status", "status": 500, "for_ms": 10000});
        failover(&options, fault_500, "500").await;
        utilization(&options, "memory", 1).await;
    }
    if options.tigerbeetle.is_some() {
        utilization(&options, "tigerbeetle", 2).await;
        first_try(&options).await;
    }
}
