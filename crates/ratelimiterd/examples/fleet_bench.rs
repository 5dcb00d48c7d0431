//! The fleet benchmark's latency figures (BENCHMARKS.md, "Fleet"): two real
//! `ratelimiterd` processes, A and B, on one TigerBeetle cluster.
//!
//! `complete`: Complete latency from the server's lease cache against from the
//! cluster. Each sample reserves a lease through A, then completes it through A
//! (the lease is in A's cache) or through B (B never saw it and reads the lease
//! back from the cluster first), alternating, so a noisy machine hurts both
//! alike. Each Complete reconciles a rolling key (actual below the reservation:
//! void and re-reserve) and releases a concurrency hold. The servers' counters
//! (`..._completes_from_cache_total`, `..._completes_from_cluster_total`) check
//! that every sample took the path it was meant to.
//!
//! `propagation`: how long a definition takes to reach the other server. Each
//! sample PUTs a new key through A and, from when A answered, polls B's
//! `ratelimiterd_tigerbeetle_definitions` gauge (reading `/metrics` does not make
//! B read the log) until it counts the key: the passive path, B's periodic read
//! of the cluster's log. Each sample starts after a random pause of up to one
//! refresh interval, so the PUTs fall at random points of B's 200 ms cycle
//! instead of locking onto it (back to back, every PUT would land just after
//! B's previous read). Then a second new key is PUT through A and at once
//! asked of B (`GET /v1/admin/limits/{key}`), which reads the log on an unknown
//! key: the on-demand path, as when a client uses a key right after defining it.
//!
//! ```sh
//! cargo build --release -p ratelimiterd --features tigerbeetle --bin ratelimiterd --example fleet_bench
//! target/release/examples/fleet_bench complete [--samples 2000] [--workers 1]
//! target/release/examples/fleet_bench propagation [--samples 300]
//! ```
//!
//! Against `TB_ADDRESS` (e.g. the three replicas of `scripts/tigerbeetle.sh
//! start 3`), or a single replica started here.

