//! Prototype 1 (docs/testing.md, "Prototypes"): TigerBeetle semantics and lease ids.
//!
//! A rolling limit of capacity 2; three leases ask for 1 each: two are granted,
//! one denied. The denied lease retried stays denied (`id_already_failed`); a new
//! lease is granted once the window has passed.
//!
//! Run: `cargo run -p ratelimiterd --features tigerbeetle --example proto_tb_semantics`
//! against `TB_ADDRESS` (e.g. from `scripts/tigerbeetle.sh start`), or without it
//! against a cluster the example starts itself.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ratelimiter::retry::{Jitter, RetryAdvisor, RetryPolicy};
use ratelimiter::tigerbeetle::{BackendOptions, LocalCluster, TigerBeetleBackend, TigerBeetleConfig};
use ratelimiter::{
    Backend, LeaseId, LimitDefinition, LimitKey, Limiter, Requirement, ReserveRequest, ReserveResponse, SystemClock,
};

/// The window of the prototype's limit: short, so the last step is quick.
const WINDOW_SECONDS: u64 = 2;
/// How long the last step waits for the window to pass.
const RETRY_WAIT_MAX: Duration = Duration::from_secs(15);

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
    let key = LimitKey::new(format!("proto:semantics:{}", LeaseId::generate()))?;
    backend
        .apply_definition(&LimitDefinition::rolling(key.clone(), 2, WINDOW_SECONDS)?)
        .await?;
    println!("defined {key}: rolling, capacity 2, window {WINDOW_SECONDS} s");

    let leases: Vec<LeaseId> = (0..3).map(|_| LeaseId::generate()).collect();
    let mut denied = None;
    for lease in &leases {
        let response = reserve(&backend, *lease, &key).await?;
        println!("reserve {lease}: {}", serde_json::to_string(&response)?);
        if !response.allowed {
            denied = Some(*lease);
        }
    }
    let denied = denied.ok_or("expected the third lease to be denied")?;
    let retry = reserve(&backend, denied, &key).await?;
    println!(
        "retry of denied {denied} with the same lease id: {}",
        serde_json::to_string(&retry)?
    );
    assert_eq!(retry.error.as_deref(), Some("lease_already_failed"));

    let started = Instant::now();
    loop {
        let lease = LeaseId::generate();
        let response = reserve(&backend, lease, &key).await?;
        if response.allowed {
            println!("new lease {lease} granted after {:?}", started.elapsed());
            break;
        }
        if started.elapsed() > RETRY_WAIT_MAX {
            return Err("no grant after the window passed".into());
        }
        tokio::time::sleep(Duration::from_millis(response.retry_after_ms.clamp(50, 1_000))).await;
    }
    println!("semantics confirmed: a denied lease id stays denied; a new one is granted");
    Ok(())
}

async fn reserve(
    backend: &TigerBeetleBackend,
    lease: LeaseId,
    key: &LimitKey,
) -> Result<ReserveResponse, Box<dyn std::error::Error>> {
    let request = ReserveRequest::new(
        lease,
        None,
        vec![Requirement {
            key: key.clone(),
            amount: 1,
        }],
    )?;
    Ok(ReserveResponse::from(&backend.reserve(&request).await?))
}
