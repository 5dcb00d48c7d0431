//! The client-side scheduler (docs/client-library.md, "The scheduler"): runs LLM jobs as
//! fast as their limits allow without letting a saturated model hold up any other.
//!
//! Jobs wait in one queue per (provider, model). Workers take queues with ready work in
//! turn and, within a queue, tenants in turn, so neither a saturated model nor one
//! tenant's burst holds up the rest. Each attempt reserves under a fresh lease id. A "not
//! now" denial makes the job, and every job sharing the denied key, wait for the retry
//! hint plus jitter; an unknown outcome resends the same lease after the hint
//! (docs/lease-ids.md, "Rules for callers"); a job that can never fit fails at once.
//! After the call, Complete always runs, whether the call succeeded, failed, panicked or
//! was stopped at the shutdown deadline, so the client never leaks concurrency.
//!
//! Time is tokio time: under `tokio::time::pause()` the scheduler, the calls
//! and a memory backend on [`crate::TokioClock`] share one virtual timeline.
//!
//! Decisions of this scheduler, summed up in docs/client-library.md, "The scheduler":
//!
//! - A "not now" denial on a key every job of the queue needs (the model's rpm,
//!   token limits, concurrency) pauses the whole queue until the hint, so one denial costs
//!   one reserve, not one per queued job. A denial on a tenant's budget holds only
//!   the jobs that reserve that budget. When a lease of the queue is completed and
//!   frees the concurrency (or tokens) the queue waits for, the pause ends at once.
//! - Complete reconciles tokens to what execute returned, or to 0 when execute
//!   returned an error. After a panic, or a call stopped at the shutdown deadline,
//!   what the call used is unknown: Complete releases concurrency and leaves the
//!   tokens reserved at the upper bound, so the provider is never over-used.
//! - A reserve or complete call that outlives `call_timeout`, or panics, has an
//!   unknown outcome, as if the limiter were unavailable; the worker lives on.
//! - `job_id` is required: it names jobs in logs and shutdown reports.
//! - Shutdown starts no new call: queued and waiting jobs are answered at once
//!   and listed as not run.

mod board;
mod class;
mod config;
mod config_error;
mod entry;
mod error;
mod handle;
mod job;
mod outcome;
mod queue;
mod report;
mod worker;

use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::{oneshot, watch, Notify};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::limiting::limiter::Limiter;

use board::{Board, QueueId};
use entry::Entry;

pub use class::{ClassTurns, WorkClass, CLASSES_MAX, CLASS_NAME_BYTES_MAX, CLASS_SHARE_MAX, DEFAULT_CLASS};
pub use config::{
    SchedulerConfig, SchedulerConfigBuilder, CALL_TIMEOUT_MS_LIMIT_MAX, COMPLETE_ATTEMPTS_LIMIT_MAX,
    FALLBACK_RETRY_MS_LIMIT_MAX, JITTER_MS_LIMIT_MAX, JOBS_LIMIT_MAX, QUEUES_LIMIT_MAX, UNKNOWN_RETRIES_LIMIT_MAX,
    WORKERS_MAX,
};
pub use config_error::ConfigError;
pub use error::{ShutdownError, SubmitError, SubmitErrorKind};
pub use handle::JobHandle;
pub use job::{ExecuteError, ExecuteFuture, Job, JobSpec};
pub use outcome::{JobDone, JobError, JobResult};
pub use report::ShutdownReport;

/// Runs submitted jobs on a fixed set of workers against any [`Limiter`].
///
/// Must be created inside a tokio runtime: the workers are tokio tasks.
/// Dropping the scheduler without [`shutdown`](Self::shutdown) stops intake,
/// answers every queued job with [`JobError::NotRun`] and lets running calls finish.
pub struct Scheduler {
    shared: Arc<Shared>,
    /// The worker tasks; emptied by the first shutdown.
    workers: Mutex<Vec<JoinHandle<()>>>,
}

/// What the scheduler and its workers share.
pub(crate) struct Shared {
    limiter: Arc<dyn Limiter>,
    config: SchedulerConfig,
    board: Mutex<Board>,
    /// Wakes an idle worker when work becomes ready; wakes all at shutdown.
    work_ready: Notify,
    /// Set at the shutdown deadline: running calls are stopped.
    abort: watch::Sender<bool>,
}

impl Scheduler {
    /// A scheduler with `workers` workers and the default limits.
    ///
    /// # Panics
    ///
    /// If `workers` is 0 or more than [`WORKERS_MAX`], or outside a tokio runtime.
    pub fn new(limiter: Arc<dyn Limiter>, workers: usize) -> Self {
        let config = SchedulerConfig::builder(workers)
            .build()
            .unwrap_or_else(|error| panic!("{error}"));
        Self::with_config(limiter, config)
    }

