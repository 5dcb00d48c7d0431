//! Prototype 5 (docs/testing.md, "Prototypes"), semantics half: prototypes 1 and 3 on the
//! memory backend, in real time, printing what the backend answered. Exits non-zero when
//! an answer is not the one the contract requires.
//!
//! `cargo run -p ratelimiter --example proto_memory`
//!
//! Scheduler half: two providers, one saturated, run through the scheduler in
//! tokio virtual time; prints each provider's throughput with and without the
//! saturated neighbour, and checks that the free one keeps at least 90% of it.
//! Then, in real time, what the scheduler costs per job next to calling the
//! backend directly in the same run.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ratelimiter::llm::{build_llm_actuals, build_llm_requirements};
use ratelimiter::scheduler::{ExecuteError, Job, JobHandle, JobSpec, Scheduler, SchedulerConfig};
use ratelimiter::TokioClock;

use ratelimiter::{
    Actual, Backend, CompleteRequest, Denial, LeaseId, LimitDefinition, LimitKey, Limiter, MemoryBackend, MemoryConfig,
    Requirement, ReserveOutcome, ReserveRequest, ReserveResponse, SystemClock,
};

/// How long prototype 1 polls for the window to pass before it gives up.
const EXPIRY_DEADLINE: Duration = Duration::from_secs(3);

fn reserve_request(lease: LeaseId, key: &LimitKey, amount: u64) -> ReserveRequest {
    let requirement = Requirement {
        key: key.clone(),
        amount,
    };
    ReserveRequest::new(lease, None, vec![requirement]).expect("valid request")
}

async fn reserve(backend: &MemoryBackend, label: &str, lease: LeaseId, key: &LimitKey, amount: u64) -> ReserveOutcome {
    let outcome = backend
        .reserve(&reserve_request(lease, key, amount))
        .await
        .expect("reserve");
    let wire = serde_json::to_string(&ReserveResponse::from(&outcome)).expect("json");
    println!("  {label:<44} lease {lease} -> {wire}");
    outcome
}

fn check(ok: bool, what: &str, failures: &mut Vec<String>) {
    println!("  {} {what}", if ok { "ok  " } else { "FAIL" });
    if !ok {
        failures.push(what.to_owned());
    }
}

async fn prototype_1(backend: &MemoryBackend, failures: &mut Vec<String>) {
    println!("prototype 1: rolling limit of 2 per 1 s, lease ids after a denial");
    let key = LimitKey::new("proto:rpm").unwrap();
    backend
        .apply_definition(&LimitDefinition::rolling(key.clone(), 2, 1).unwrap())
        .await
        .expect("define");
    let mut allowed = 0;
    let mut denied_lease = None;
    for attempt in 1..=3 {
        let lease = LeaseId::generate();
        match reserve(backend, &format!("attempt {attempt}"), lease, &key, 1).await {
            ReserveOutcome::Allowed { .. } => allowed += 1,
            ReserveOutcome::Denied(_) => denied_lease = Some(lease),
        }
    }
    check(
        allowed == 2 && denied_lease.is_some(),
        "three leases: two allowed, one denied",
        failures,
    );
    let Some(denied) = denied_lease else { return };
    let again = reserve(backend, "the denied lease again", denied, &key, 1).await;
    let still_denied = again == ReserveOutcome::Denied(Denial::LeaseAlreadyFailed);
    check(
        still_denied,
        "the same lease id stays denied (lease_already_failed)",
        failures,
    );
    let start = Instant::now();
    loop {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let outcome = reserve(backend, "a new lease after waiting", LeaseId::generate(), &key, 1).await;
        if outcome.is_allowed() {
            println!("  allowed {} ms after the denial", start.elapsed().as_millis());
            break;
        }
        if start.elapsed() > EXPIRY_DEADLINE {
            check(false, "a new lease is allowed once the window passed", failures);
            return;
        }
    }
    check(true, "a new lease is allowed once the window passed", failures);
}

async fn prototype_3(backend: &MemoryBackend, failures: &mut Vec<String>) {
    println!("prototype 3: reconciliation frees capacity early (tpm capacity 100 per 60 s)");
    let key = LimitKey::new("proto:tpm").unwrap();
    backend
        .apply_definition(&LimitDefinition::rolling(key.clone(), 100, 60).unwrap())
        .await
        .expect("define");
    let lease = LeaseId::generate();
    let first = reserve(backend, "reserve the upper bound, 100", lease, &key, 100).await;
    check(first.is_allowed(), "100 of 100 allowed", failures);
    let start = Instant::now();
    let actual = Actual {
        key: key.clone(),
        actual_amount: 10,
    };
    let complete = CompleteRequest::new(lease, None, vec![actual]).expect("valid request");
    backend.complete(&complete).await.expect("complete");
    println!("  completed with actual 10");
    let next = reserve(backend, "reserve 90 right after", LeaseId::generate(), &key, 90).await;
    let freed_ms = start.elapsed().as_millis();
    check(
        next.is_allowed(),
        &format!("90 allowed {freed_ms} ms after complete (< 1 s)"),
        failures,
    );
    let report = backend.limit_report(&key).await.expect("report").expect("defined");
    println!("  in_use {} of {}", report.in_use, report.state.definition().capacity());
    check(report.in_use == 100, "in_use is 10 + 90", failures);
}

