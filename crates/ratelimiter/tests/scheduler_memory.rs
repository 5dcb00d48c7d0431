//! The scheduler against the memory backend, both on one paused tokio timeline:
//! no head-of-line blocking between providers, tenant fairness within one, and
//! no leaked reservation whatever the call does.

mod scheduler_support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use ratelimiter::memory::{MemoryBackend, MemoryConfig};
use ratelimiter::scheduler::{
    ExecuteError, Job, JobError, JobHandle, Scheduler, SchedulerConfig, SubmitErrorKind, WorkClass,
};
use ratelimiter::{Backend, LimitDefinition, LimitKey, TokioClock};
use scheduler_support::{sleeping_job, spec, Recorder};
use tokio::time::Instant;

/// A memory backend on tokio time.
fn backend() -> Arc<MemoryBackend> {
    Arc::new(MemoryBackend::new(Arc::new(TokioClock::new()), MemoryConfig::default()))
}

/// Defines rpm and tpm per minute and concurrency for `provider`/`model`.
async fn define(backend: &MemoryBackend, provider: &str, model: &str, rpm: u64, tpm: u64, concurrency: u64) {
    let definitions = [
        LimitDefinition::rolling(LimitKey::llm_rpm(provider, model).unwrap(), rpm, 60).unwrap(),
        LimitDefinition::rolling(LimitKey::llm_tpm(provider, model).unwrap(), tpm, 60).unwrap(),
        LimitDefinition::concurrency(LimitKey::llm_concurrency(provider, model).unwrap(), concurrency, 300).unwrap(),
    ];
    for definition in &definitions {
        backend.apply_definition(definition).await.unwrap();
    }
}

async fn in_use(backend: &MemoryBackend, key: LimitKey) -> u64 {
    backend.limit_report(&key).await.unwrap().unwrap().in_use
}

fn config(workers: usize) -> SchedulerConfig {
    SchedulerConfig::builder(workers).jitter_seed(11).build().unwrap()
}

/// Submits `count` jobs of `provider`/`model` lasting 100 ms each.
fn submit_many(scheduler: &Scheduler, provider: &str, count: usize) -> Vec<JobHandle> {
    (0..count)
        .map(|i| {
            let job_spec = spec(&format!("{provider}-{i}"), "tenant_a", provider, "m");
            scheduler.submit(sleeping_job(job_spec, 100, 50)).unwrap()
        })
        .collect()
}

/// Jobs of the free provider per second of tokio time, with or without a
/// saturated neighbour submitted ahead of them.
async fn free_provider_throughput(with_saturated_neighbour: bool) -> f64 {
    let backend = backend();
    // The free provider is bound by its 4 calls in flight: 40 calls per second.
    define(&backend, "free", "m", 100_000, 10_000_000, 4).await;
    // The saturated one admits 5 requests a minute.
    define(&backend, "saturated", "m", 5, 10_000_000, 100).await;
    let scheduler = Scheduler::with_config(backend.clone(), config(8));
    let start = Instant::now();
    if with_saturated_neighbour {
        submit_many(&scheduler, "saturated", 200);
    }
    let free = submit_many(&scheduler, "free", 200);
    for handle in free {
        handle.await.unwrap();
    }
    let elapsed = Instant::now() - start;
    scheduler.shutdown(std::future::ready(())).await.unwrap();
    200.0 / elapsed.as_secs_f64()
}

#[tokio::test(start_paused = true)]
async fn a_saturated_provider_does_not_slow_another() {
    let alone = free_provider_throughput(false).await;
    let beside = free_provider_throughput(true).await;
    println!("free provider: alone {alone:.2} jobs/s, beside a saturated provider {beside:.2} jobs/s");
    assert!(
        alone > 30.0,
        "the free provider runs near its concurrency bound alone: {alone:.1}/s"
    );
    assert!(
        beside >= 0.9 * alone,
        "alone {alone:.1}/s, beside a saturated provider {beside:.1}/s"
    );
}

