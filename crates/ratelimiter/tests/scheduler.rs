//! Scheduler behaviour against scripted and recording limiters, in paused tokio
//! time: leases per attempt, Complete after every call, failures at once, queues
//! paused and resumed; bounded intake and shutdown are tests/scheduler_shutdown.rs.

mod scheduler_support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ratelimiter::profile::{llm_profile, Published};
use ratelimiter::scheduler::{ExecuteError, Job, JobError, Scheduler, SchedulerConfig};
use ratelimiter::{Denial, LimiterError, ReserveOutcome};
use scheduler_support::{
    allowed, config, key, not_now, openai, sleeping_job, spec, unavailable, Recorder, Scripted, TPM,
};
use tokio::time::Instant;

#[tokio::test(start_paused = true)]
async fn a_job_reserves_runs_and_completes_with_its_actual_tokens() {
    let recorder = Recorder::new(Scripted::new(vec![], vec![]));
    let scheduler = Scheduler::with_config(recorder.clone(), config(2).build().unwrap());
    let mut job_spec = openai("job-1");
    job_spec.want_daily_budget = true;
    let done = scheduler
        .submit(sleeping_job(job_spec, 50, 740))
        .unwrap()
        .await
        .unwrap();

    assert_eq!(
        (done.job_id.as_str(), done.actual_tokens, done.reserve_attempts),
        ("job-1", 740, 1)
    );
    assert_eq!(done.complete_error, None);
    let reserves = recorder.reserves_of("job-1");
    assert_eq!(reserves.len(), 1);
    assert_eq!(reserves[0].0, done.lease_id);
    assert_eq!(
        recorder.completes_of("job-1"),
        vec![(
            done.lease_id,
            vec![
                (TPM.to_owned(), 740),
                ("tenant:tenant_a:llm:daily_tokens".to_owned(), 740)
            ]
        )]
    );
    assert_eq!(scheduler.jobs(), 0);
}

#[tokio::test(start_paused = true)]
async fn every_retry_after_a_denial_uses_a_new_lease_and_waits_for_the_hint() {
    let limiter = Scripted::new(vec![not_now(TPM, 1_000), not_now(TPM, 2_000)], vec![]);
    let recorder = Recorder::new(limiter);
    let scheduler = Scheduler::with_config(recorder.clone(), config(1).build().unwrap());
    let start = Instant::now();
    let done = scheduler
        .submit(sleeping_job(openai("job-1"), 10, 5))
        .unwrap()
        .await
        .unwrap();

    let reserves = recorder.reserves_of("job-1");
    let leases: Vec<_> = reserves.iter().map(|r| r.0).collect();
    let offsets: Vec<_> = reserves.iter().map(|r| (r.1 - start).as_millis()).collect();
    assert_eq!(offsets, vec![0, 1_000, 3_000]);
    assert_ne!(leases[0], leases[1]);
    assert_ne!(leases[1], leases[2]);
    assert_ne!(leases[0], leases[2]);
    assert_eq!(done.lease_id, leases[2]);
    assert_eq!(done.reserve_attempts, 3);
    assert_eq!(recorder.completes_of("job-1").len(), 1);
    assert_eq!(recorder.completes_of("job-1")[0].0, leases[2]);
}

#[tokio::test(start_paused = true)]
async fn jitter_is_added_to_the_hint_and_stays_within_its_bound() {
    let limiter = Scripted::new(vec![not_now(TPM, 1_000); 20], vec![]);
    let recorder = Recorder::new(limiter);
    let config = SchedulerConfig::builder(1)
        .jitter_ms_max(100)
        .jitter_seed(1)
        .build()
        .unwrap();
    let scheduler = Scheduler::with_config(recorder.clone(), config);
    scheduler
        .submit(sleeping_job(openai("job-1"), 10, 5))
        .unwrap()
        .await
        .unwrap();

    let times: Vec<_> = recorder.reserves_of("job-1").iter().map(|r| r.1).collect();
    let gaps: Vec<u128> = times.windows(2).map(|w| (w[1] - w[0]).as_millis()).collect();
    assert_eq!(gaps.len(), 20);
    assert!(gaps.iter().all(|gap| (1_000..=1_100).contains(gap)), "{gaps:?}");
    assert!(gaps.iter().any(|gap| *gap != gaps[0]), "jitter varies: {gaps:?}");
}