/// Calls per provider in the scheduler half.
const SCHEDULER_JOBS: usize = 200;
/// How long each simulated LLM call takes.
const CALL_MS: u64 = 100;

/// Defines rpm and tpm per minute and concurrency for `provider`/`model`.
async fn define_model(backend: &MemoryBackend, provider: &str, rpm: u64, concurrency: u64) {
    let definitions = [
        LimitDefinition::rolling(LimitKey::llm_rpm(provider, "m").unwrap(), rpm, 60).unwrap(),
        LimitDefinition::rolling(LimitKey::llm_tpm(provider, "m").unwrap(), 10_000_000, 60).unwrap(),
        LimitDefinition::concurrency(LimitKey::llm_concurrency(provider, "m").unwrap(), concurrency, 300).unwrap(),
    ];
    for definition in &definitions {
        backend.apply_definition(definition).await.expect("define");
    }
}

/// Submits `count` calls of `provider` that take [`CALL_MS`] each, counting finished ones in `done`.
fn submit_calls(scheduler: &Scheduler, provider: &str, count: usize, done: &Arc<AtomicUsize>) -> Vec<JobHandle> {
    (0..count)
        .map(|i| {
            let spec = JobSpec {
                job_id: format!("{provider}-{i}"),
                tenant_id: "tenant_a".to_owned(),
                provider: provider.to_owned(),
                model: "m".to_owned(),
                prompt: "Summarise the design in one line.".to_owned(),
                max_output_tokens: 200,
                prompt_tokens: None,
                want_daily_budget: false,
                class: None,
            };
            let done = Arc::clone(done);
            let job = Job::new(spec, move || async move {
                tokio::time::sleep(Duration::from_millis(CALL_MS)).await;
                done.fetch_add(1, Ordering::Relaxed);
                Ok::<u64, ExecuteError>(120)
            });
            scheduler.submit(job).expect("room for every call")
        })
        .collect()
}

/// Runs the free provider's calls, after the saturated provider's when
/// `with_neighbour`. Returns the free provider's calls per second and the
/// saturated provider's calls finished meanwhile.
async fn free_provider_run(with_neighbour: bool) -> (f64, usize) {
    let backend = Arc::new(MemoryBackend::new(Arc::new(TokioClock::new()), MemoryConfig::default()));
    // Free: bound by 4 calls in flight of 100 ms, so 40 calls per second at best.
    define_model(&backend, "free", 100_000, 4).await;
    // Saturated: 5 requests per minute.
    define_model(&backend, "saturated", 5, 100).await;
    let scheduler = Scheduler::new(backend, 8);
    let (free_done, saturated_done) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let start = tokio::time::Instant::now();
    if with_neighbour {
        // Submitted first: a FIFO queue would put all of them ahead of the free provider.
        submit_calls(&scheduler, "saturated", SCHEDULER_JOBS, &saturated_done);
    }
    for handle in submit_calls(&scheduler, "free", SCHEDULER_JOBS, &free_done) {
        handle.await.expect("free provider call");
    }
    let elapsed = start.elapsed().as_secs_f64();
    let saturated = saturated_done.load(Ordering::Relaxed);
    scheduler
        .shutdown(std::future::ready(()))
        .await
        .expect("first shutdown");
    (free_done.load(Ordering::Relaxed) as f64 / elapsed, saturated)
}

/// Prototype 5's scheduler half: no head-of-line blocking between providers.
async fn prototype_5_scheduler(failures: &mut Vec<String>) {
    println!(
        "prototype 5, scheduler: {SCHEDULER_JOBS} calls of {CALL_MS} ms per provider, 8 workers, tokio virtual time"
    );
    // Virtual time: the scheduler, the calls and the backend (on TokioClock) share
    // one timeline that jumps when everything waits, so the run is exact and instant.
    tokio::time::pause();
    let wall = Instant::now();
    let (alone, _) = free_provider_run(false).await;
    let (beside, saturated) = free_provider_run(true).await;
    println!("  free provider alone                         {alone:6.1} calls/s");
    println!(
        "  free provider beside a saturated one        {beside:6.1} calls/s ({:.0}% of alone)",
        100.0 * beside / alone
    );
    println!("  saturated provider (5 requests/min) meanwhile {saturated:4} calls done");
    println!("  simulated in {} ms of wall time", wall.elapsed().as_millis());
    tokio::time::resume();
    check(
        beside >= 0.9 * alone,
        "the free provider keeps at least 90% of its throughput beside a saturated one",
        failures,
    );
    check(
        saturated == 5,
        "the saturated provider ran exactly its 5 requests per minute",
        failures,
    );
}

