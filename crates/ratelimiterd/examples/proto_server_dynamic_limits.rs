//! Prototype 4 (docs/testing.md, "Prototypes"): a limit defined at runtime is usable at
//! once, without restarting TigerBeetle or any server.
//!
//! `--backend tigerbeetle` (the default, since the prototype is about not restarting
//! TigerBeetle): a TigerBeetle cluster (`TB_ADDRESS`, or a local replica started here)
//! and two real `ratelimiterd` processes on it, A and B. The key is defined through A and
//! reserved through B at once, its capacity raised through B and used through A at once,
//! and a lease reserved through B completed through A; every step is checked, and any
//! mismatch exits non-zero. This is the fleet promise: the cluster is the single source
//! of truth, so no server needs a restart, a registry file or to have seen the PUT.
//!
//! `--backend memory`: the original single-server check, `ratelimiterd`
//! in-process on the memory backend with a temporary registry.
//!
//! ```sh
//! cargo build -p ratelimiterd --features tigerbeetle --bin ratelimiterd --example proto_server_dynamic_limits
//! target/debug/examples/proto_server_dynamic_limits                 # or --backend memory
//! ```
//!
//! The servers' binary is `target/PROFILE/ratelimiterd` next to the example, or
//! `RATELIMITERD_BIN`.

#[path = "support/fleet_server.rs"]
mod fleet_server;

use std::time::{Duration, Instant};

use ratelimiter::httpclient::{HttpClient, HttpClientConfig};
use ratelimiter::tigerbeetle::LocalCluster;
use ratelimiter::{
    CompleteRequest, LeaseId, LimitDefinition, LimitKey, Limiter, Requirement, ReserveOutcome, ReserveRequest,
};
use ratelimiterd::{Config, ServeOptions};

use fleet_server::FleetServer;

/// The capacity the key is defined with, then raised to.
const CAPACITY_FIRST: u64 = 2;
const CAPACITY_RAISED: u64 = 3;
/// The rolling window of the rpm key, longer than the run: nothing expires.
const WINDOW_SECONDS: u64 = 60;
/// The hold timeout of the concurrency key.
const HOLD_TIMEOUT_SECONDS: u64 = 60;
/// How long the example waits for the other server's GET to show a raised
/// capacity (it reads the cluster's log every 200 ms): a bound, not a target.
const PROPAGATION_WAIT_MAX: Duration = Duration::from_secs(2);
/// Between two GETs while waiting.
const POLL_INTERVAL: Duration = Duration::from_millis(10);

type Error = Box<dyn std::error::Error>;

#[tokio::main]
async fn main() -> Result<(), Error> {
    let backend = parse_backend()?;
    match backend.as_str() {
        "tigerbeetle" => tigerbeetle().await,
        "memory" => memory().await,
        other => Err(format!("--backend {other}: expected memory or tigerbeetle").into()),
    }
}

fn parse_backend() -> Result<String, Error> {
    let mut args = std::env::args().skip(1);
    let mut backend = "tigerbeetle".to_owned();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--backend" => backend = args.next().ok_or("--backend needs memory or tigerbeetle")?,
            "-h" | "--help" => {
                println!("usage: proto_server_dynamic_limits [--backend memory|tigerbeetle]");
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument {other}").into()),
        }
    }
    Ok(backend)
}

/// A reservation of `amount` on each of `keys` through `client`; true when allowed.
async fn reserve(client: &HttpClient, label: &str, keys: &[&LimitKey], lease: LeaseId) -> Result<bool, Error> {
    let requirements = keys
        .iter()
        .map(|key| Requirement {
            key: (*key).clone(),
            amount: 1,
        })
        .collect();
    let started = Instant::now();
    let outcome = client.reserve(&ReserveRequest::new(lease, None, requirements)?).await?;
    let took = started.elapsed();
    match outcome {
        ReserveOutcome::Allowed { .. } => {
            println!("{label}: allowed ({took:?})");
            Ok(true)
        }
        ReserveOutcome::Denied(denial) => {
            println!(
                "{label}: denied {} (retry after {} ms)",
                denial.error_code(),
                denial.retry_after_ms()
            );
            Ok(false)
        }
    }
}

/// Fails the run with `what` unless `ok`.
fn check(ok: bool, what: &str) -> Result<(), Error> {
    if ok {
        Ok(())
    } else {
        Err(format!("MISMATCH: {what}").into())
    }
}

