//! Counting as the provider counts, measured (BENCHMARKS.md, "Gateway: counting
//! as the provider counts"): the gateway in front of the provider simulator
//! (in process, `replay::provider_server`), which counts text, images and the
//! prompt cache as the providers document (docs/provider-sim.md).
//!
//! - **Claude, calibrated**: a corpus of real prompts (the paragraphs of this
//!   repository's documentation and the functions of its Rust sources, in
//!   windows of 1 to 12, some of them after a long system prompt marked for the
//!   prompt cache) sent by `--workers` tenants at once to a Claude model with
//!   Anthropic's profile, whose input limit the simulator enforces as Anthropic
//!   does (token buckets; cache reads not counted). Each call's reservation is
//!   read from its tenant's `tokens_reserved_total` (one call in flight per
//!   tenant) and divided by the simulator's count of the prompt. Reported: the
//!   ratio's distribution during warm-up and after it, the simulator's 429s, and
//!   how much of the input limit the calls used.
//! - **Images**: OpenAI models with images of random sizes inlined as data URLs,
//!   one call at a time: reservation / the simulator's count.
//!
//! ```sh
//! cargo run --release -p gateway --example counting_bench -- [--calls 800] [--workers 16] [--itpm 400000]
//! ```

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine;
use gateway::metrics::GatewayMetrics;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use ratelimiter::memory::{MemoryBackend, MemoryConfig};
use ratelimiter::{Backend, SystemClock};
use replay::provider::{Accounting, ProviderLimits};
use replay::provider_server::ProviderServer;
use replay::sim_control::SimControl;
use replay::sim_profile::{ProfileName, SimProfile};
use serde_json::{json, Value};

/// Calls before the calibration is judged: the byte bound holds for the first
/// 32 samples of the model (`calibration::SAMPLES_MIN`); the workers' first
/// calls run at once, so a few more are still sized by it.
const WARM_UP_CALLS: usize = 64;
/// The longest prompt window, in corpus pieces.
const WINDOW_PIECES_MAX: usize = 12;
/// One call in this many continues after a cached system prompt.
const CACHED_EVERY: usize = 4;
/// Output tokens per call: small, so the input limit binds.
const OUTPUT_TOKENS: u64 = 8;

type HttpClient = Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>;

struct Options {
    calls: usize,
    workers: usize,
    itpm: u64,
}

fn options() -> Options {
    let mut options = Options {
        calls: 800,
        workers: 16,
        itpm: 400_000,
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    for pair in args.chunks(2) {
        let value = pair
            .get(1)
            .and_then(|v| v.parse().ok())
            .expect("a number after each flag");
        match pair[0].as_str() {
            "--calls" => options.calls = value as usize,
            "--workers" => options.workers = value as usize,
            "--itpm" => options.itpm = value,
            other => panic!("unknown flag {other}"),
        }
    }
    options
}

/// The corpus: paragraphs of the documentation and blank-line-separated blocks
/// of the Rust sources, in a fixed order.
fn corpus() -> Vec<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut files = Vec::new();
    for dir in [
        "docs",
        "crates/gateway/src",
        "crates/ratelimiter/src",
        "crates/replay/src",
    ] {
        let mut entries: Vec<_> = std::fs::read_dir(root.join(dir))
            .unwrap()
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|e| e == "md" || e == "rs"))
            .collect();
        entries.sort();
        files.extend(entries);
    }
    files.push(root.join("README.md"));
    let mut pieces = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        pieces.extend(
            text.split("\n\n")
                .map(str::trim)
                .filter(|p| p.len() >= 40)
                .map(str::to_owned),
        );
    }
    pieces
}

/// A deterministic generator: the same prompts in every run.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self, bound: usize) -> usize {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        ((self.0 >> 33) % bound as u64) as usize
    }
}

