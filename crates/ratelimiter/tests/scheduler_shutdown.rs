//! The scheduler's bounded intake and its end, against scripted and recording
//! limiters in paused tokio time: full limits refuse jobs and hand them back, a
//! shutdown lets running calls finish until its deadline, stops the rest and
//! completes their leases, and reports the jobs it never ran.

mod scheduler_support;

use std::time::Duration;

use ratelimiter::scheduler::{JobError, Scheduler, ShutdownError, SubmitErrorKind};
use scheduler_support::{config, not_now, openai, sleeping_job, spec, unavailable, Recorder, Scripted, TPM};
use tokio::time::Instant;

#[tokio::test(start_paused = true)]
async fn full_limits_refuse_jobs_with_a_clear_error_and_hand_them_back() {
    let limiter = Scripted::new(vec![], vec![]);
    let config = config(1)
        .jobs_max(5)
        .queue_jobs_max(3)
        .tenant_jobs_max(2)
        .queues_max(2)
        .build()
        .unwrap();
    let scheduler = Scheduler::with_config(limiter, config);
    let long = |s| sleeping_job(s, 60_000, 1);
    let mut handles = vec![
        scheduler.submit(long(openai("a1"))).unwrap(),
        scheduler.submit(long(openai("a2"))).unwrap(),
    ];
    let refused = scheduler.submit(long(openai("a3"))).unwrap_err();
    assert!(
        matches!(refused.kind(), SubmitErrorKind::TenantFull { tenant_jobs_max: 2, .. }),
        "{refused}"
    );
    assert_eq!(refused.into_job().spec().job_id, "a3");

    handles.push(
        scheduler
            .submit(long(spec("b1", "tenant_b", "openai", "gpt-4o")))
            .unwrap(),
    );
    let refused = scheduler
        .submit(long(spec("c1", "tenant_c", "openai", "gpt-4o")))
        .unwrap_err();
    assert!(
        matches!(refused.kind(), SubmitErrorKind::QueueFull { queue_jobs_max: 3, .. }),
        "{refused}"
    );

    handles.push(
        scheduler
            .submit(long(spec("x1", "tenant_a", "anthropic", "claude")))
            .unwrap(),
    );
    let refused = scheduler
        .submit(long(spec("y1", "tenant_a", "google", "gemini")))
        .unwrap_err();
    assert_eq!(refused.kind(), &SubmitErrorKind::TooManyQueues { queues_max: 2 });

    handles.push(
        scheduler
            .submit(long(spec("x2", "tenant_a", "anthropic", "claude")))
            .unwrap(),
    );
    let refused = scheduler
        .submit(long(spec("x3", "tenant_b", "anthropic", "claude")))
        .unwrap_err();
    assert_eq!(refused.kind(), &SubmitErrorKind::SchedulerFull { jobs_max: 5 });

    let refused = scheduler
        .submit(long(spec("bad", "tenant_a", "open:ai", "m")))
        .unwrap_err();
    assert!(matches!(refused.kind(), SubmitErrorKind::InvalidJob(_)), "{refused}");
    let refused = scheduler.submit(long(spec("", "tenant_a", "openai", "m"))).unwrap_err();
    assert!(
        matches!(refused.kind(), SubmitErrorKind::InvalidJob(m) if m.contains("job_id")),
        "{refused}"
    );

    // Room comes back when jobs finish.
    for handle in handles {
        handle.await.unwrap();
    }
    assert_eq!(scheduler.jobs(), 0);
    scheduler
        .submit(long(spec("y1", "tenant_a", "google", "gemini")))
        .unwrap()
        .await
        .unwrap();
}