#[tokio::test(start_paused = true)]
async fn an_unknown_outcome_is_retried_with_the_same_lease_after_the_hint() {
    let limiter = Scripted::new(vec![unavailable(500), Err(LimiterError::Backend("x".into()))], vec![]);
    let recorder = Recorder::new(limiter);
    let config = config(1).fallback_retry_ms(300).build().unwrap();
    let scheduler = Scheduler::with_config(recorder.clone(), config);
    let start = Instant::now();
    let done = scheduler
        .submit(sleeping_job(openai("job-1"), 10, 5))
        .unwrap()
        .await
        .unwrap();

    let reserves = recorder.reserves_of("job-1");
    let offsets: Vec<_> = reserves.iter().map(|r| (r.1 - start).as_millis()).collect();
    assert_eq!(offsets, vec![0, 500, 800]);
    assert!(
        reserves.iter().all(|r| r.0 == done.lease_id),
        "one lease for every unknown outcome"
    );
}

#[tokio::test(start_paused = true)]
async fn lease_already_failed_gets_a_new_lease_at_once() {
    let limiter = Scripted::new(
        vec![unavailable(500), Ok(ReserveOutcome::Denied(Denial::LeaseAlreadyFailed))],
        vec![],
    );
    let recorder = Recorder::new(limiter);
    let scheduler = Scheduler::with_config(recorder.clone(), config(1).build().unwrap());
    let start = Instant::now();
    let done = scheduler
        .submit(sleeping_job(openai("job-1"), 10, 5))
        .unwrap()
        .await
        .unwrap();

    let reserves = recorder.reserves_of("job-1");
    let offsets: Vec<_> = reserves.iter().map(|r| (r.1 - start).as_millis()).collect();
    assert_eq!(offsets, vec![0, 500, 500]);
    assert_eq!(reserves[0].0, reserves[1].0);
    assert_ne!(reserves[1].0, reserves[2].0);
    assert_eq!(done.lease_id, reserves[2].0);
}