#[tokio::test(start_paused = true)]
async fn a_small_tenant_is_served_among_the_first_despite_a_large_burst() {
    let backend = backend();
    define(&backend, "openai", "gpt-4o", 100_000, 100_000_000, 2).await;
    let scheduler = Scheduler::with_config(backend.clone(), config(2));
    let finished = Arc::new(Mutex::new(Vec::new()));
    let job = |job_id: String, tenant: &str| {
        let finished = finished.clone();
        let job_spec = spec(&job_id, tenant, "openai", "gpt-4o");
        Job::new(job_spec, move || async move {
            tokio::time::sleep(Duration::from_millis(100)).await;
            finished.lock().unwrap().push(job_id);
            Ok::<u64, ExecuteError>(50)
        })
    };
    let mut handles: Vec<_> = (0..1_000)
        .map(|i| scheduler.submit(job(format!("a-{i}"), "tenant_a")).unwrap())
        .collect();
    handles.extend((0..10).map(|i| scheduler.submit(job(format!("b-{i}"), "tenant_b")).unwrap()));
    for handle in handles {
        handle.await.unwrap();
    }

    let finished = finished.lock().unwrap();
    assert_eq!(finished.len(), 1_010);
    let b_positions: Vec<usize> = (0..finished.len()).filter(|i| finished[*i].starts_with("b-")).collect();
    assert_eq!(b_positions.len(), 10);
    // Turns alternate between the tenants: B's tenth job is about the twentieth to finish.
    assert!(b_positions.iter().all(|p| *p < 25), "B finished at {b_positions:?}");
}

#[tokio::test(start_paused = true)]
async fn a_denied_job_retries_with_a_new_lease_once_capacity_returns() {
    let backend = backend();
    define(&backend, "openai", "gpt-4o", 2, 100_000, 10).await;
    let recorder = Recorder::new(backend.clone());
    let scheduler = Scheduler::with_config(recorder.clone(), config(3));
    let start = Instant::now();
    let handles: Vec<_> = (0..3)
        .map(|i| {
            scheduler
                .submit(sleeping_job(spec(&format!("job-{i}"), "t", "openai", "gpt-4o"), 10, 7))
                .unwrap()
        })
        .collect();
    for handle in handles {
        handle.await.unwrap();
    }

    let third = recorder.reserves_of("job-2");
    assert!(third.len() >= 2, "{third:?}");
    assert!(!third[0].2, "denied first: 2 requests per minute");
    assert!(third.last().unwrap().2, "granted in the end");
    assert!(
        third[1..].iter().all(|r| r.0 != third[0].0),
        "a new lease after the denial"
    );
    let granted_at = third.last().unwrap().1 - start;
    assert!(
        granted_at >= Duration::from_secs(60),
        "only once the window passed: {granted_at:?}"
    );
    assert!(granted_at < Duration::from_secs(62), "and soon after: {granted_at:?}");
}

#[tokio::test(start_paused = true)]
async fn failing_and_panicking_calls_release_their_concurrency() {
    let backend = backend();
    define(&backend, "openai", "gpt-4o", 100, 100_000, 1).await;
    let scheduler = Scheduler::with_config(backend.clone(), config(2));
    let concurrency = LimitKey::llm_concurrency("openai", "gpt-4o").unwrap();
    let tpm = LimitKey::llm_tpm("openai", "gpt-4o").unwrap();

    let fails = Job::new(spec("fails", "t", "openai", "gpt-4o"), || async {
        Err::<u64, ExecuteError>("connection reset".into())
    });
    assert!(matches!(
        scheduler.submit(fails).unwrap().await,
        Err(JobError::Execute(_))
    ));
    assert_eq!(in_use(&backend, concurrency.clone()).await, 0);
    assert_eq!(in_use(&backend, tpm.clone()).await, 0, "a failed call used no tokens");

    let panics = Job::new(spec("panics", "t", "openai", "gpt-4o"), || async {
        panic!("bug");
        #[allow(unreachable_code)]
        Ok::<u64, ExecuteError>(0)
    });
    assert!(matches!(
        scheduler.submit(panics).unwrap().await,
        Err(JobError::Panicked)
    ));
    assert_eq!(in_use(&backend, concurrency.clone()).await, 0);
    assert_eq!(
        in_use(&backend, tpm.clone()).await,
        100,
        "unknown usage keeps the upper bound"
    );

    // With a capacity of 1, this could not run if either lease had leaked.
    let done = scheduler
        .submit(sleeping_job(spec("next", "t", "openai", "gpt-4o"), 10, 30))
        .unwrap();
    let started = Instant::now();
    assert_eq!(done.await.unwrap().actual_tokens, 30);
    assert!(Instant::now() - started < Duration::from_secs(1));
}

