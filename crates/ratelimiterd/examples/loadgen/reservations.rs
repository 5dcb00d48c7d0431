//! `loadgen reservations --tigerbeetle ADDRESSES` (issue 4; BENCHMARKS.md,
//! "TigerBeetle backend"): reserve-only reservations per second, each a lease
//! of four requirements (rpm, tpm, concurrency, tenant budget), that is a linked
//! chain of four pending transfers, in three variants measured in one run and
//! interleaved round by round so that a noisy machine hurts them alike:
//!
//! - `client`: the reference, the same chains sent straight to the cluster by
//!   the Rust client from this process (`support/tb_reference.rs`);
//! - `direct`: `POST /v1/reserve` to a `ratelimiterd` on the TigerBeetle
//!   backend with `submit_mode: direct` (submitter off);
//! - `batching`: the same with `submit_mode: batching` (submitter on).
//!
//! Any server variant takes `:servers=N` (BENCHMARKS.md, "Fleet"): N servers of
//! the same settings on the same cluster, a fleet, the workers spread over
//! them round robin (worker w on server w mod N), as a load balancer or the
//! clients' own choice of a preferred server would; its CPU figure for the
//! server is the sum over the N servers.
//!
//! First closed loop (`--connections` workers back to back), then open loop
//! (`--rate` reservations per second in total, spread over `--open-connections`
//! workers on a fixed schedule, latency counted from when each was due, so a
//! stall shows as latency and not as a lower rate). Each phase reports the rate,
//! latency percentiles, the CPU every process spent per reservation (replica
//! with `--replica-pid`, the server, this load generator) and, for the servers,
//! the submitter's batch sizes, queue wait and TigerBeetle round trip from
//! `/metrics`. Reservations are never completed: they expire with their windows
//! (`--window-seconds`, 1 by default), so within a second the cluster expires as
//! many transfers as it creates, as a fleet's completes and expiries make it
//! release as many as it takes, and every phase pays for its own expiries.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::client::conn::http1::SendRequest;
use hyper::{Method, Request, StatusCode};
use ratelimiter::{LeaseId, LimitDefinition, LimitKey, LimitState};

use super::resources::{CpuSnapshot, ServerDelta};
use super::tb_reference::{Hold, ReferenceClient};
use super::{connect, percentile, scrape_metrics, Options, Server};

/// The limits of this benchmark, apart from the server benchmark's, so their
/// windows can differ: rpm, tpm, concurrency and a tenant budget.
const KEYS: [&str; 4] = ["resv:rpm", "resv:tpm", "resv:inflight", "tenant:resv:llm:budget"];
/// What one reservation holds of each limit: one request of 1,800 tokens.
const AMOUNTS: [u64; 4] = [1, 1_800, 1, 1_800];
/// Every limit's capacity: above what any run can hold (30,000 reservations/s
/// of 1,800 units for an hour is 1.9e11), so nothing is ever denied.
const CAPACITY: u64 = 1_000_000_000_000;
/// The first phase of each variant, not measured: connections and sessions
/// open, caches warm.
const WARM_UP_SECONDS: f64 = 1.0;
/// Latency samples kept per worker and phase: bounded memory, enough for p99.
const SAMPLES_PER_WORKER_MAX: usize = 200_000;
/// Linux reports CPU time in ticks of 1/100 s (USER_HZ).
const TICKS_PER_SECOND: f64 = 100.0;
/// The route of reservations.
const RESERVE_PATH: &str = "/v1/reserve";
/// The JSON echo route.
const ECHO_PATH: &str = "/v1/echo";
/// The server's answer to a granted reservation starts so.
const ALLOWED_PREFIX: &[u8] = br#"{"allowed":true"#;

/// How a variant reserves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// The Rust client straight to the cluster.
    Client,
    /// A server with `submit_mode: direct`.
    Direct,
    /// A server with `submit_mode: batching`.
    Batching,
    /// The same body to the `batching` server's JSON echo route: what HTTP and
    /// JSON alone cost, without the backend.
    Echo,
}