#[tokio::test(start_paused = true)]
async fn unknown_outcomes_are_retried_a_bounded_number_of_times_then_released() {
    let limiter = Scripted::new(vec![unavailable(100); 10], vec![]);
    let recorder = Recorder::new(limiter);
    let config = config(1).unknown_retries_max(2).build().unwrap();
    let scheduler = Scheduler::with_config(recorder.clone(), config);
    let result = scheduler.submit(sleeping_job(openai("job-1"), 10, 5)).unwrap().await;

    assert!(
        matches!(result, Err(JobError::Limiter(LimiterError::Unavailable { .. }))),
        "{result:?}"
    );
    let reserves = recorder.reserves_of("job-1");
    assert_eq!(reserves.len(), 3);
    assert!(reserves.iter().all(|r| r.0 == reserves[0].0));
    // The lease may have landed: it is released with 0 tokens.
    assert_eq!(
        recorder.completes_of("job-1"),
        vec![(reserves[0].0, vec![(TPM.to_owned(), 0)])]
    );
    assert_eq!(scheduler.jobs(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_job_that_can_never_fit_fails_at_once() {
    let limiter = Scripted::new(
        vec![Ok(ReserveOutcome::Denied(Denial::ExceedsCapacity { key: key(TPM) }))],
        vec![],
    );
    let recorder = Recorder::new(limiter);
    let scheduler = Scheduler::with_config(recorder.clone(), config(1).build().unwrap());
    let ran = Arc::new(AtomicUsize::new(0));
    let ran_in_job = ran.clone();
    let job = Job::new(openai("huge"), move || async move {
        ran_in_job.fetch_add(1, Ordering::SeqCst);
        Ok::<u64, ExecuteError>(1)
    });
    let start = Instant::now();
    let result = scheduler.submit(job).unwrap().await;

    assert!(
        matches!(&result, Err(JobError::ExceedsCapacity { key: k }) if k.as_str() == TPM),
        "{result:?}"
    );
    assert_eq!(Instant::now(), start, "no waiting");
    assert_eq!(recorder.reserves_of("huge").len(), 1);
    assert!(recorder.completes_of("huge").is_empty(), "nothing was reserved");
    assert_eq!(ran.load(Ordering::SeqCst), 0);
}

#[tokio::test(start_paused = true)]
async fn an_unknown_key_fails_at_once() {
    let limiter = Scripted::new(vec![Err(LimiterError::UnknownKey(key(TPM)))], vec![]);
    let scheduler = Scheduler::with_config(limiter, config(1).build().unwrap());
    let start = Instant::now();
    let result = scheduler.submit(sleeping_job(openai("job-1"), 10, 5)).unwrap().await;
    assert!(
        matches!(result, Err(JobError::Limiter(LimiterError::UnknownKey(_)))),
        "{result:?}"
    );
    assert_eq!(Instant::now(), start);
}

#[tokio::test(start_paused = true)]
async fn complete_runs_with_zero_tokens_after_a_failing_execute() {
    let recorder = Recorder::new(Scripted::new(vec![], vec![]));
    let scheduler = Scheduler::with_config(recorder.clone(), config(1).build().unwrap());
    let job = Job::new(openai("fails"), || async {
        Err::<u64, ExecuteError>("provider said 500".into())
    });
    let result = scheduler.submit(job).unwrap().await;

    assert!(
        matches!(&result, Err(JobError::Execute(e)) if e.to_string() == "provider said 500"),
        "{result:?}"
    );
    let lease = recorder.reserves_of("fails")[0].0;
    assert_eq!(recorder.completes_of("fails"), vec![(lease, vec![(TPM.to_owned(), 0)])]);
}

#[tokio::test(start_paused = true)]
async fn complete_runs_after_a_panicking_execute_and_keeps_the_upper_bound() {
    let recorder = Recorder::new(Scripted::new(vec![], vec![]));
    let scheduler = Scheduler::with_config(recorder.clone(), config(1).build().unwrap());
    let job = Job::new(openai("panics"), || async {
        tokio::time::sleep(Duration::from_millis(5)).await;
        panic!("bug in the caller's code");
        #[allow(unreachable_code)]
        Ok::<u64, ExecuteError>(1)
    });
    let result = scheduler.submit(job).unwrap().await;

    assert!(matches!(result, Err(JobError::Panicked)), "{result:?}");
    let lease = recorder.reserves_of("panics")[0].0;
    assert_eq!(recorder.completes_of("panics"), vec![(lease, vec![])]);
    // The worker survived: the next job runs.
    let done = scheduler
        .submit(sleeping_job(openai("next"), 1, 3))
        .unwrap()
        .await
        .unwrap();
    assert_eq!(done.actual_tokens, 3);
}

#[tokio::test(start_paused = true)]
async fn complete_is_retried_when_the_limiter_is_unavailable() {
    let unavailable = || Err(LimiterError::Unavailable { retry_after_ms: 200 });
    let limiter = Scripted::new(vec![], vec![unavailable(), unavailable()]);
    let recorder = Recorder::new(limiter);
    let scheduler = Scheduler::with_config(recorder.clone(), config(1).build().unwrap());
    let done = scheduler
        .submit(sleeping_job(openai("job-1"), 10, 5))
        .unwrap()
        .await
        .unwrap();
    assert_eq!(done.complete_error, None);
    let completes = recorder.completes_of("job-1");
    assert_eq!(completes.len(), 3);
    assert!(completes.iter().all(|c| c.0 == done.lease_id));

    let limiter = Scripted::new(vec![], vec![unavailable(); 10]);
    let recorder = Recorder::new(limiter);
    let scheduler = Scheduler::with_config(recorder.clone(), config(1).complete_attempts_max(4).build().unwrap());
    let done = scheduler
        .submit(sleeping_job(openai("job-2"), 10, 5))
        .unwrap()
        .await
        .unwrap();
    assert_eq!(
        done.complete_error,
        Some(LimiterError::Unavailable { retry_after_ms: 200 })
    );
    assert_eq!(recorder.completes_of("job-2").len(), 4);
}

#[tokio::test(start_paused = true)]
async fn a_denial_on_a_shared_key_pauses_the_whole_queue() {
    let limiter = Scripted::new(vec![not_now(TPM, 1_000)], vec![]);
    let recorder = Recorder::new(limiter);
    let scheduler = Scheduler::with_config(recorder.clone(), config(4).build().unwrap());
    let start = Instant::now();
    let handles: Vec<_> = (0..5)
        .map(|i| {
            scheduler
                .submit(sleeping_job(openai(&format!("job-{i}")), 10, 5))
                .unwrap()
        })
        .collect();
    for handle in handles {
        handle.await.unwrap();
    }
    let offsets: Vec<u128> = recorder
        .calls()
        .iter()
        .filter_map(|c| match c {
            scheduler_support::Call::Reserve { at, .. } => Some((*at - start).as_millis()),
            _ => None,
        })
        .collect();
    // The first reserve was denied: nobody else in the queue asked before the hint.
    assert_eq!(offsets[0], 0);
    assert!(offsets[1..].iter().all(|t| *t >= 1_000), "{offsets:?}");
    assert_eq!(offsets.len(), 6);
}

#[tokio::test(start_paused = true)]
async fn a_denial_on_a_tenant_budget_holds_only_that_tenants_budget_jobs() {
    let budget_a = "tenant:tenant_a:llm:daily_tokens";
    let denied_until = Instant::now() + Duration::from_secs(3_600);
    let limiter = Scripted::with(move |request| {
        let needs_budget_a = request.requirements().iter().any(|r| r.key.as_str() == budget_a);
        (needs_budget_a && Instant::now() < denied_until).then(|| not_now(budget_a, 3_600_000))
    });
    let recorder = Recorder::new(limiter);
    let scheduler = Scheduler::with_config(recorder.clone(), config(2).build().unwrap());
    let start = Instant::now();
    let with_budget = |job_id: &str, tenant: &str| {
        let mut s = spec(job_id, tenant, "openai", "gpt-4o");
        s.want_daily_budget = true;
        s
    };
    let a1 = scheduler
        .submit(sleeping_job(with_budget("a1", "tenant_a"), 10, 5))
        .unwrap();
    let a2 = scheduler
        .submit(sleeping_job(with_budget("a2", "tenant_a"), 10, 5))
        .unwrap();
    let a_free = scheduler.submit(sleeping_job(openai("a-free"), 10, 5)).unwrap();
    let b1 = scheduler
        .submit(sleeping_job(with_budget("b1", "tenant_b"), 10, 5))
        .unwrap();

    b1.await.unwrap();
    a_free.await.unwrap();
    assert!(
        Instant::now() - start < Duration::from_secs(1),
        "other work was not held up"
    );
    a1.await.unwrap();
    a2.await.unwrap();
    assert!(Instant::now() >= denied_until);
    // a2 was never asked for while the gate was up: one denial taught the queue.
    let denied: Vec<_> = recorder.reserves_of("a2").into_iter().filter(|r| !r.2).collect();
    assert!(denied.len() <= 1, "{denied:?}");
}

#[tokio::test(start_paused = true)]
async fn a_reserve_that_hangs_counts_as_unknown_and_is_resent() {
    struct Hangs {
        calls: AtomicUsize,
    }
    #[async_trait::async_trait]
    impl ratelimiter::Limiter for Hangs {
        async fn reserve(&self, _: &ratelimiter::ReserveRequest) -> Result<ReserveOutcome, LimiterError> {
            if self.calls.fetch_add(1, Ordering::SeqCst) == 0 {
                std::future::pending::<()>().await;
            }
            allowed()
        }
        async fn complete(&self, _: &ratelimiter::CompleteRequest) -> Result<(), LimiterError> {
            Ok(())
        }
    }
    let recorder = Recorder::new(Arc::new(Hangs {
        calls: AtomicUsize::new(0),
    }));
    let config = config(1).call_timeout_ms(1_000).fallback_retry_ms(100).build().unwrap();
    let scheduler = Scheduler::with_config(recorder.clone(), config);
    let start = Instant::now();
    let done = scheduler
        .submit(sleeping_job(openai("job-1"), 10, 1))
        .unwrap()
        .await
        .unwrap();
    // The timed-out call never returned, so the recorder saw only the resend.
    let reserves = recorder.reserves_of("job-1");
    assert_eq!(reserves.len(), 1);
    assert_eq!(reserves[0].0, done.lease_id);
    assert_eq!((reserves[0].1 - start).as_millis(), 1_100);
}

#[tokio::test(start_paused = true)]
async fn a_limiter_that_panics_costs_neither_the_job_nor_the_worker() {
    /// Panics on its first reserve and its first complete, then answers normally;
    /// records every reserve's lease id, the panicking one included.
    struct PanicsOnce {
        reserved: std::sync::Mutex<Vec<ratelimiter::LeaseId>>,
        completes: AtomicUsize,
    }
    #[async_trait::async_trait]
    impl ratelimiter::Limiter for PanicsOnce {
        async fn reserve(&self, request: &ratelimiter::ReserveRequest) -> Result<ReserveOutcome, LimiterError> {
            let calls = {
                let mut reserved = self.reserved.lock().unwrap();
                reserved.push(request.lease_id());
                reserved.len()
            };
            assert!(calls > 1, "first reserve panics");
            allowed()
        }
        async fn complete(&self, _: &ratelimiter::CompleteRequest) -> Result<(), LimiterError> {
            assert!(
                self.completes.fetch_add(1, Ordering::SeqCst) > 0,
                "first complete panics"
            );
            Ok(())
        }
    }
    let limiter = Arc::new(PanicsOnce {
        reserved: std::sync::Mutex::new(Vec::new()),
        completes: AtomicUsize::new(0),
    });
    // One worker: had the panic killed it, job 2 would never run.
    let config = config(1).fallback_retry_ms(100).build().unwrap();
    let scheduler = Scheduler::with_config(limiter.clone(), config);
    let job1 = scheduler.submit(sleeping_job(openai("job-1"), 10, 5)).unwrap();
    let job2 = scheduler.submit(sleeping_job(openai("job-2"), 10, 5)).unwrap();
    let done1 = job1.await.unwrap();
    let done2 = job2.await.unwrap();

    // The panicked reserve's outcome is unknown: the same lease is resent.
    let reserved = limiter.reserved.lock().unwrap().clone();
    assert_eq!(reserved, vec![done1.lease_id, done1.lease_id, done2.lease_id]);
    // The panicked complete was retried and went through.
    assert!(done1.complete_error.is_none(), "{:?}", done1.complete_error);
    assert!(done2.complete_error.is_none(), "{:?}", done2.complete_error);
    assert_eq!(limiter.completes.load(Ordering::SeqCst), 3);
}

/// Job 1 runs for 100 ms; job 2 is denied on `denied_key` with a 10 s hint while
/// job 1 runs. Returns when job 2 was reserved again, in ms from the start.
async fn retry_time_after_own_complete(denied_key: &str, job1_tokens: u64) -> u128 {
    retry_time_after_own_complete_of(openai, config(2).build().unwrap(), denied_key, job1_tokens).await
}

/// [`retry_time_after_own_complete`] for the jobs `job` makes, under `config`.
async fn retry_time_after_own_complete_of(
    job: fn(&str) -> ratelimiter::scheduler::JobSpec,
    config: SchedulerConfig,
    denied_key: &str,
    job1_tokens: u64,
) -> u128 {
    let limiter = Scripted::new(vec![allowed(), not_now(denied_key, 10_000)], vec![]);
    let recorder = Recorder::new(limiter);
    let scheduler = Scheduler::with_config(recorder.clone(), config);
    let start = Instant::now();
    let job1 = scheduler.submit(sleeping_job(job("job-1"), 100, job1_tokens)).unwrap();
    let job2 = scheduler.submit(sleeping_job(job("job-2"), 100, 5)).unwrap();
    job1.await.unwrap();
    job2.await.unwrap();
    let reserves = recorder.reserves_of("job-2");
    assert_eq!(reserves.len(), 2);
    (reserves[1].1 - start).as_millis()
}

#[tokio::test(start_paused = true)]
async fn completing_a_lease_resumes_a_queue_waiting_for_what_it_freed() {
    // The 100-token reservation of job 1 is reconciled to 5: tokens and its slot come back.
    assert_eq!(
        retry_time_after_own_complete("global:llm:openai:gpt-4o:concurrency", 5).await,
        100
    );
    assert_eq!(retry_time_after_own_complete(TPM, 5).await, 100);
    // Nothing frees requests per minute, or tokens when all were used: the hint holds.
    assert_eq!(
        retry_time_after_own_complete("global:llm:openai:gpt-4o:rpm", 5).await,
        10_000
    );
    assert_eq!(retry_time_after_own_complete(TPM, 100).await, 10_000);
}

#[tokio::test(start_paused = true)]
async fn completing_a_lease_resumes_a_queue_waiting_on_its_profiles_token_keys() {
    // Anthropic's profile reserves input (`itpm`) and output (`otpm`) tokens instead of
    // `tpm`: a queue waiting on either is woken when job 1 reconciles its 90-token
    // output reservation down, as it is on `tpm` without a profile.
    let published = Published {
        rpm: Some(50),
        input_tpm: Some(30_000),
        output_tpm: Some(8_000),
        ..Published::default()
    };
    let rules = llm_profile("anthropic", "claude", &published).unwrap().rules;
    let anthropic = |job_id: &str| spec(job_id, "tenant_a", "anthropic", "claude");
    for dimension in ["itpm", "otpm"] {
        let config = config(2).profile(rules.clone()).build().unwrap();
        let denied_key = format!("global:llm:anthropic:claude:{dimension}");
        assert_eq!(
            retry_time_after_own_complete_of(anthropic, config, &denied_key, 5).await,
            100,
            "{dimension}"
        );
    }
    // Requests per minute are still not freed by a Complete.
    let config = config(2).profile(rules).build().unwrap();
    assert_eq!(
        retry_time_after_own_complete_of(anthropic, config, "global:llm:anthropic:claude:rpm", 5).await,
        10_000
    );
}

/// A limiter whose reserves take 1 ms to answer (decided on arrival), as over
/// a network: workers woken together then all have a reserve in flight.
struct Slow(Arc<Scripted>);

#[async_trait::async_trait]
impl ratelimiter::Limiter for Slow {
    async fn reserve(&self, request: &ratelimiter::ReserveRequest) -> Result<ReserveOutcome, LimiterError> {
        let answer = self.0.reserve(request).await;
        tokio::time::sleep(Duration::from_millis(1)).await;
        answer
    }
    async fn complete(&self, request: &ratelimiter::CompleteRequest) -> Result<(), LimiterError> {
        self.0.complete(request).await
    }
}

/// Job 1 runs for 100 ms and gives tokens back; every other reserve before
/// then is denied on the tpm key with a 10 s hint, and when `probe_denied` so is
/// every one before 10 s. Returns the reserve times of jobs 2 to 4 from job 1's
/// completion on, in ms from the start, sorted.
async fn reserves_after_a_completion(probe_denied: bool) -> Vec<u128> {
    let start = Instant::now();
    let denied_until_ms = if probe_denied { 10_000 } else { 100 };
    let limiter = Scripted::with(move |request| {
        let denied = request.job_id() != Some("job-1") && start.elapsed().as_millis() < denied_until_ms;
        denied.then(|| not_now(TPM, 10_000))
    });
    let recorder = Recorder::new(Arc::new(Slow(limiter)));
    let scheduler = Scheduler::with_config(recorder.clone(), config(4).build().unwrap());
    let job1 = scheduler.submit(sleeping_job(openai("job-1"), 100, 5)).unwrap();
    tokio::time::sleep(Duration::from_millis(1)).await;
    let others: Vec<_> = (2..=4)
        .map(|i| {
            scheduler
                .submit(sleeping_job(openai(&format!("job-{i}")), 100, 5))
                .unwrap()
        })
        .collect();
    job1.await.unwrap();
    for handle in others {
        handle.await.unwrap();
    }
    let mut times: Vec<u128> = (2..=4)
        .flat_map(|i| recorder.reserves_of(&format!("job-{i}")))
        .map(|r| (r.1 - start).as_millis())
        .filter(|ms| *ms >= 100)
        .collect();
    times.sort_unstable();
    times
}

#[tokio::test(start_paused = true)]
async fn a_completion_lets_one_probe_through_a_pause_and_each_grant_the_next() {
    // Granted probes follow one another, one reserve's time apart (1 ms here).
    assert_eq!(reserves_after_a_completion(false).await, vec![101, 102, 103]);
    // A denied probe: the other jobs wait for the hint instead of all being denied too.
    assert_eq!(
        reserves_after_a_completion(true).await,
        vec![101, 10_102, 10_102, 10_102]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn many_jobs_on_many_threads_all_finish_and_leave_nothing_behind() {
    // Deny about a third of the attempts with a 1 ms hint, chosen by lease id bits.
    let limiter = Scripted::with(|request| (request.lease_id().to_u128() % 3 == 0).then(|| not_now(TPM, 1)));
    let recorder = Recorder::new(limiter);
    let config = SchedulerConfig::builder(16).jitter_ms_max(2).build().unwrap();
    let scheduler = Scheduler::with_config(recorder.clone(), config);
    let handles: Vec<_> = (0..5_000)
        .map(|i| {
            let tenant = format!("tenant_{}", i % 7);
            let model = format!("m{}", i % 5);
            let job = Job::new(spec(&format!("job-{i}"), &tenant, "openai", &model), || async {
                tokio::task::yield_now().await;
                Ok::<u64, ExecuteError>(1)
            });
            scheduler.submit(job).unwrap()
        })
        .collect();
    for handle in handles {
        assert_eq!(handle.await.unwrap().actual_tokens, 1);
    }
    assert_eq!(scheduler.jobs(), 0);
    let completes = recorder
        .calls()
        .iter()
        .filter(|c| matches!(c, scheduler_support::Call::Complete { .. }))
        .count();
    assert_eq!(completes, 5_000, "one complete per call");
    let report = scheduler.shutdown(std::future::ready(())).await.unwrap();
    assert_eq!(report, Default::default());
}

#[test]
fn the_scheduler_can_be_shared_across_tasks() {
    fn shareable<T: Send + Sync + 'static>() {}
    fn sendable<T: Send + 'static>() {}
    shareable::<Scheduler>();
    sendable::<Job>();
    sendable::<ratelimiter::scheduler::JobHandle>();
    shareable::<ratelimiter::scheduler::SubmitError>();
}