#[tokio::test(start_paused = true)]
async fn jobs_that_can_never_run_fail_at_once() {
    let backend = backend();
    define(&backend, "openai", "gpt-4o", 100, 50, 1).await;
    let scheduler = Scheduler::with_config(backend.clone(), config(1));
    let start = Instant::now();
    let too_big = scheduler
        .submit(sleeping_job(spec("big", "t", "openai", "gpt-4o"), 10, 1))
        .unwrap();
    assert!(matches!(too_big.await, Err(JobError::ExceedsCapacity { key }) if key.as_str().ends_with(":tpm")));
    let unknown = scheduler
        .submit(sleeping_job(spec("unknown", "t", "anthropic", "claude"), 10, 1))
        .unwrap();
    assert!(matches!(
        unknown.await,
        Err(JobError::Limiter(ratelimiter::LimiterError::UnknownKey(_)))
    ));
    assert_eq!(Instant::now(), start);
}

/// Classes `interactive` (share 4) and `batch` (share 1), highest first.
fn two_classes(workers: usize) -> SchedulerConfig {
    let classes = vec![
        WorkClass::new("interactive", 4).unwrap(),
        WorkClass::new("batch", 1).unwrap(),
    ];
    SchedulerConfig::builder(workers)
        .jitter_seed(11)
        .classes(classes)
        .build()
        .unwrap()
}

/// A 100 ms job of `tenant` in `class` that records its id when it finishes.
fn recorded_job(finished: &Arc<Mutex<Vec<String>>>, job_id: String, tenant: &str, class: Option<&str>) -> Job {
    let finished = finished.clone();
    let mut job_spec = spec(&job_id, tenant, "openai", "gpt-4o");
    job_spec.class = class.map(str::to_owned);
    Job::new(job_spec, move || async move {
        tokio::time::sleep(Duration::from_millis(100)).await;
        finished.lock().unwrap().push(job_id);
        Ok::<u64, ExecuteError>(50)
    })
}

#[tokio::test(start_paused = true)]
async fn freed_capacity_goes_to_waiting_classes_by_their_shares() {
    let backend = backend();
    // One call in flight at a time: every completion frees exactly one call's room.
    define(&backend, "openai", "gpt-4o", 100_000, 100_000_000, 1).await;
    let scheduler = Scheduler::with_config(backend.clone(), two_classes(4));
    let finished = Arc::new(Mutex::new(Vec::new()));
    // Batch is submitted first, and by more tenants: neither earns it more turns.
    let mut handles = Vec::new();
    for i in 0..600 {
        let tenant = format!("etl_{}", i % 3);
        let job = recorded_job(&finished, format!("batch-{i}"), &tenant, Some("batch"));
        handles.push(scheduler.submit(job).unwrap());
    }
    for i in 0..600 {
        let job = recorded_job(&finished, format!("interactive-{i}"), "web", Some("interactive"));
        handles.push(scheduler.submit(job).unwrap());
    }
    for handle in handles {
        handle.await.unwrap();
    }

    let finished = finished.lock().unwrap().clone();
    assert_eq!(finished.len(), 1_200);
    // While both classes wait, 4 of every 5 grants go to the interactive class.
    let interactive = finished[..500]
        .iter()
        .filter(|id| id.starts_with("interactive-"))
        .count();
    assert!(
        (395..=405).contains(&interactive),
        "interactive got {interactive} of the first 500"
    );
    assert!(in_use(&backend, LimitKey::llm_concurrency("openai", "gpt-4o").unwrap()).await == 0);
}