/// One way of reserving and its settings:
/// `kind[:sessions=N][:flush=MICROS][:events=N][:servers=N][:bin=PATH]`, e.g.
/// `batching:sessions=1:flush=1000`; unset settings come from the flags. `bin`
/// runs that variant's servers from another build, to compare two builds in
/// one run.
#[derive(Debug, Clone)]
struct Variant {
    label: String,
    kind: Kind,
    sessions: u32,
    flush_micros: Option<u64>,
    batch_events: Option<u32>,
    /// Servers of the variant, one fleet on the same cluster (server variants).
    servers: usize,
    /// The server binary, when not `--bin`'s.
    bin: Option<std::path::PathBuf>,
}

/// The most servers a variant may start: each holds client sessions of the
/// replica, which serves at most 32 (README.md, "Distributed mode").
const SERVERS_PER_VARIANT_MAX: usize = 16;

impl Variant {
    fn parse(spec: &str, options: &Options) -> Variant {
        let mut parts = spec.split(':');
        let kind = match parts.next().unwrap_or_default() {
            "client" => Kind::Client,
            "direct" => Kind::Direct,
            "batching" => Kind::Batching,
            "echo" => Kind::Echo,
            other => super::usage(&format!("unknown variant {other}")),
        };
        let mut variant = Variant {
            label: spec.to_owned(),
            kind,
            sessions: options.sessions,
            flush_micros: options.flush_micros,
            batch_events: options.batch_events,
            servers: 1,
            bin: None,
        };
        for setting in parts {
            let (name, value) = setting.split_once('=').unwrap_or((setting, ""));
            if name == "bin" && kind != Kind::Client {
                variant.bin = Some(std::path::PathBuf::from(value));
                continue;
            }
            let Ok(value) = value.parse::<u64>() else {
                super::usage(&format!("{spec}: {setting} is not name=number"));
            };
            match name {
                "sessions" => variant.sessions = value as u32,
                "flush" => variant.flush_micros = Some(value),
                "events" => variant.batch_events = Some(value as u32),
                "servers" => {
                    if kind == Kind::Client || !(1..=SERVERS_PER_VARIANT_MAX as u64).contains(&value) {
                        super::usage(&format!(
                            "{spec}: servers is 1..={SERVERS_PER_VARIANT_MAX}, for server variants only"
                        ));
                    }
                    variant.servers = value as usize;
                }
                _ => super::usage(&format!("{spec}: unknown setting {name}")),
            }
        }
        variant
    }

    /// The server's options, for the variants that have one.
    fn server_options(&self, options: &Options) -> Option<Options> {
        let mode = match self.kind {
            Kind::Client => return None,
            Kind::Direct => "direct",
            Kind::Batching | Kind::Echo => "batching",
        };
        Some(Options {
            submit_mode: mode.to_owned(),
            sessions: self.sessions,
            flush_micros: self.flush_micros,
            batch_events: self.batch_events,
            bin: self.bin.clone().unwrap_or_else(|| options.bin.clone()),
            ..options.clone()
        })
    }
}

/// Closed or open loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Loop {
    Closed,
    Open,
}

/// Where a worker sends its reservations.
#[derive(Clone)]
enum Target {
    /// The servers of the variant (worker w uses server w mod N), and the
    /// path of the route.
    Http(Arc<Vec<SocketAddr>>, &'static str),
    Client(Arc<ReferenceClient>),
}

/// A worker's own connection to its target.
enum Caller {
    Http(SendRequest<Full<Bytes>>, &'static str, BodyTemplate),
    Client(Arc<ReferenceClient>),
}

impl Caller {
    async fn open(target: &Target, worker: usize) -> Caller {
        match target {
            Target::Http(addrs, path) => {
                Caller::Http(connect(addrs[worker % addrs.len()]).await, path, BodyTemplate::new())
            }
            Target::Client(reference) => Caller::Client(reference.clone()),
        }
    }