    /// A scheduler with the given limits.
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime.
    pub fn with_config(limiter: Arc<dyn Limiter>, config: SchedulerConfig) -> Self {
        let (abort, _) = watch::channel(false);
        let shared = Arc::new(Shared {
            limiter,
            board: Mutex::new(Board::new(config.clone())),
            config,
            work_ready: Notify::new(),
            abort,
        });
        let workers = (0..shared.config.workers())
            .map(|_| tokio::spawn(worker::run(Arc::clone(&shared))))
            .collect();
        Self {
            shared,
            workers: Mutex::new(workers),
        }
    }

    /// Queues `job`. The handle resolves to its result. A refused job is handed
    /// back inside the error, untouched.
    pub fn submit(&self, job: Job) -> Result<JobHandle, SubmitError> {
        let rules = (self.shared.config).profile_rules(&job.spec().provider, &job.spec().model);
        let requirements = match Entry::check(job.spec(), rules) {
            Ok(requirements) => requirements,
            Err(kind) => return Err(SubmitError::new(kind, job)),
        };
        let Some(class) = self.shared.config.class_index(job.spec().class.as_deref()) else {
            let class = job.spec().class.clone().unwrap_or_default();
            return Err(SubmitError::new(SubmitErrorKind::UnknownClass { class }, job));
        };
        let mut board = self.shared.board();
        if let Err(kind) = board.check_room(job.spec()) {
            return Err(SubmitError::new(kind, job));
        }
        let (entry, handle) = Entry::new(job, requirements, class);
        let wake = board.admit(entry, Instant::now());
        drop(board);
        if wake {
            self.shared.work_ready.notify_one();
        }
        Ok(handle)
    }

    /// Jobs accepted and not yet answered: queued, waiting or running.
    pub fn jobs(&self) -> usize {
        self.shared.board().jobs()
    }

    /// Stops intake, answers every job that has not started with
    /// [`JobError::NotRun`], and lets running calls finish until `deadline`
    /// resolves. Calls still running then are stopped and answered with
    /// [`JobError::Aborted`]; their leases are completed all the same, which may
    /// take up to the configured Complete retries after the deadline.
    pub async fn shutdown(&self, deadline: impl Future<Output = ()>) -> Result<ShutdownReport, ShutdownError> {
        let workers = std::mem::take(&mut *self.workers.lock().expect("workers lock poisoned"));
        if workers.is_empty() {
            return Err(ShutdownError::AlreadyShutDown);
        }
        let releases = Shared::close(&self.shared);
        let all_stopped = async {
            for worker in workers.into_iter().chain(releases) {
                if let Err(error) = worker.await {
                    tracing::error!(%error, "scheduler worker ended abnormally");
                }
            }
        };
        tokio::pin!(all_stopped, deadline);
        tokio::select! {
            _ = &mut all_stopped => {}
            _ = &mut deadline => {
                self.shared.abort.send_replace(true);
                all_stopped.await;
            }
        }
        Ok(self.shared.board().take_report())
    }
}

impl Drop for Scheduler {
    fn drop(&mut self) {
        let workers = std::mem::take(&mut *self.workers.lock().unwrap_or_else(|poisoned| poisoned.into_inner()));
        if !workers.is_empty() {
            // The workers finish their current job and stop; they hold what they need.
            drop(Shared::close(&self.shared));
        }
    }
}

impl Shared {
    fn board(&self) -> MutexGuard<'_, Board> {
        self.board.lock().expect("scheduler board lock poisoned")
    }

    /// Stops intake and answers every job that has not started. Jobs waiting to
    /// resend a lease of unknown outcome get that lease released, in case it
    /// landed, by the returned tasks (none outside a runtime: the leases then
    /// expire on their own).
    fn close(shared: &Arc<Self>) -> Vec<JoinHandle<()>> {
        let drained = shared.board().close();
        let runtime = tokio::runtime::Handle::try_current().ok();
        let mut releases = Vec::new();
        for (queue, entry) in drained {
            if let (Some(lease_id), Some(runtime)) = (entry.unknown_lease, &runtime) {
                let (shared, spec) = (Arc::clone(shared), entry.spec.clone());
                releases.push(runtime.spawn(async move { worker::release_unknown(&shared, &spec, lease_id).await }));
            }
            shared.answer_not_run(queue, entry);
        }
        shared.work_ready.notify_waiters();
        releases
    }

    /// Answers a job that will not run and notes it for the shutdown report.
    fn answer_not_run(&self, queue: QueueId, entry: Entry) {
        self.board().note_not_run(&entry.spec.job_id);
        self.answer(queue, &entry.spec, entry.responder, Err(JobError::NotRun));
    }

    /// Forgets a job, then answers its handle, so a caller that submits again on
    /// the answer finds the room freed.
    fn answer(&self, queue: QueueId, spec: &JobSpec, responder: oneshot::Sender<JobResult>, result: JobResult) {
        let class = (self.config.class_index(spec.class.as_deref())).expect("the class was checked at submit");
        self.board().retire(queue, &spec.tenant_id, class);
        // The caller may have dropped the handle; the job ran all the same.
        let _ = responder.send(result);
    }
}
