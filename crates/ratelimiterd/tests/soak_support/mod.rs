//! The short over-admission soak CI runs on each backend: one body, so the memory
//! and TigerBeetle runs check exactly the same things. The including test crate
//! declares the soak engine as `mod engine` (by `#[path]`), as the example does.

use std::time::Duration;

use ratelimiterd::config::Config;

use crate::engine::checker::check;
use crate::engine::workload::SoakOptions;
use crate::engine::{report, server, workload};

/// The CI run's length unless `RELIABILITY_SOAK_SECONDS` says otherwise.
const SOAK_SECONDS_DEFAULT: u64 = 4;

/// A fresh seed and the key prefix of a run of it, so runs never share limits.
pub fn seed_and_prefix(label: &str) -> (u64, String) {
    let seed = rand::random::<u64>();
    (seed, format!("{label}:{seed:x}"))
}

/// Runs the soak against an in-process server built from `config` and asserts
/// that nothing was over-admitted and that the run pushed its limits.
pub async fn soak_never_over_admits(config: &Config, seed: u64, prefix: String) {
    let seconds = std::env::var("RELIABILITY_SOAK_SECONDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(SOAK_SECONDS_DEFAULT);
    let running = server::start(config).await.expect("server");
    let options = SoakOptions {
        duration: Duration::from_secs(seconds),
        clients: 16,
        hold_seconds: 2,
        abandon_percent: 5,
        replay_percent: 5,
        call_ms_max: 30,
        change_interval: Duration::from_millis(300),
        sample_interval: Duration::from_millis(100),
        capacity_scale: 1,
        seed,
        prefix,
    };
    let (limits, records) = workload::run(options, &running.endpoints).await.expect("soak");
    running.stop().await;
    let verdict = check(&limits, &records);
    let text = report::render(&records, &verdict, Duration::from_secs(seconds));
    println!("seed {seed}\n{text}");
    assert!(report::passed(&records, &verdict), "seed {seed}\n{text}");
    // The run pushed the limits, or its verdict would say little.
    assert!(
        records.denials.get("insufficient_capacity").copied().unwrap_or(0) > 0,
        "{text}"
    );
    let peak = verdict.limits.iter().map(|l| l.peak_utilisation).fold(0.0, f64::max);
    assert!(peak >= 0.5, "no limit was pushed: {text}");
}
