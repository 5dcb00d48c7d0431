//! Prototype 4 (spec §12): a limit defined at runtime is usable at once, without
//! restarting anything. Starts `ratelimiterd` in-process on the memory backend
//! (loopback, a free port, a temporary registry), PUTs a new key, reserves on it
//! immediately, and prints what it saw.
//!
//! `cargo run -p ratelimiterd --example proto_server_dynamic_limits`

use std::time::Duration;

use ratelimiter::httpclient::{HttpClient, HttpClientConfig};
use ratelimiter::{LeaseId, LimitDefinition, LimitKey, Limiter, Requirement, ReserveOutcome, ReserveRequest};
use ratelimiterd::{Config, ServeOptions};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::temp_dir().join(format!("proto-dynamic-limits-{}", std::process::id()));
    let mut config = Config::defaults();
    config.registry.path = dir.join("limits.json");
    let state = ratelimiterd::start(&config).await?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}", listener.local_addr()?);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(ratelimiterd::serve(
        listener,
        state,
        ServeOptions::from_config(&config),
        async {
            let _ = stopped.await;
        },
    ));
    println!(
        "server on {url} (memory backend, registry {})",
        config.registry.path.display()
    );

    let client = HttpClient::new(HttpClientConfig::new(&url))?;
    let key = LimitKey::new(format!("global:llm:proto:model-{}:rpm", std::process::id()))?;
    println!("GET  {key}: {:?}", client.limit(&key).await?.map(|r| r.state.status()));
    let report = client.put_limit(&LimitDefinition::rolling(key.clone(), 2, 60)?).await?;
    println!(
        "PUT  {key}: capacity {} status {:?}",
        report.state.definition().capacity(),
        report.state.status()
    );

    let mut allowed = 0;
    for attempt in 1..=3 {
        let requirement = Requirement {
            key: key.clone(),
            amount: 1,
        };
        let request = ReserveRequest::new(LeaseId::generate(), None, vec![requirement])?;
        let outcome = client.reserve(&request).await?;
        match &outcome {
            ReserveOutcome::Allowed { reserved_at_unix_ms } => {
                allowed += 1;
                println!("reserve #{attempt}: allowed at {reserved_at_unix_ms}");
            }
            ReserveOutcome::Denied(denial) => println!(
                "reserve #{attempt}: denied {} (retry after {} ms)",
                denial.error_code(),
                denial.retry_after_ms()
            ),
        }
    }
    let report = client.limit(&key).await?.ok_or("the new key vanished")?;
    println!(
        "GET  {key}: in_use {} of {}",
        report.in_use,
        report.state.definition().capacity()
    );

    let _ = stop.send(());
    tokio::time::timeout(Duration::from_secs(10), server).await???;
    let _ = std::fs::remove_dir_all(&dir);
    if allowed != 2 {
        return Err(format!("expected 2 of 3 reservations allowed on a capacity of 2, got {allowed}").into());
    }
    println!("ok: the key defined at runtime was usable at once, without a restart");
    Ok(())
}