#[tokio::test(start_paused = true)]
async fn a_class_running_alone_takes_all_the_capacity() {
    let backend = backend();
    define(&backend, "openai", "gpt-4o", 100_000, 100_000_000, 2).await;
    let scheduler = Scheduler::with_config(backend.clone(), two_classes(4));
    let finished = Arc::new(Mutex::new(Vec::new()));
    let start = Instant::now();
    let handles: Vec<_> = (0..100)
        .map(|i| {
            let job = recorded_job(&finished, format!("batch-{i}"), "etl", Some("batch"));
            scheduler.submit(job).unwrap()
        })
        .collect();
    for handle in handles {
        handle.await.unwrap();
    }
    // Two calls of 100 ms in flight at all times: 100 jobs in 5 s, as with no classes.
    let elapsed_ms = (Instant::now() - start).as_millis();
    assert!(
        (5_000..5_200).contains(&elapsed_ms),
        "100 batch jobs alone took {elapsed_ms} ms"
    );
}

#[tokio::test(start_paused = true)]
async fn an_interactive_job_waits_for_one_call_not_for_the_batch_backlog() {
    let backend = backend();
    define(&backend, "openai", "gpt-4o", 100_000, 100_000_000, 1).await;
    let scheduler = Scheduler::with_config(backend.clone(), two_classes(4));
    let finished = Arc::new(Mutex::new(Vec::new()));
    let batch: Vec<_> = (0..200)
        .map(|i| {
            let tenant = format!("etl_{i}");
            let job = recorded_job(&finished, format!("batch-{i}"), &tenant, Some("batch"));
            scheduler.submit(job).unwrap()
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(1_050)).await;
    let submitted = Instant::now();
    let job = recorded_job(&finished, "interactive-0".to_owned(), "web", Some("interactive"));
    scheduler.submit(job).unwrap().await.unwrap();
    // It takes the slot the running batch call frees, then runs its own 100 ms.
    let waited_ms = (Instant::now() - submitted).as_millis();
    assert!(
        waited_ms <= 200,
        "the interactive job finished {waited_ms} ms after submit"
    );
    scheduler.shutdown(std::future::ready(())).await.unwrap();
    drop(batch);
}

#[tokio::test(start_paused = true)]
async fn a_job_naming_no_class_runs_in_the_lowest_and_an_unknown_class_is_refused() {
    let backend = backend();
    define(&backend, "openai", "gpt-4o", 100_000, 100_000_000, 1).await;
    let scheduler = Scheduler::with_config(backend.clone(), two_classes(1));
    let finished = Arc::new(Mutex::new(Vec::new()));
    let mut handles = Vec::new();
    for i in 0..50 {
        let job = recorded_job(&finished, format!("unnamed-{i}"), "etl", None);
        handles.push(scheduler.submit(job).unwrap());
    }
    for i in 0..50 {
        let job = recorded_job(&finished, format!("interactive-{i}"), "web", Some("interactive"));
        handles.push(scheduler.submit(job).unwrap());
    }
    let refused = scheduler
        .submit(recorded_job(&finished, "x".to_owned(), "web", Some("urgent")))
        .unwrap_err();
    assert_eq!(
        refused.kind(),
        &SubmitErrorKind::UnknownClass {
            class: "urgent".to_owned()
        }
    );
    assert_eq!(refused.job_spec().job_id, "x", "the refused job is handed back");
    for handle in handles {
        handle.await.unwrap();
    }
    let finished = finished.lock().unwrap();
    // Unnamed work shares as batch does (1 to 4), not as interactive.
    let unnamed = finished[..50].iter().filter(|id| id.starts_with("unnamed-")).count();
    assert!(unnamed <= 12, "unnamed jobs took {unnamed} of the first 50 grants");
}