#[tokio::test(start_paused = true)]
async fn shutdown_lets_running_jobs_finish_and_reports_the_unrun_ones() {
    let recorder = Recorder::new(Scripted::new(vec![], vec![]));
    let scheduler = Scheduler::with_config(recorder.clone(), config(1).build().unwrap());
    let handles: Vec<_> = (0..5)
        .map(|i| {
            scheduler
                .submit(sleeping_job(openai(&format!("job-{i}")), 1_000, 7))
                .unwrap()
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(1_500)).await;

    let report = scheduler
        .shutdown(tokio::time::sleep(Duration::from_secs(10)))
        .await
        .unwrap();
    assert_eq!(report.not_run, vec!["job-2", "job-3", "job-4"]);
    assert!(report.aborted.is_empty());
    let mut results = Vec::new();
    for handle in handles {
        results.push(handle.await);
    }
    assert_eq!(results[0].as_ref().unwrap().actual_tokens, 7);
    assert_eq!(
        results[1].as_ref().unwrap().actual_tokens,
        7,
        "the running job finished"
    );
    assert!(results[2..].iter().all(|r| matches!(r, Err(JobError::NotRun))));
    assert_eq!(recorder.reserve_count(), 2, "unrun jobs reserved nothing");

    let refused = scheduler.submit(sleeping_job(openai("late"), 1, 1)).unwrap_err();
    assert_eq!(refused.kind(), &SubmitErrorKind::ShutDown);
    let again = scheduler.shutdown(std::future::ready(())).await;
    assert_eq!(again.unwrap_err(), ShutdownError::AlreadyShutDown);
}

#[tokio::test(start_paused = true)]
async fn shutdown_stops_calls_still_running_at_the_deadline_and_completes_them() {
    let recorder = Recorder::new(Scripted::new(vec![], vec![]));
    let scheduler = Scheduler::with_config(recorder.clone(), config(2).build().unwrap());
    let slow = scheduler.submit(sleeping_job(openai("slow"), 3_600_000, 9)).unwrap();
    let quick = scheduler.submit(sleeping_job(openai("quick"), 500, 9)).unwrap();
    tokio::time::sleep(Duration::from_millis(10)).await;

    let start = Instant::now();
    let report = scheduler
        .shutdown(tokio::time::sleep(Duration::from_secs(2)))
        .await
        .unwrap();
    assert_eq!(Instant::now() - start, Duration::from_secs(2));
    assert_eq!(report.aborted, vec!["slow"]);
    assert!(report.not_run.is_empty());
    assert!(matches!(slow.await, Err(JobError::Aborted)));
    assert_eq!(quick.await.unwrap().actual_tokens, 9);
    let lease = recorder.reserves_of("slow")[0].0;
    assert_eq!(
        recorder.completes_of("slow"),
        vec![(lease, vec![])],
        "concurrency released"
    );
}

#[tokio::test(start_paused = true)]
async fn shutdown_reports_jobs_waiting_after_a_denial() {
    let limiter = Scripted::new(vec![not_now(TPM, 60_000)], vec![]);
    let scheduler = Scheduler::with_config(limiter, config(1).build().unwrap());
    let waiting = scheduler.submit(sleeping_job(openai("waiting"), 10, 1)).unwrap();
    tokio::time::sleep(Duration::from_millis(10)).await;
    let report = scheduler.shutdown(std::future::ready(())).await.unwrap();
    assert_eq!(report.not_run, vec!["waiting"]);
    assert!(matches!(waiting.await, Err(JobError::NotRun)));
    assert_eq!(scheduler.jobs(), 0);
}

#[tokio::test(start_paused = true)]
async fn dropping_the_scheduler_answers_queued_jobs() {
    let limiter = Scripted::new(vec![not_now(TPM, 60_000)], vec![]);
    let scheduler = Scheduler::with_config(limiter, config(1).build().unwrap());
    let waiting = scheduler.submit(sleeping_job(openai("waiting"), 10, 1)).unwrap();
    tokio::time::sleep(Duration::from_millis(10)).await;
    drop(scheduler);
    assert!(matches!(waiting.await, Err(JobError::NotRun)));
}

#[tokio::test(start_paused = true)]
async fn shutdown_releases_a_lease_of_unknown_outcome_that_was_waiting() {
    let limiter = Scripted::new(vec![unavailable(60_000)], vec![]);
    let recorder = Recorder::new(limiter);
    let scheduler = Scheduler::with_config(recorder.clone(), config(1).build().unwrap());
    let waiting = scheduler.submit(sleeping_job(openai("waiting"), 10, 1)).unwrap();
    tokio::time::sleep(Duration::from_millis(10)).await;
    let report = scheduler.shutdown(std::future::ready(())).await.unwrap();
    assert_eq!(report.not_run, vec!["waiting"]);
    assert!(matches!(waiting.await, Err(JobError::NotRun)));
    let lease = recorder.reserves_of("waiting")[0].0;
    assert_eq!(
        recorder.completes_of("waiting"),
        vec![(lease, vec![(TPM.to_owned(), 0)])]
    );
}
