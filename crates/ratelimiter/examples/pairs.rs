//! Reserve+complete pairs per second of an LLM-shaped request (four
//! requirements) in the Rust library: the reference the Python package's
//! benchmark (`python/bench/bench_pairs.py`) compares itself against.
//!
//! `cargo run --release -p ratelimiter --example pairs -- [pairs] [http://host:port]`
//! prints `memory_pairs_per_s=N` and, with a server URL, `http_pairs_per_s=N`
//! (one caller, one pair after the other).

use std::sync::Arc;
use std::time::Instant;

use ratelimiter::httpclient::{HttpClient, HttpClientConfig};
use ratelimiter::{
    Actual, Backend, CompleteRequest, LeaseId, LimitDefinition, LimitKey, Limiter, MemoryBackend, MemoryConfig,
    Requirement, ReserveRequest, SystemClock,
};

/// Pairs measured when none are given: about a second on the memory backend.
const PAIRS_DEFAULT: u64 = 200_000;
/// Capacities far above what a run reserves, so every reserve is granted.
const CAPACITY_UNLIMITED: u64 = 1 << 50;

fn limits(model: &str) -> Vec<LimitDefinition> {
    vec![
        LimitDefinition::rolling(LimitKey::llm_rpm("bench", model).unwrap(), CAPACITY_UNLIMITED, 61).unwrap(),
        LimitDefinition::rolling(LimitKey::llm_tpm("bench", model).unwrap(), CAPACITY_UNLIMITED, 61).unwrap(),
        LimitDefinition::concurrency(
            LimitKey::llm_concurrency("bench", model).unwrap(),
            CAPACITY_UNLIMITED,
            300,
        )
        .unwrap(),
        LimitDefinition::rolling(
            LimitKey::tenant_daily_tokens("bench").unwrap(),
            CAPACITY_UNLIMITED,
            86_400,
        )
        .unwrap(),
    ]
}

async fn pairs_per_s(limiter: &dyn Limiter, model: &str, pairs: u64) -> f64 {
    let requirements: Vec<Requirement> = limits(model)
        .iter()
        .zip([1, 1_200, 1, 1_200])
        .map(|(d, amount)| Requirement {
            key: d.key().clone(),
            amount,
        })
        .collect();
    let actuals = vec![
        Actual {
            key: requirements[1].key.clone(),
            actual_amount: 700,
        },
        Actual {
            key: requirements[3].key.clone(),
            actual_amount: 700,
        },
    ];
    let started = Instant::now();
    for _ in 0..pairs {
        let lease = LeaseId::generate();
        let reserve = ReserveRequest::new(lease, None, requirements.clone()).unwrap();
        assert!(limiter.reserve(&reserve).await.unwrap().is_allowed());
        let complete = CompleteRequest::new(lease, None, actuals.clone()).unwrap();
        limiter.complete(&complete).await.unwrap();
    }
    pairs as f64 / started.elapsed().as_secs_f64()
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let mut args = std::env::args().skip(1);
    let pairs: u64 = args
        .next()
        .map_or(PAIRS_DEFAULT, |a| a.parse().expect("pairs is a number"));
    let backend = MemoryBackend::new(Arc::new(SystemClock::new()), MemoryConfig::default());
    for limit in limits("memory") {
        backend.apply_definition(&limit).await.unwrap();
    }
    println!("memory_pairs_per_s={:.0}", pairs_per_s(&backend, "memory", pairs).await);
    if let Some(url) = args.next() {
        let client = HttpClient::new(HttpClientConfig::new(url)).unwrap();
        for limit in limits("http") {
            client.put_limit(&limit).await.unwrap();
        }
        let http_pairs = (pairs / 20).max(1);
        println!("http_pairs_per_s={:.0}", pairs_per_s(&client, "http", http_pairs).await);
    }
}