    /// One reservation of a fresh lease; true when it was granted.
    async fn reserve(&mut self) -> bool {
        match self {
            Caller::Client(reference) => {
                reference.reserve().await;
                true
            }
            Caller::Http(sender, path, template) => {
                let body = template.body(LeaseId::generate());
                http_reserve(sender, path, body).await
            }
        }
    }
}

/// The reserve body, serialized once: only the lease id changes.
#[derive(Clone)]
struct BodyTemplate {
    head: Vec<u8>,
    tail: Vec<u8>,
}

impl BodyTemplate {
    fn new() -> BodyTemplate {
        let requirements: Vec<String> = KEYS
            .iter()
            .zip(AMOUNTS)
            .map(|(key, amount)| format!(r#"{{"key":"{key}","amount":{amount}}}"#))
            .collect();
        BodyTemplate {
            head: br#"{"lease_id":""#.to_vec(),
            tail: format!(r#"","requirements":[{}]}}"#, requirements.join(",")).into_bytes(),
        }
    }

    fn body(&self, lease: LeaseId) -> Bytes {
        let lease = lease.to_string();
        let mut body = Vec::with_capacity(self.head.len() + lease.len() + self.tail.len());
        body.extend_from_slice(&self.head);
        body.extend_from_slice(lease.as_bytes());
        body.extend_from_slice(&self.tail);
        Bytes::from(body)
    }
}

/// Sends one reserve (or echo) on a keep-alive connection; true when granted
/// (or echoed). A refusal or a 503 counts as a failure of the phase instead of
/// stopping the run.
async fn http_reserve(sender: &mut SendRequest<Full<Bytes>>, path: &'static str, body: Bytes) -> bool {
    if sender.ready().await.is_err() {
        return false;
    }
    let request = Request::builder()
        .method(Method::POST)
        .uri(path)
        .header("host", "bench")
        .header("content-type", "application/json")
        .body(Full::new(body))
        .expect("a valid request");
    let Ok(response) = sender.send_request(request).await else {
        return false;
    };
    let status = response.status();
    let Ok(answer) = response.into_body().collect().await else {
        return false;
    };
    let answer = answer.to_bytes();
    status == StatusCode::OK && (path == ECHO_PATH || answer.starts_with(ALLOWED_PREFIX))
}

/// What the workers of one phase measured.
#[derive(Default)]
struct Samples {
    granted: u64,
    failed: u64,
    /// Closed loop: from send to answer. Open loop: from when it was due.
    latencies_us: Vec<u64>,
    /// Open loop only: from send to answer.
    sent_latencies_us: Vec<u64>,
}

impl Samples {
    fn merge(&mut self, other: Samples) {
        self.granted += other.granted;
        self.failed += other.failed;
        self.latencies_us.extend(other.latencies_us);
        self.sent_latencies_us.extend(other.sent_latencies_us);
    }
}

/// `workers` workers reserve back to back for `seconds`.
async fn closed_loop(target: &Target, workers: usize, seconds: f64) -> (Samples, Duration) {
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::with_capacity(workers);
    for worker in 0..workers {
        let (stop, target) = (stop.clone(), target.clone());
        tasks.push(tokio::spawn(async move {
            let mut caller = Caller::open(&target, worker).await;
            let mut samples = Samples::default();
            while !stop.load(Ordering::Relaxed) {
                let sent = Instant::now();
                let granted = caller.reserve().await;
                record(&mut samples, granted, sent.elapsed(), None);
            }
            samples
        }));
    }
    let started = Instant::now();
    tokio::time::sleep(Duration::from_secs_f64(seconds)).await;
    stop.store(true, Ordering::Relaxed);
    let mut all = Samples::default();
    for task in tasks {
        all.merge(task.await.expect("worker panicked"));
    }
    (all, started.elapsed())
}

/// `rate` reservations per second in total for `seconds`, each worker on its
/// own fixed schedule (workers offset evenly); latency counts from when each
/// reservation was due.
async fn open_loop(target: &Target, workers: usize, seconds: f64, rate: f64) -> (Samples, Duration) {
    let interval = Duration::from_secs_f64(workers as f64 / rate);
    let per_worker = (seconds * rate / workers as f64) as u32;
    // Connections open before the schedule starts.
    let start = tokio::time::Instant::now() + Duration::from_millis(200);
    let mut tasks = Vec::with_capacity(workers);
    for w in 0..workers {
        let target = target.clone();
        let offset = interval.mul_f64(w as f64 / workers as f64);
        tasks.push(tokio::spawn(async move {
            let mut caller = Caller::open(&target, w).await;
            let mut samples = Samples::default();
            for i in 0..per_worker {
                let due = start + offset + interval * i;
                tokio::time::sleep_until(due).await;
                let sent = tokio::time::Instant::now();
                let granted = caller.reserve().await;
                record(&mut samples, granted, due.elapsed(), Some(sent.elapsed()));
            }
            samples
        }));
    }
    let mut all = Samples::default();
    for task in tasks {
        all.merge(task.await.expect("worker panicked"));
    }
    (all, start.elapsed())
}

fn record(samples: &mut Samples, granted: bool, latency: Duration, from_sent: Option<Duration>) {
    if granted {
        samples.granted += 1;
    } else {
        samples.failed += 1;
    }
    if samples.latencies_us.len() < SAMPLES_PER_WORKER_MAX {
        samples.latencies_us.push(latency.as_micros() as u64);
        if let Some(sent) = from_sent {
            samples.sent_latencies_us.push(sent.as_micros() as u64);
        }
    }
}

/// One measured phase.
struct Phase {
    /// The variant's index in the run's list.
    variant: usize,
    kind: Loop,
    samples: Samples,
    wall: Duration,
    /// CPU seconds of the replica, the variant's servers together, and this
    /// load generator.
    cpu_seconds: Vec<f64>,
    /// Busy share of the whole machine, and the share waiting for I/O.
    machine_busy: f64,
    machine_iowait: f64,
    server: Option<ServerDelta>,
}

/// What a variant talks to.
enum Endpoint {
    Reference(Arc<ReferenceClient>),
    /// One server, or the servers of a fleet.
    Servers(Vec<Server>, &'static str),
}

/// The servers and references under test, one per variant.
struct Bench {
    options: Options,
    variants: Vec<Variant>,
    endpoints: Vec<Endpoint>,
}

impl Bench {
    fn start(options: &Options, variants: Vec<Variant>) -> Result<Bench, Box<dyn std::error::Error>> {
        let addresses = options.tigerbeetle.clone().expect("reservations needs --tigerbeetle");
        let states = limits(options.window_seconds);
        let mut endpoints = Vec::new();
        // Servers first: they define the limits on the cluster at startup.
        for variant in &variants {
            if let Some(server_options) = variant.server_options(options) {
                let path = if variant.kind == Kind::Echo {
                    ECHO_PATH
                } else {
                    RESERVE_PATH
                };
                let servers = (0..variant.servers)
                    .map(|_| Server::start(&server_options, &states, 100_000))
                    .collect();
                endpoints.push(Some(Endpoint::Servers(servers, path)));
            } else {
                endpoints.push(None);
            }
        }
        let holds: Vec<Hold> = KEYS
            .iter()
            .zip(AMOUNTS)
            .map(|(key, amount)| Hold {
                key: LimitKey::new(*key).expect("a valid key"),
                amount,
                timeout_seconds: options.window_seconds,
            })
            .collect();
        let mut ready = Vec::new();
        for (variant, endpoint) in variants.iter().zip(endpoints) {
            let endpoint = match endpoint {
                Some(endpoint) => endpoint,
                None => Endpoint::Reference(Arc::new(ReferenceClient::connect(
                    0,
                    &addresses,
                    variant.sessions as usize,
                    holds.clone(),
                )?)),
            };
            ready.push(endpoint);
        }
        Ok(Bench {
            options: options.clone(),
            variants,
            endpoints: ready,
        })
    }

    /// The variant's servers (none for the reference client).
    fn servers(&self, variant: usize) -> &[Server] {
        match &self.endpoints[variant] {
            Endpoint::Reference(_) => &[],
            Endpoint::Servers(servers, _) => servers,
        }
    }

    fn target(&self, variant: usize) -> Target {
        match &self.endpoints[variant] {
            Endpoint::Reference(reference) => Target::Client(reference.clone()),
            Endpoint::Servers(servers, path) => Target::Http(Arc::new(servers.iter().map(|s| s.addr).collect()), path),
        }
    }

    /// The processes whose CPU is watched: the replica (0 when unknown), this
    /// process, then the variant's servers.
    fn pids(&self, variant: usize) -> Vec<u32> {
        let mut pids = vec![self.options.replica_pid.unwrap_or(0), std::process::id()];
        pids.extend(self.servers(variant).iter().map(|s| s.child.id()));
        pids
    }

    async fn run_phase(&self, variant: usize, kind: Loop, seconds: f64) -> Phase {
        let target = self.target(variant);
        let pids = self.pids(variant);
        let mut metrics_before = Vec::new();
        for server in self.servers(variant) {
            metrics_before.push(scrape_metrics(server.addr).await);
        }
        let cpu_before = CpuSnapshot::take(&pids);
        let (samples, wall) = match kind {
            Loop::Closed => closed_loop(&target, self.options.connections, seconds).await,
            Loop::Open => open_loop(&target, self.options.open_connections, seconds, self.options.rate).await,
        };
        let cpu_after = CpuSnapshot::take(&pids);
        // Counts summed over the servers; the percentiles are the first server's.
        let mut server: Option<ServerDelta> = None;
        for (s, before) in self.servers(variant).iter().zip(&metrics_before) {
            let delta = ServerDelta::between(before, &scrape_metrics(s.addr).await);
            match &mut server {
                Some(sum) => sum.add(&delta),
                None => server = Some(delta),
            }
        }
        let machine_total = (cpu_after.machine_total - cpu_before.machine_total).max(1) as f64;
        let cpu: Vec<f64> = (cpu_after.processes.iter().zip(&cpu_before.processes))
            .map(|(after, before)| after.saturating_sub(*before) as f64 / TICKS_PER_SECOND)
            .collect();
        Phase {
            variant,
            kind,
            samples,
            wall,
            // fold, not sum: an empty f64 sum is -0.0, printed "-0".
            cpu_seconds: vec![cpu[0], cpu[2..].iter().fold(0.0, |a, b| a + b), cpu[1]],
            machine_busy: (cpu_after.machine_busy - cpu_before.machine_busy) as f64 / machine_total,
            machine_iowait: (cpu_after.machine_iowait - cpu_before.machine_iowait) as f64 / machine_total,
            server,
        }
    }
}

fn limits(window_seconds: u32) -> Vec<LimitState> {
    let key = |k: &str| LimitKey::new(k).expect("a valid key");
    let window = u64::from(window_seconds);
    vec![
        LimitState::active(LimitDefinition::rolling(key(KEYS[0]), CAPACITY, window).expect("valid")),
        LimitState::active(LimitDefinition::rolling(key(KEYS[1]), CAPACITY, window).expect("valid")),
        LimitState::active(LimitDefinition::concurrency(key(KEYS[2]), CAPACITY, window).expect("valid")),
        LimitState::active(LimitDefinition::rolling(key(KEYS[3]), CAPACITY, window).expect("valid")),
    ]
}

/// The benchmark: warm-up, closed-loop rounds, open-loop rounds, summary.
pub async fn run(options: &Options) {
    let variants: Vec<Variant> = options.variants.iter().map(|v| Variant::parse(v, options)).collect();
    let bench = Bench::start(options, variants).unwrap_or_else(|e| panic!("cannot start: {e}"));
    println!(
        "reservations of {} transfers, windows of {} s; cluster {}; closed loop {} workers, open loop {} \
         workers at {} /s; {} s per phase, {} rounds; load average {}",
        KEYS.len(),
        options.window_seconds,
        options.tigerbeetle.as_deref().unwrap_or(""),
        options.connections,
        options.open_connections,
        options.rate,
        options.seconds,
        options.rounds,
        load_average()
    );
    for variant in 0..bench.variants.len() {
        bench.run_phase(variant, Loop::Closed, WARM_UP_SECONDS).await;
    }
    let mut phases = Vec::new();
    let loops = [Loop::Closed, Loop::Open].into_iter().filter(|l| {
        options
            .loops
            .iter()
            .any(|name| name.eq_ignore_ascii_case(&format!("{l:?}")))
    });
    for kind in loops {
        for round in 1..=options.rounds {
            for variant in 0..bench.variants.len() {
                let phase = bench.run_phase(variant, kind, options.seconds).await;
                print_phase(round, &bench.variants[variant].label, &phase);
                phases.push(phase);
            }
        }
    }
    println!("load average after: {}", load_average());
    print_summary(&bench.variants, &phases);
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

fn ms(us: u64) -> f64 {
    us as f64 / 1e3
}

fn print_phase(round: usize, label: &str, phase: &Phase) {
    let mut latencies = phase.samples.latencies_us.clone();
    latencies.sort_unstable();
    let rate = phase.samples.granted as f64 / phase.wall.as_secs_f64();
    let per_reservation = |cpu: f64| cpu * 1e6 / phase.samples.granted.max(1) as f64;
    print!(
        "{:?} round {round} {label:>8}: {rate:>7.0} /s, p50 {:.1} p95 {:.1} p99 {:.1} ms, failed {}; \
         CPU µs/reservation: replica {:.0}, server {:.0}, loadgen {:.0}; machine busy {:.0}% iowait {:.0}%",
        phase.kind,
        ms(percentile(&latencies, 0.5)),
        ms(percentile(&latencies, 0.95)),
        ms(percentile(&latencies, 0.99)),
        phase.samples.failed,
        per_reservation(phase.cpu_seconds[0]),
        per_reservation(phase.cpu_seconds[1]),
        per_reservation(phase.cpu_seconds[2]),
        phase.machine_busy * 100.0,
        phase.machine_iowait * 100.0,
    );
    if phase.kind == Loop::Open {
        let mut sent = phase.samples.sent_latencies_us.clone();
        sent.sort_unstable();
        print!(
            "; from sent p50 {:.1} p99 {:.1} ms",
            ms(percentile(&sent, 0.5)),
            ms(percentile(&sent, 0.99))
        );
    }
    if let Some(s) = &phase.server {
        print!(
            "; {:.1} reservations/batch, queue wait p50 {} p99 {} ms, TB p50 {} p99 {} ms, 503s {}",
            s.items as f64 / s.batches.max(1) as f64,
            s.queue_wait_ms.0,
            s.queue_wait_ms.1,
            s.round_trip_ms.0,
            s.round_trip_ms.1,
            s.queue_full + s.timeouts
        );
    }
    println!();
}

/// One markdown row per loop and variant, over every round; ratios are to the
/// first `client` variant.
fn print_summary(variants: &[Variant], phases: &[Phase]) {
    println!(
        "\n| loop | variant | reservations/s | vs client | p50 ms | p95 ms | p99 ms | failed | \
         CPU µs/res replica / server / loadgen | reservations per batch (largest, transfers) |"
    );
    println!("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |");
    let reference = variants.iter().position(|v| v.kind == Kind::Client);
    for kind in [Loop::Closed, Loop::Open] {
        if phases.iter().all(|p| p.kind != kind) {
            continue;
        }
        let of = |variant: usize| -> Vec<&Phase> {
            phases
                .iter()
                .filter(|p| p.kind == kind && p.variant == variant)
                .collect()
        };
        let rate_of = |variant: usize| {
            let granted: u64 = of(variant).iter().map(|p| p.samples.granted).sum();
            let wall: f64 = of(variant).iter().map(|p| p.wall.as_secs_f64()).sum();
            granted as f64 / wall.max(f64::MIN_POSITIVE)
        };
        let reference_rate = reference.map_or(f64::NAN, rate_of);
        for (i, variant) in variants.iter().enumerate() {
            print_row(kind, &variant.label, &of(i), rate_of(i), reference_rate);
        }
    }
}

fn print_row(kind: Loop, label: &str, phases: &[&Phase], rate: f64, reference: f64) {
    let mut latencies: Vec<u64> = phases
        .iter()
        .flat_map(|p| p.samples.latencies_us.iter().copied())
        .collect();
    latencies.sort_unstable();
    let granted: u64 = phases.iter().map(|p| p.samples.granted).sum();
    let failed: u64 = phases.iter().map(|p| p.samples.failed).sum();
    let cpu = |i: usize| phases.iter().map(|p| p.cpu_seconds[i]).sum::<f64>() * 1e6 / granted.max(1) as f64;
    let mut server = ServerDelta::default();
    for delta in phases.iter().filter_map(|p| p.server.as_ref()) {
        server.add(delta);
    }
    let batches = if server.batches == 0 {
        "-".to_owned()
    } else {
        format!(
            "{:.1} ({} transfers)",
            server.items as f64 / server.batches as f64,
            server.largest_batch
        )
    };
    println!(
        "| {kind:?} | {label} | {rate:.0} | {:.2} | {:.1} | {:.1} | {:.1} | {failed} | {:.0} / {:.0} / {:.0} | {batches} |",
        rate / reference,
        ms(percentile(&latencies, 0.5)),
        ms(percentile(&latencies, 0.95)),
        ms(percentile(&latencies, 0.99)),
        cpu(0),
        cpu(1),
        cpu(2),
    );
}