async fn tigerbeetle() -> Result<(), Error> {
    let (_cluster, addresses) = LocalCluster::from_env_or_start()?;
    println!("cluster at {}", addresses.join(","));
    let bin = fleet_server::default_binary();
    let a = FleetServer::start(&bin, &addresses, "")?;
    let b = FleetServer::start(&bin, &addresses, "")?;
    println!("server A on {}, server B on {} ({})", a.url(), b.url(), bin.display());
    let client_a = HttpClient::new(HttpClientConfig::new(a.url()))?;
    let client_b = HttpClient::new(HttpClientConfig::new(b.url()))?;

    let run = LeaseId::generate();
    let rpm = LimitKey::new(format!("global:llm:proto4:{run}:rpm"))?;
    let inflight = LimitKey::new(format!("global:llm:proto4:{run}:concurrency"))?;
    check(client_b.limit(&rpm).await?.is_none(), "B knows the key before any PUT")?;
    println!("GET  B {rpm}: unknown, as expected");

    let started = Instant::now();
    client_a
        .put_limit(&LimitDefinition::rolling(rpm.clone(), CAPACITY_FIRST, WINDOW_SECONDS)?)
        .await?;
    client_a
        .put_limit(&LimitDefinition::concurrency(
            inflight.clone(),
            CAPACITY_FIRST,
            HOLD_TIMEOUT_SECONDS,
        )?)
        .await?;
    println!(
        "PUT  A {rpm}: rolling, capacity {CAPACITY_FIRST}; {inflight}: concurrency, capacity {CAPACITY_FIRST} ({:?})",
        started.elapsed()
    );

    // B has not seen the PUT: an unknown key makes it read the cluster's log at once.
    let first = LeaseId::generate();
    let keys = [&rpm, &inflight];
    check(
        reserve(&client_b, "reserve B #1 (right after the PUT on A)", &keys, first).await?,
        "the first reservation through B, on a key defined through A, was not allowed",
    )?;
    check(
        reserve(&client_a, "reserve A #2", &keys, LeaseId::generate()).await?,
        "the second reservation (capacity 2) was not allowed",
    )?;
    check(
        !reserve(&client_b, "reserve B #3", &keys, LeaseId::generate()).await?,
        "a third reservation on a capacity of 2 was allowed: the servers do not share usage",
    )?;

    // Completing B's lease through A: A never saw it, and reads it from the cluster.
    client_a
        .complete(&CompleteRequest::new(first, None, Vec::new())?)
        .await?;
    println!("complete A (lease reserved through B): ok");
    let report = client_b.limit(&inflight).await?.ok_or("B lost the concurrency key")?;
    println!("GET  B {inflight}: in_use {}", report.in_use);
    check(
        report.in_use == 1,
        &format!(
            "{inflight} in use {} after the complete through A, expected 1",
            report.in_use
        ),
    )?;

    // Raised through B, used through A at once: capacity is the cluster's.
    client_b
        .put_limit(&LimitDefinition::rolling(rpm.clone(), CAPACITY_RAISED, WINDOW_SECONDS)?)
        .await?;
    let raised = Instant::now();
    println!("PUT  B {rpm}: capacity {CAPACITY_RAISED}");
    check(
        reserve(
            &client_a,
            "reserve A #4 (rpm only, right after the raise on B)",
            &[&rpm],
            LeaseId::generate(),
        )
        .await?,
        "the raised capacity was not usable through A at once",
    )?;
    let waited = Instant::now();
    let mut seen = None;
    while waited.elapsed() < PROPAGATION_WAIT_MAX {
        let report = client_a.limit(&rpm).await?.ok_or("A lost the rpm key")?;
        if report.state.definition().capacity() == CAPACITY_RAISED {
            seen = Some(report);
            break;
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
    let report = seen.ok_or(format!(
        "MISMATCH: A's GET did not show capacity {CAPACITY_RAISED} within {PROPAGATION_WAIT_MAX:?}"
    ))?;
    println!(
        "GET  A {rpm}: capacity {} in_use {} (A's own definition caught up {:?} after B's PUT answered)",
        report.state.definition().capacity(),
        report.in_use,
        raised.elapsed()
    );
    check(
        report.in_use == CAPACITY_RAISED,
        &format!("{rpm} in use {} through A, expected {CAPACITY_RAISED}", report.in_use),
    )?;
    println!("ok: keys defined and changed at runtime through one server were usable at once through the other, without restarting TigerBeetle or a server");
    Ok(())
}

async fn memory() -> Result<(), Error> {
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
    let report = client
        .put_limit(&LimitDefinition::rolling(key.clone(), CAPACITY_FIRST, WINDOW_SECONDS)?)
        .await?;
    println!(
        "PUT  {key}: capacity {} status {:?}",
        report.state.definition().capacity(),
        report.state.status()
    );

    let mut allowed = 0;
    for attempt in 1..=3 {
        if reserve(&client, &format!("reserve #{attempt}"), &[&key], LeaseId::generate()).await? {
            allowed += 1;
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
    check(
        allowed == CAPACITY_FIRST,
        &format!("expected {CAPACITY_FIRST} of 3 reservations allowed, got {allowed}"),
    )?;
    println!("ok: the key defined at runtime was usable at once, without a restart");
    Ok(())
}