/// A simulator of `tpm`: with Anthropic's profile (its input limit `tpm`), or
/// OpenAI's sliding minute.
async fn start_sim(tpm: u64, anthropic: bool) -> (SocketAddr, Arc<ProviderServer>) {
    let limits = ProviderLimits {
        rpm: 1_000_000,
        tpm,
        window_ms: 60_000,
        concurrency: 10_000,
        ms_per_output_token: 0,
        accounting: Accounting::Actual,
    };
    let models = ["claude-sonnet-4-5", "gpt-4o", "gpt-4o-mini", "gpt-4.1-mini"];
    let control = SimControl::new(models.iter().map(|m| (*m).to_owned()).collect(), None);
    let provider = ProviderServer::with_control(limits, Arc::new(SystemClock::new()), control);
    if anthropic {
        let mut profile = SimProfile::with_defaults(ProfileName::Anthropic, &limits);
        profile.output_tpm = 100_000_000;
        provider.set_profile(profile);
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(Arc::clone(&provider).serve(listener, std::future::pending()));
    (addr, provider)
}

fn tenant_key(i: usize) -> String {
    format!("counting-bench-tenant-{i:03}-0123456789")
}

async fn start_gateway(
    sim: SocketAddr,
    claude_sim: SocketAddr,
    options: &Options,
) -> (SocketAddr, Arc<GatewayMetrics>) {
    let mut tenants = String::new();
    for i in 0..options.workers {
        std::env::set_var(format!("COUNTING_BENCH_KEY_{i}"), tenant_key(i));
        tenants.push_str(&format!("  - {{name: t{i}, api_key_env: COUNTING_BENCH_KEY_{i}}}\n"));
    }
    let itpm = options.itpm;
    let yaml = format!(
        "listen_addr: \"127.0.0.1:0\"\nupstreams:\n  - {{name: sim, kind: openai, base_url: \"http://{sim}\"}}\n  - {{name: simclaude, kind: anthropic, base_url: \"http://{claude_sim}\"}}\nmodels:\n  - {{name: claude-sonnet-4-5, upstream: simclaude, rpm: 1000000, input_tpm: {itpm}, output_tpm: 100000000, max_wait_ms: 120000, profile: anthropic}}\n  - {{name: gpt-4o, upstream: sim}}\n  - {{name: gpt-4o-mini, upstream: sim}}\n  - {{name: gpt-4.1-mini, upstream: sim}}\ntenants:\n{tenants}"
    );
    let config: gateway::GatewayConfig = serde_yaml::from_str(&yaml).unwrap();
    let backend: Arc<dyn Backend> = Arc::new(MemoryBackend::new(
        Arc::new(SystemClock::new()),
        MemoryConfig::default(),
    ));
    let gateway = gateway::Gateway::new(&config, backend.clone()).unwrap();
    for definition in gateway.definitions() {
        backend.apply_definition(definition).await.unwrap();
    }
    let metrics = gateway.metrics().clone();
    let app = gateway::router(Arc::new(gateway));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (addr, metrics)
}

fn reserved_total(metrics: &GatewayMetrics, model: &str, tenant: usize) -> u64 {
    let mut text = String::new();
    metrics.render(&mut text);
    let prefix = format!("ratelimiterd_gateway_tokens_reserved_total{{model=\"{model}\",tenant=\"t{tenant}\"}} ");
    text.lines()
        .find_map(|line| line.strip_prefix(&prefix))
        .map_or(0, |n| n.trim().parse().unwrap())
}

async fn call(client: &HttpClient, gateway: SocketAddr, path: &str, key: &str, body: &Value) -> (u16, Value) {
    let request = hyper::Request::post(format!("http://{gateway}{path}"))
        .header("content-type", "application/json")
        .header("x-api-key", key)
        .header("authorization", format!("Bearer {key}"))
        .header("anthropic-version", "2023-06-01")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap();
    let response = client.request(request).await.unwrap();
    let status = response.status().as_u16();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    (status, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
}

/// The `i`-th Claude prompt of the corpus.
fn claude_prompt(pieces: &[String], system: &str, i: usize) -> Value {
    let mut random = Lcg(i as u64 + 1);
    let start = random.next(pieces.len());
    let length = 1 + random.next(WINDOW_PIECES_MAX);
    let text: Vec<&str> = pieces
        .iter()
        .cycle()
        .skip(start)
        .take(length)
        .map(String::as_str)
        .collect();
    let mut body = json!({"model": "claude-sonnet-4-5", "max_tokens": OUTPUT_TOKENS,
        "messages": [{"role": "user", "content": text.join("\n\n")}]});
    if i % CACHED_EVERY == 0 {
        body["system"] = json!([{"type": "text", "text": system, "cache_control": {"type": "ephemeral"}}]);
    }
    body
}

fn quantile(sorted: &[f64], q: f64) -> f64 {
    sorted[((sorted.len() as f64 * q).ceil() as usize).clamp(1, sorted.len()) - 1]
}

/// Prints the distribution of reservation / provider's count over `calls`
/// (reserved, provider's count), the ratio of their sums, and the calls above
/// 1.3 with the largest provider's count among them.
fn describe(name: &str, calls: &[(u64, u64)]) {
    if calls.is_empty() {
        println!("{name}: no calls");
        return;
    }
    let mut ratios: Vec<f64> = calls.iter().map(|(r, p)| *r as f64 / *p as f64).collect();
    ratios.sort_by(f64::total_cmp);
    let (reserved, provider): (u64, u64) = calls.iter().fold((0, 0), |(a, b), (r, p)| (a + r, b + p));
    let above: Vec<u64> = calls
        .iter()
        .filter(|(r, p)| *r * 10 > *p * 13)
        .map(|(_, p)| *p)
        .collect();
    println!(
        "{name}: {} calls, reservation / provider's count: min {:.3}, p50 {:.3}, p99 {:.3}, max {:.3}, of the sums {:.3}; below 1: {}; above 1.3: {} (provider's count at most {})",
        ratios.len(),
        ratios[0],
        quantile(&ratios, 0.5),
        quantile(&ratios, 0.99),
        ratios[ratios.len() - 1],
        reserved as f64 / provider as f64,
        ratios.iter().filter(|r| **r < 1.0).count(),
        above.len(),
        above.iter().max().copied().unwrap_or(0),
    );
}

async fn claude_phase(options: &Options, gateway: SocketAddr, metrics: Arc<GatewayMetrics>, sim: &ProviderServer) {
    let pieces = Arc::new(corpus());
    let system: Arc<str> = Arc::from(pieces[..40].join("\n\n"));
    let bytes: usize = pieces.iter().map(String::len).sum();
    println!("corpus: {} pieces, {} bytes", pieces.len(), bytes);
    let next = Arc::new(AtomicUsize::new(0));
    let provider_input = Arc::new(AtomicU64::new(0));
    let client: HttpClient = Client::builder(TokioExecutor::new()).build_http();
    let started = Instant::now();
    let mut tasks = Vec::new();
    for worker in 0..options.workers {
        let (pieces, system, next, metrics) = (pieces.clone(), system.clone(), next.clone(), metrics.clone());
        let (client, calls, provider_input) = (client.clone(), options.calls, provider_input.clone());
        tasks.push(tokio::spawn(async move {
            let key = tenant_key(worker);
            let mut ratios = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= calls {
                    return ratios;
                }
                let body = claude_prompt(&pieces, &system, i);
                let before = reserved_total(&metrics, "claude-sonnet-4-5", worker);
                let (status, answer) = call(&client, gateway, "/v1/messages", &key, &body).await;
                assert_eq!(status, 200, "{answer}");
                let usage = &answer["usage"];
                let field = |name: &str| usage[name].as_u64().unwrap();
                let limited = field("input_tokens") + field("cache_creation_input_tokens");
                let whole = limited + field("cache_read_input_tokens");
                provider_input.fetch_add(limited, Ordering::Relaxed);
                let reserved = reserved_total(&metrics, "claude-sonnet-4-5", worker) - before - OUTPUT_TOKENS;
                ratios.push((i, (reserved, whole)));
            }
        }));
    }
    let mut all = Vec::new();
    for task in tasks {
        all.extend(task.await.unwrap());
    }
    let elapsed = started.elapsed();
    let (warm_up, after): (Vec<_>, Vec<_>) = all.into_iter().partition(|(i, _)| *i < WARM_UP_CALLS);
    let pairs = |calls: Vec<(usize, (u64, u64))>| calls.into_iter().map(|(_, pair)| pair).collect::<Vec<_>>();
    describe("claude warm-up (first 64 calls)", &pairs(warm_up));
    describe("claude after warm-up", &pairs(after));
    let counts = sim.counts();
    let input = provider_input.load(Ordering::Relaxed);
    // The bucket starts full: the limit's whole capacity plus its refill over the run.
    let offered = options.itpm as f64 * (1.0 + elapsed.as_secs_f64() / 60.0);
    println!(
        "claude: {:.1} s, simulator 429s {} (of {} admitted), input counted on ITPM {} = {:.1} % of the limit's capacity over the run",
        elapsed.as_secs_f64(),
        counts.throttled,
        counts.admitted,
        input,
        100.0 * input as f64 / offered
    );
}

/// A PNG's header of `width` x `height`, as a data URL.
fn png_url(width: u32, height: u32) -> String {
    let mut bytes = b"\x89PNG\r\n\x1a\n\x00\x00\x00\x0dIHDR".to_vec();
    bytes.extend(width.to_be_bytes());
    bytes.extend(height.to_be_bytes());
    bytes.extend([8, 6, 0, 0, 0, 0, 0, 0, 0]);
    format!(
        "data:image/png;base64,{}",
        base64::engine::general_purpose::STANDARD.encode(bytes)
    )
}

async fn image_phase(gateway: SocketAddr, metrics: &GatewayMetrics) {
    let client: HttpClient = Client::builder(TokioExecutor::new()).build_http();
    let key = tenant_key(0);
    let mut random = Lcg(7);
    for model in ["gpt-4o", "gpt-4o-mini", "gpt-4.1-mini"] {
        let mut ratios = Vec::new();
        for _ in 0..100 {
            let (width, height) = (16 + random.next(4_000) as u32, 16 + random.next(4_000) as u32);
            let detail = ["low", "high", "auto"][random.next(3)];
            // Four-byte words: one token each for o200k_base and for the simulator.
            let text = replay::prompt::synthesize(1 + random.next(200) as u64);
            let body = json!({"model": model, "max_tokens": OUTPUT_TOKENS, "messages": [{"role": "user", "content": [
                {"type": "text", "text": text},
                {"type": "image_url", "image_url": {"url": png_url(width, height), "detail": detail}}]}]});
            let before = reserved_total(metrics, model, 0);
            let (status, answer) = call(&client, gateway, "/v1/chat/completions", &key, &body).await;
            assert_eq!(status, 200, "{answer}");
            let provider = answer["usage"]["prompt_tokens"].as_u64().unwrap();
            let reserved = reserved_total(metrics, model, 0) - before - OUTPUT_TOKENS;
            ratios.push((reserved, provider));
        }
        describe(&format!("{model} with an image"), &ratios);
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let options = options();
    let (claude_sim, provider) = start_sim(options.itpm, true).await;
    let (sim, _) = start_sim(1_000_000_000, false).await;
    let (gateway, metrics) = start_gateway(sim, claude_sim, &options).await;
    claude_phase(&options, gateway, metrics.clone(), &provider).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    image_phase(gateway, &metrics).await;
}
