//! The gateway's added latency with 1 directory key and with 100,000, in the
//! same run (BENCHMARKS.md, "Gateway keys"): two memory-backend servers, one
//! whose directory holds the key used and nothing else, one whose directory
//! holds it among 100,000, both in front of one provider simulator. Rounds
//! alternate between the simulator called directly (the reference), the
//! gateway with 1 key and the gateway with 100,000; each call is a short
//! non-streaming chat completion, sequential. Prints the p50 and p99 of each
//! and what each gateway adds to the direct call.
//!
//! cargo build --release -p ratelimiterd --bin ratelimiterd --example gateway_keys_latency
//! target/release/examples/gateway_keys_latency

#[path = "support/directory_file.rs"]
mod directory_file;
#[path = "support/fleet_server.rs"]
#[allow(dead_code)]
mod fleet_server;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use ratelimiter::directory::KeyLimits;
use ratelimiter::SystemClock;
use replay::sim::control::SimControl;
use replay::sim::limits::{Accounting, ProviderLimits};
use replay::sim::server::ProviderServer;

/// Keys of the large directory.
const KEYS_LARGE: usize = 100_000;
/// Rounds, each calling the three targets in turn.
const ROUNDS: usize = 10;
/// Sequential calls per target per round.
const CALLS: usize = 200;
/// The key every gateway call presents: in both directories.
const KEY: &str = "rlk-gateway-latency-benchmark-key-0000000000000";

type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// Starts the binary on `dir` with a gateway in front of `sim`; the child and its gateway's address.
fn start(dir: &Path, sim: SocketAddr) -> (Child, SocketAddr) {
    let config = dir.join("config.yaml");
    std::env::set_var("GATEWAY_LATENCY_YAML_KEY", "gateway-latency-yaml-key-0123456789");
    let text = format!(
        "server:\n  listen_addr: \"127.0.0.1:0\"\nregistry:\n  path: {}\ngateway:\n  listen_addr: \"127.0.0.1:0\"\n  upstreams:\n    - {{name: sim, kind: openai, base_url: \"http://{sim}\"}}\n  models:\n    - {{name: gpt-4o-mini, upstream: sim, rpm: 100000000, tpm: 100000000000, concurrency: 64, max_output_tokens_default: 16}}\n  tenants:\n    - {{name: yaml, api_key_env: GATEWAY_LATENCY_YAML_KEY}}\n",
        dir.join("limits.json").display()
    );
    std::fs::write(&config, text).unwrap();
    let mut child = Command::new(fleet_server::default_binary())
        .arg("--config")
        .arg(&config)
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("build the binary first: cargo build --release -p ratelimiterd --bin ratelimiterd");
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let gateway = loop {
        let line = lines.next().expect("the server exited").unwrap();
        if let Some(addr) = line.split("gateway_addr=").nth(1) {
            break addr.split_whitespace().next().unwrap().parse().unwrap();
        }
    };
    // Drain the log so the server never blocks on a full pipe.
    std::thread::spawn(move || for _ in lines {});
    (child, gateway)
}

/// One short chat completion at `addr`; its latency.
async fn call(client: &HttpClient, addr: SocketAddr, key: &str) -> Duration {
    let body = r#"{"model": "gpt-4o-mini", "max_tokens": 4, "sim_output_tokens": 4, "messages": [{"role": "user", "content": "Hi"}]}"#;
    let request = hyper::Request::post(format!("http://{addr}/v1/chat/completions"))
        .header("content-type", "application/json")
        .header("authorization", format!("Bearer {key}"))
        .body(Full::new(Bytes::from_static(body.as_bytes())))
        .unwrap();
    let started = Instant::now();
    let response = client.request(request).await.unwrap();
    let status = response.status();
    response.into_body().collect().await.unwrap();
    assert_eq!(status, 200, "{addr}");
    started.elapsed()
}

fn percentile(values: &mut [Duration], p: f64) -> Duration {
    values.sort();
    values[((values.len() as f64 * p) as usize).min(values.len() - 1)]
}

#[tokio::main]
async fn main() {
    let limits = ProviderLimits {
        rpm: 100_000_000,
        tpm: 100_000_000_000,
        window_ms: 60_000,
        concurrency: 64,
        ms_per_output_token: 0,
        accounting: Accounting::Actual,
    };
    let provider = ProviderServer::with_control(limits, Arc::new(SystemClock::new()), SimControl::default());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let sim = listener.local_addr().unwrap();
    tokio::spawn(provider.serve(listener, std::future::pending()));

    let root = std::env::temp_dir().join(format!("gateway-keys-latency-{}", std::process::id()));
    let (one_dir, many_dir) = (root.join("one"), root.join("many"));
    let key_text = |i: usize| {
        if i == 0 {
            KEY.to_owned()
        } else {
            format!("rlk-latency-{i}")
        }
    };
    directory_file::write_directory(&one_dir, "bench", 1, key_text, KeyLimits::default());
    directory_file::write_directory(&many_dir, "bench", KEYS_LARGE, key_text, KeyLimits::default());
    let (mut one, one_addr) = start(&one_dir, sim);
    let (mut many, many_addr) = start(&many_dir, sim);
    let client: HttpClient = Client::builder(TokioExecutor::new()).build(HttpConnector::new());
    let targets = [
        ("direct", sim, "unused"),
        ("1 key", one_addr, KEY),
        ("100,000 keys", many_addr, KEY),
    ];
    // Warm every connection and the gateways' tokenizers.
    for (_, addr, key) in targets {
        for _ in 0..50 {
            call(&client, addr, key).await;
        }
    }
    let mut samples: Vec<Vec<Duration>> = vec![Vec::new(); targets.len()];
    for _ in 0..ROUNDS {
        for (i, (_, addr, key)) in targets.iter().enumerate() {
            for _ in 0..CALLS {
                samples[i].push(call(&client, *addr, key).await);
            }
        }
    }
    let stats: Vec<(Duration, Duration)> = (samples.iter_mut())
        .map(|s| (percentile(s, 0.5), percentile(s, 0.99)))
        .collect();
    println!("{} calls each, {ROUNDS} alternating rounds of {CALLS}", ROUNDS * CALLS);
    for ((name, _, _), (p50, p99)) in targets.iter().zip(&stats) {
        println!("{name:>14}: p50 {p50:?}, p99 {p99:?}");
    }
    let added = |i: usize| stats[i].0.saturating_sub(stats[0].0);
    println!(
        "added at p50: 1 key {:?}, 100,000 keys {:?}, ratio {:.2}",
        added(1),
        added(2),
        added(2).as_secs_f64() / added(1).as_secs_f64().max(1e-9)
    );
    let _ = (one.kill(), many.kill());
    let _ = (one.wait(), many.wait());
    let _ = std::fs::remove_dir_all(&root);
}
