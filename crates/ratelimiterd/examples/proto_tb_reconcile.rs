//! Prototype 3 (docs/testing.md, "Prototypes"): reconciliation frees capacity early.
//!
//! A TPM limit of 100; a lease reserves 100 and completes with 10 actually used
//! (void + re-reserve of 10 for the rest of the window); another lease asking
//! for 90 is then granted at once instead of after the window.
//!
//! Run: `cargo run -p ratelimiterd --features tigerbeetle --example proto_tb_reconcile`
//! against `TB_ADDRESS`, or without it against a cluster it starts itself.

use std::sync::Arc;
use std::time::Instant;

use ratelimiter::retry::{Jitter, RetryAdvisor, RetryPolicy};
use ratelimiter::tigerbeetle::{BackendOptions, LocalCluster, TigerBeetleBackend, TigerBeetleConfig};
use ratelimiter::{
    Actual, Backend, CompleteRequest, LeaseId, LimitDefinition, LimitKey, Limiter, Requirement, ReserveRequest,
    ReserveResponse, SystemClock,
};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (_cluster, address) = LocalCluster::from_env_or_start()?;
    println!("cluster at {}", address.join(","));
    let config = TigerBeetleConfig::for_addresses(0, address)?;
    let options = BackendOptions {
        retry: RetryAdvisor::new(RetryPolicy::default(), 1024, Jitter::from_entropy()),
        decrease_retry_ms: 10_000,
        window_margin_ms: ratelimiter::WINDOW_MARGIN_MS_DEFAULT,
        clock: Arc::new(SystemClock::new()),
    };
    let backend = TigerBeetleBackend::connect(&config, options, std::future::pending())?;
    let tpm = LimitKey::new(format!("proto:reconcile:{}:tpm", LeaseId::generate()))?;
    backend
        .apply_definition(&LimitDefinition::rolling(tpm.clone(), 100, 60)?)
        .await?;
    println!("defined {tpm}: rolling, capacity 100, window 60 s");

    let first = LeaseId::generate();
    let response = reserve(&backend, first, &tpm, 100).await?;
    println!("reserve 100 ({first}): {}", serde_json::to_string(&response)?);
    let blocked = reserve(&backend, LeaseId::generate(), &tpm, 90).await?;
    println!("reserve 90 before complete: {}", serde_json::to_string(&blocked)?);
    report(&backend, &tpm).await?;

    let started = Instant::now();
    let actuals = vec![Actual {
        key: tpm.clone(),
        actual_amount: 10,
    }];
    backend.complete(&CompleteRequest::new(first, None, actuals)?).await?;
    println!("complete with actual 10 took {:?}", started.elapsed());
    report(&backend, &tpm).await?;

    let second = reserve(&backend, LeaseId::generate(), &tpm, 90).await?;
    println!(
        "reserve 90 after complete: {} ({:?} after the complete started)",
        serde_json::to_string(&second)?,
        started.elapsed()
    );
    report(&backend, &tpm).await?;
    if !second.allowed {
        return Err("reconciliation did not free capacity".into());
    }
    println!("reconciliation freed 90 tokens of a 60 s window at once");
    Ok(())
}

async fn reserve(
    backend: &TigerBeetleBackend,
    lease: LeaseId,
    key: &LimitKey,
    amount: u64,
) -> Result<ReserveResponse, Box<dyn std::error::Error>> {
    let requirement = Requirement {
        key: key.clone(),
        amount,
    };
    let request = ReserveRequest::new(lease, None, vec![requirement])?;
    Ok(ReserveResponse::from(&backend.reserve(&request).await?))
}

async fn report(backend: &TigerBeetleBackend, key: &LimitKey) -> Result<(), Box<dyn std::error::Error>> {
    let report = backend.limit_report(key).await?.ok_or("limit vanished")?;
    println!("  in_use = {}, debt = {}", report.in_use, report.debt);
    Ok(())
}