#[path = "support/fleet_server.rs"]
mod fleet_server;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ratelimiter::httpclient::{HttpClient, HttpClientConfig};
use ratelimiter::tigerbeetle::{LocalCluster, DEFINITIONS_REFRESH_INTERVAL_MS};
use ratelimiter::{
    Actual, CompleteRequest, LeaseId, LimitDefinition, LimitKey, Limiter, Requirement, ReserveOutcome, ReserveRequest,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use fleet_server::FleetServer;

/// Capacities above anything a run holds: nothing is denied.
const CAPACITY: u64 = 1_000_000_000_000;
/// Tokens reserved per lease, and reported as actually used: below the
/// reservation, so every Complete voids and re-reserves (the full path).
const TOKENS_RESERVED: u64 = 1_000;
const TOKENS_ACTUAL: u64 = 700;
/// Windows and hold timeouts longer than any run.
const WINDOW_SECONDS: u64 = 3_600;
/// Longest wait for B to count a new definition before the sample fails.
const PROPAGATION_WAIT_MAX: Duration = Duration::from_secs(5);
/// Between two reads of B's gauge: the resolution of the passive figure.
const GAUGE_POLL_INTERVAL: Duration = Duration::from_millis(2);
/// Unmeasured rounds first: connections, sessions and caches warm.
const WARM_UP_SAMPLES: usize = 50;
/// The largest `/metrics` answer read.
const METRICS_BYTES_MAX: u64 = 4 * 1024 * 1024;

type Error = Box<dyn std::error::Error + Send + Sync>;

struct Options {
    mode: String,
    samples: usize,
    workers: usize,
}

fn parse_options() -> Options {
    let mut args = std::env::args().skip(1);
    let mode = args.next().unwrap_or_default();
    let mut options = Options {
        samples: if mode == "propagation" { 300 } else { 2_000 },
        workers: 1,
        mode,
    };
    while let Some(flag) = args.next() {
        let value: usize = args.next().and_then(|v| v.parse().ok()).unwrap_or_else(|| usage(&flag));
        match flag.as_str() {
            "--samples" => options.samples = value,
            "--workers" => options.workers = value.max(1),
            _ => usage(&flag),
        }
    }
    options
}

fn usage(problem: &str) -> ! {
    eprintln!(
        "fleet_bench: bad argument {problem:?}\nusage: fleet_bench complete|propagation [--samples N] [--workers N]"
    );
    std::process::exit(2)
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    let options = parse_options();
    if options.mode != "complete" && options.mode != "propagation" {
        usage(&options.mode);
    }
    let (_cluster, addresses) = LocalCluster::from_env_or_start().map_err(|e| e.to_string())?;
    let bin = fleet_server::default_binary();
    let a = FleetServer::start(&bin, &addresses, "")?;
    let b = FleetServer::start(&bin, &addresses, "")?;
    println!(
        "cluster {}; server A {}, server B {}; load average {}",
        addresses.join(","),
        a.url(),
        b.url(),
        load_average()
    );
    let client_a = Arc::new(HttpClient::new(HttpClientConfig::new(a.url()))?);
    let client_b = Arc::new(HttpClient::new(HttpClientConfig::new(b.url()))?);
    if options.mode == "complete" {
        complete(&options, client_a, client_b, a.addr, b.addr).await?;
    } else {
        propagation(&options, &client_a, &client_b, b.addr).await?;
    }
    println!("load average after: {}", load_average());
    Ok(())
}

/// The keys of one lease: a rolling tpm limit and a concurrency limit.
struct Keys {
    tpm: LimitKey,
    inflight: LimitKey,
}

impl Keys {
    fn requirements(&self) -> Vec<Requirement> {
        vec![
            Requirement {
                key: self.tpm.clone(),
                amount: TOKENS_RESERVED,
            },
            Requirement {
                key: self.inflight.clone(),
                amount: 1,
            },
        ]
    }

    fn actuals(&self) -> Vec<Actual> {
        vec![Actual {
            key: self.tpm.clone(),
            actual_amount: TOKENS_ACTUAL,
        }]
    }
}

/// Reserves a lease through `reserver`, then times its Complete through `completer`.
async fn sample(reserver: &HttpClient, completer: &HttpClient, keys: &Keys) -> Result<Duration, Error> {
    let lease = LeaseId::generate();
    let outcome = reserver
        .reserve(&ReserveRequest::new(lease, None, keys.requirements())?)
        .await?;
    if !matches!(outcome, ReserveOutcome::Allowed { .. }) {
        return Err(format!("reservation denied: {outcome:?}").into());
    }
    let request = CompleteRequest::new(lease, None, keys.actuals())?;
    let started = Instant::now();
    completer.complete(&request).await?;
    Ok(started.elapsed())
}

async fn complete(
    options: &Options,
    a: Arc<HttpClient>,
    b: Arc<HttpClient>,
    a_addr: SocketAddr,
    b_addr: SocketAddr,
) -> Result<(), Error> {
    let run = LeaseId::generate();
    let keys = Arc::new(Keys {
        tpm: LimitKey::new(format!("fleetbench:{run}:tpm"))?,
        inflight: LimitKey::new(format!("fleetbench:{run}:concurrency"))?,
    });
    a.put_limit(&LimitDefinition::rolling(keys.tpm.clone(), CAPACITY, WINDOW_SECONDS)?)
        .await?;
    a.put_limit(&LimitDefinition::concurrency(
        keys.inflight.clone(),
        CAPACITY,
        WINDOW_SECONDS,
    )?)
    .await?;
    for _ in 0..WARM_UP_SAMPLES {
        sample(&a, &a, &keys).await?;
        sample(&a, &b, &keys).await?;
    }
    let counters_before = (
        metric(a_addr, CACHE_METRIC).await?,
        metric(b_addr, CLUSTER_METRIC).await?,
    );
    let per_worker = options.samples.div_ceil(options.workers);
    let started = Instant::now();
    let mut tasks = Vec::with_capacity(options.workers);
    for _ in 0..options.workers {
        let (a, b, keys) = (a.clone(), b.clone(), keys.clone());
        tasks.push(tokio::spawn(async move {
            let (mut cache, mut cluster) = (Vec::new(), Vec::new());
            for _ in 0..per_worker {
                cache.push(sample(&a, &a, &keys).await?);
                cluster.push(sample(&a, &b, &keys).await?);
            }
            Ok::<_, Error>((cache, cluster))
        }));
    }
    let (mut cache, mut cluster) = (Vec::new(), Vec::new());
    for task in tasks {
        let (c, l) = task.await??;
        cache.extend(c);
        cluster.extend(l);
    }
    let wall = started.elapsed();
    let from_cache = metric(a_addr, CACHE_METRIC).await? - counters_before.0;
    let from_cluster = metric(b_addr, CLUSTER_METRIC).await? - counters_before.1;
    println!(
        "{} samples per path, {} worker(s), {:.1} s; A counted {from_cache} completes from its cache, \
         B {from_cluster} from the cluster",
        cache.len(),
        options.workers,
        wall.as_secs_f64()
    );
    if from_cache != cache.len() as u64 || from_cluster != cluster.len() as u64 {
        return Err("a Complete did not take the path it was meant to (see the counters above)".into());
    }
    let cache = Percentiles::of(cache);
    let cluster = Percentiles::of(cluster);
    println!("| path | p50 | p90 | p99 | max |");
    println!("| --- | ---: | ---: | ---: | ---: |");
    println!("| complete on A, lease in A's cache | {} |", cache.row());
    println!("| complete on B, lease read from the cluster | {} |", cluster.row());
    println!(
        "cluster / cache: p50 {:.2}x, p99 {:.2}x",
        cluster.p50.as_secs_f64() / cache.p50.as_secs_f64(),
        cluster.p99.as_secs_f64() / cache.p99.as_secs_f64()
    );
    Ok(())
}

const CACHE_METRIC: &str = "ratelimiterd_tigerbeetle_completes_from_cache_total";
const CLUSTER_METRIC: &str = "ratelimiterd_tigerbeetle_completes_from_cluster_total";
const DEFINITIONS_METRIC: &str = "ratelimiterd_tigerbeetle_definitions";

async fn propagation(options: &Options, a: &HttpClient, b: &HttpClient, b_addr: SocketAddr) -> Result<(), Error> {
    let run = LeaseId::generate();
    let (mut passive, mut on_demand) = (Vec::new(), Vec::new());
    let started = Instant::now();
    for i in 0..options.samples {
        let pause = rand::random::<u64>() % DEFINITIONS_REFRESH_INTERVAL_MS;
        tokio::time::sleep(Duration::from_millis(pause)).await;
        // Passive: only B's periodic read of the log can make the gauge move.
        let before = metric(b_addr, DEFINITIONS_METRIC).await?;
        let key = LimitKey::new(format!("fleetbench:{run}:passive:{i}"))?;
        a.put_limit(&LimitDefinition::rolling(key, CAPACITY, WINDOW_SECONDS)?)
            .await?;
        let answered = Instant::now();
        loop {
            if metric(b_addr, DEFINITIONS_METRIC).await? > before {
                passive.push(answered.elapsed());
                break;
            }
            if answered.elapsed() > PROPAGATION_WAIT_MAX {
                return Err(format!("B did not count a new definition within {PROPAGATION_WAIT_MAX:?}").into());
            }
            tokio::time::sleep(GAUGE_POLL_INTERVAL).await;
        }
        // On demand: B is asked for the key right after A answered the PUT.
        let key = LimitKey::new(format!("fleetbench:{run}:on-demand:{i}"))?;
        a.put_limit(&LimitDefinition::rolling(key.clone(), CAPACITY, WINDOW_SECONDS)?)
            .await?;
        let answered = Instant::now();
        if b.limit(&key).await?.is_none() {
            return Err(format!("B did not know {key} right after the PUT on A").into());
        }
        on_demand.push(answered.elapsed());
    }
    println!(
        "{} samples per path in {:.1} s; gauge polled every {GAUGE_POLL_INTERVAL:?}",
        passive.len(),
        started.elapsed().as_secs_f64()
    );
    println!("| path: from A's PUT answered to B serving the key | p50 | p90 | p99 | max |");
    println!("| --- | ---: | ---: | ---: | ---: |");
    println!(
        "| passive: B's periodic read of the log (every 200 ms) | {} |",
        Percentiles::of(passive).row()
    );
    println!(
        "| on demand: B asked at once, reads the log for the unknown key | {} |",
        Percentiles::of(on_demand).row()
    );
    Ok(())
}

struct Percentiles {
    p50: Duration,
    p90: Duration,
    p99: Duration,
    max: Duration,
}

impl Percentiles {
    fn of(mut samples: Vec<Duration>) -> Percentiles {
        samples.sort_unstable();
        let at = |p: f64| {
            let index = ((samples.len() as f64 * p).ceil() as usize).clamp(1, samples.len().max(1)) - 1;
            samples.get(index).copied().unwrap_or_default()
        };
        Percentiles {
            p50: at(0.5),
            p90: at(0.9),
            p99: at(0.99),
            max: at(1.0),
        }
    }

    fn row(&self) -> String {
        let ms = |d: Duration| format!("{:.2} ms", d.as_secs_f64() * 1e3);
        format!(
            "{} | {} | {} | {}",
            ms(self.p50),
            ms(self.p90),
            ms(self.p99),
            ms(self.max)
        )
    }
}

/// One unlabelled metric of a server's `/metrics` (0 when absent), over a
/// connection of its own so that reading it never queues behind a request.
async fn metric(addr: SocketAddr, name: &str) -> Result<u64, Error> {
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n")
        .await?;
    let mut text = String::new();
    stream.take(METRICS_BYTES_MAX).read_to_string(&mut text).await?;
    Ok(text
        .lines()
        .filter_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
        .find_map(|value| value.trim().parse::<f64>().ok())
        .map_or(0, |v| v as u64))
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}