/// Jobs in the real-time overhead comparison.
const OVERHEAD_JOBS: usize = 20_000;

/// A job spec for the overhead comparison, over 10 tenants.
fn overhead_spec(i: usize) -> JobSpec {
    JobSpec {
        job_id: format!("job-{i}"),
        tenant_id: format!("tenant_{}", i % 10),
        provider: "fast".to_owned(),
        model: "m".to_owned(),
        prompt: "hello".to_owned(),
        max_output_tokens: 10,
        prompt_tokens: None,
        want_daily_budget: false,
        class: None,
    }
}

/// A real-time memory backend whose `fast/m` limits never deny.
async fn roomy_backend() -> Arc<MemoryBackend> {
    let backend = Arc::new(MemoryBackend::new(
        Arc::new(SystemClock::new()),
        MemoryConfig::default(),
    ));
    define_model(&backend, "fast", u64::MAX / 2, 1_000_000).await;
    backend
}

/// The reference: reserve, a spawned no-op call, complete, one job after another.
async fn direct_us_per_job() -> f64 {
    let backend = roomy_backend().await;
    let start = Instant::now();
    for i in 0..OVERHEAD_JOBS {
        let spec = overhead_spec(i);
        let call = spec.llm_call();
        let lease = LeaseId::generate();
        let requirements = build_llm_requirements(&call).expect("valid names");
        let request = ReserveRequest::new(lease, Some(spec.job_id.clone()), requirements).expect("valid request");
        assert!(backend.reserve(&request).await.expect("reserve").is_allowed());
        let tokens = tokio::spawn(async { 5 }).await.expect("no panic");
        let actuals = build_llm_actuals(&call, tokens).expect("valid names");
        let complete = CompleteRequest::new(lease, Some(spec.job_id.clone()), actuals).expect("valid request");
        backend.complete(&complete).await.expect("complete");
    }
    start.elapsed().as_secs_f64() * 1e6 / OVERHEAD_JOBS as f64
}

/// The same jobs submitted at once to a scheduler with 8 workers.
async fn scheduler_us_per_job() -> f64 {
    let config = SchedulerConfig::builder(8)
        .jobs_max(OVERHEAD_JOBS)
        .queue_jobs_max(OVERHEAD_JOBS)
        .build()
        .expect("valid config");
    let scheduler = Scheduler::with_config(roomy_backend().await, config);
    let start = Instant::now();
    let handles: Vec<JobHandle> = (0..OVERHEAD_JOBS)
        .map(|i| {
            let job = Job::new(overhead_spec(i), || async { Ok::<u64, ExecuteError>(5) });
            scheduler.submit(job).expect("room for every job")
        })
        .collect();
    for handle in handles {
        handle.await.expect("job");
    }
    start.elapsed().as_secs_f64() * 1e6 / OVERHEAD_JOBS as f64
}

/// What the scheduler costs per job, as a ratio to calling the backend directly
/// in the same run (machines are noisy; the ratio is what to compare).
async fn scheduler_overhead() {
    println!("scheduler overhead: {OVERHEAD_JOBS} no-op jobs, real time, best of 3");
    let mut direct = f64::MAX;
    let mut scheduled = f64::MAX;
    for _ in 0..3 {
        direct = direct.min(direct_us_per_job().await);
        scheduled = scheduled.min(scheduler_us_per_job().await);
    }
    println!("  direct reserve + call + complete  {direct:6.2} us/job");
    println!(
        "  through the scheduler             {scheduled:6.2} us/job ({:.2}x direct)",
        scheduled / direct
    );
}
#[tokio::main(flavor = "current_thread")]
async fn main() {
    let backend = Arc::new(MemoryBackend::new(
        Arc::new(SystemClock::new()),
        MemoryConfig::default(),
    ));
    let mut failures = Vec::new();
    prototype_1(&backend, &mut failures).await;
    prototype_3(&backend, &mut failures).await;
    scheduler_overhead().await;
    prototype_5_scheduler(&mut failures).await;
    if failures.is_empty() {
        println!("all prototype checks passed");
    } else {
        eprintln!("{} prototype checks failed: {failures:?}", failures.len());
        std::process::exit(1);
    }
}
