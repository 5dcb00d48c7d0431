//! End to end: a small excerpt of the Azure code trace, replayed fast enough to
//! saturate a small provider. Through our scheduler over the memory backend the
//! provider never answers 429; with no limiter it does. The limits are defined
//! as the provider's (1 s windows) and the backend's default window margin
//! (`WINDOW_MARGIN_MS_DEFAULT`) covers the time from the grant to the provider's
//! admission, even with the scheduling delays of a debug build on a loaded
//! test machine.

use std::time::Duration;

use clap::Parser;
use replay::cli::Args;
use replay::summary::Summary;

/// A bound on one replay: it takes a few seconds; a hang fails the test instead.
const RUN_SECONDS_MAX: u64 = 120;

async fn run(strategy: &str) -> Summary {
    let args = args(strategy);
    tokio::time::timeout(Duration::from_secs(RUN_SECONDS_MAX), replay::run::run(&args))
        .await
        .expect("the replay ends by itself")
        .unwrap()
}

fn args(strategy: &str) -> Args {
    let trace = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/azure_code_excerpt.csv");
    Args::parse_from([
        "replay",
        "--trace",
        trace,
        "--format",
        "azure",
        "--strategy",
        strategy,
        "--requests",
        "200",
        "--speedup",
        "100",
        "--max-output-tokens",
        "256",
        "--provider-rpm",
        "1000",
        "--provider-tpm",
        "150000",
        "--provider-window-seconds",
        "1",
        "--provider-concurrency",
        "8",
        "--provider-ms-per-output-token",
        "1",
        "--quiet",
    ])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_replay_saturates_the_provider_without_a_429() {
    let summary = run("local").await;
    assert_eq!(summary.requests, 200);
    assert_eq!(summary.completed, 200, "{summary:?}");
    // Limits defined as the provider's, with the library's default window margin
    // and nothing else: no 429.
    assert_eq!(summary.provider_429, 0, "{summary:?}");
    // Every served request's grant and admission were seen, so the margin's
    // measurement covers them all.
    assert_eq!(summary.grant_to_admission.measured, 200, "{summary:?}");
    // The excerpt's 200 requests carry about 400 k tokens against 150 k a second:
    // demand exceeded capacity, so some windows were saturated.
    assert!(summary.saturated_windows > 0, "{summary:?}");
    assert!(summary.utilization <= 1.0, "{summary:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_limiter_the_same_replay_meets_429s() {
    let summary = run("none").await;
    assert_eq!(summary.completed, 200, "{summary:?}");
    assert!(summary.provider_429 > 0, "{summary:?}");
}
