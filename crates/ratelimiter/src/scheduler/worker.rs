//! A worker: takes the next job in turn, reserves, runs the call, completes.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use crate::base::id::LeaseId;
use crate::model::error::LimiterError;
use crate::model::key::LimitKey;
use crate::model::wire::{Denial, ReserveOutcome};

use super::board::Taken;
use super::entry::{complete_request, Entry};
use super::job::JobSpec;
use super::outcome::{JobDone, JobError};
use super::Shared;

/// Fresh lease ids tried in a row after `lease_already_failed`. That answer means
/// an earlier attempt with the lease was denied, so one fresh id settles it; a
/// limiter that keeps answering it for fresh ids is broken.
const LEASE_ALREADY_FAILED_RETRIES_MAX: u32 = 3;

/// The longest wait between two Complete attempts, in ms: the worker is held
/// while it waits, and a lease not released by then is left to its timeout.
const COMPLETE_RETRY_WAIT_MS_MAX: u64 = 5_000;

/// What one reserve step decided.
enum Reserved {
    /// Granted under this lease.
    Granted(LeaseId),
    /// Denied for now on `key`; try a new lease after the hint.
    NotNow { key: LimitKey, retry_after_ms: u64 },
    /// The outcome is unknown; resend the same lease after the hint.
    Unknown { lease_id: LeaseId, retry_after_ms: u64 },
    /// The job cannot run.
    Failed(JobError),
}

/// Runs jobs until the scheduler closes and no job is left to start.
pub(super) async fn run(shared: Arc<Shared>) {
    let mut abort = shared.abort.subscribe();
    while let Some(taken) = next_task(&shared).await {
        attempt(&shared, taken, &mut abort).await;
    }
}

/// Waits for a job to attempt: woken by a submit, by a fellow worker that saw
/// more ready work, or when the earliest wait ends. `None` once closed.
async fn next_task(shared: &Shared) -> Option<Taken> {
    loop {
        let notified = shared.work_ready.notified();
        tokio::pin!(notified);
        // Registered before looking, so a notification sent after the look is not lost.
        notified.as_mut().enable();
        let wake_at = {
            let mut board = shared.board();
            if let Some(taken) = board.take(Instant::now()) {
                let more = board.has_ready();
                drop(board);
                if more {
                    shared.work_ready.notify_one();
                }
                return Some(taken);
            }
            if board.is_closed() {
                return None;
            }
            board.next_wake()
        };
        match wake_at {
            Some(at) => {
                tokio::select! {
                    _ = &mut notified => {}
                    _ = tokio::time::sleep_until(at) => {}
                }
            }
            None => notified.await,
        }
    }
}

/// One attempt at a job: reserve, then run it, put it back to wait, or fail it.
async fn attempt(shared: &Shared, mut taken: Taken, abort: &mut watch::Receiver<bool>) {
    match reserve(shared, &mut taken.entry).await {
        Reserved::Granted(lease_id) => {
            if shared.board().granted(taken.queue, taken.entry.seq, Instant::now()) {
                shared.work_ready.notify_one();
            }
            run_call(shared, taken, lease_id, abort).await
        }
        Reserved::NotNow { key, retry_after_ms } => {
            tracing::debug!(job_id = %taken.entry.spec.job_id, %key, retry_after_ms, "reserve denied for now");
            let queue = taken.queue;
            let refused = {
                let mut board = shared.board();
                let until = board.retry_time(Instant::now(), retry_after_ms);
                board.deny(taken, &key, until)
            };
            if let Some(entry) = refused {
                shared.answer_not_run(queue, entry);
            }
        }
        Reserved::Unknown {
            lease_id,
            retry_after_ms,
        } => {
            tracing::debug!(job_id = %taken.entry.spec.job_id, %lease_id, retry_after_ms, "reserve outcome unknown");
            taken.entry.unknown_lease = Some(lease_id);
            let queue = taken.queue;
            let refused = {
                let mut board = shared.board();
                let until = board.retry_time(Instant::now(), retry_after_ms);
                board.defer(taken, until)
            };
            if let Some(entry) = refused {
                // Shut down before the lease's outcome was learnt: release it in case it landed.
                release_unknown(shared, &entry.spec, lease_id).await;
                shared.answer_not_run(queue, entry);
            }
        }
        Reserved::Failed(error) => {
            tracing::debug!(job_id = %taken.entry.spec.job_id, %error, "job failed before running");
            shared.answer(taken.queue, &taken.entry.spec, taken.entry.responder, Err(error));
        }
    }
}

/// Reserves for `entry`: a fresh lease per attempt, or the lease whose outcome
/// is unknown, resent unchanged.
async fn reserve(shared: &Shared, entry: &mut Entry) -> Reserved {
    for _ in 0..=LEASE_ALREADY_FAILED_RETRIES_MAX {
        let lease_id = entry.unknown_lease.take().unwrap_or_else(LeaseId::generate);
        entry.reserve_attempts += 1;
        let request = entry.reserve_request(lease_id);
        let result = limiter_call(shared, "reserve", shared.limiter.reserve(&request)).await;
        let retry_after_ms = match result {
            Ok(outcome) => {
                entry.unknown_retries = 0;
                match outcome {
                    ReserveOutcome::Allowed { .. } => return Reserved::Granted(lease_id),
                    ReserveOutcome::Denied(denial) => match denial {
                        Denial::LeaseAlreadyFailed => continue,
                        Denial::ExceedsCapacity { key } => return Reserved::Failed(JobError::ExceedsCapacity { key }),
                        Denial::InsufficientCapacity { key, retry_after_ms }
                        | Denial::LimitDecreasing { key, retry_after_ms } => {
                            return Reserved::NotNow { key, retry_after_ms }
                        }
                    },
                }
            }
            // Refused for want of room in the lease table: nothing reserved, the
            // same lease id is tried again after the hint.
            Err(LimiterError::Unavailable { retry_after_ms } | LimiterError::TooManyLeases { retry_after_ms, .. })
                if retry_after_ms > 0 =>
            {
                retry_after_ms
            }
            Err(LimiterError::Unavailable { .. } | LimiterError::Backend(_)) => shared.config.fallback_retry_ms(),
            Err(error) => return Reserved::Failed(JobError::Limiter(error)),
        };
        if entry.unknown_retries >= shared.config.unknown_retries_max() {
            release_unknown(shared, &entry.spec, lease_id).await;
            return Reserved::Failed(JobError::Limiter(LimiterError::Unavailable { retry_after_ms }));
        }
        entry.unknown_retries += 1;
        return Reserved::Unknown {
            lease_id,
            retry_after_ms,
        };
    }
    Reserved::Failed(JobError::Limiter(LimiterError::Backend(format!(
        "lease_already_failed for {} fresh lease ids in a row",
        LEASE_ALREADY_FAILED_RETRIES_MAX + 1
    ))))
}

/// Releases a lease whose reserve outcome is unknown and whose job will not run
/// under it: one Complete with 0 tokens, which is a no-op if the reserve never
/// landed. If it fails, the reservation expires on its own.
pub(super) async fn release_unknown(shared: &Shared, spec: &JobSpec, lease_id: LeaseId) {
    let rules = shared.config.profile_rules(&spec.provider, &spec.model);
    let request = complete_request(spec, rules, lease_id, Some(0));
    if let Err(error) = limiter_call(shared, "complete", shared.limiter.complete(&request)).await {
        tracing::warn!(job_id = %spec.job_id, %lease_id, %error, "release of an unknown lease failed");
    }
}

/// Runs a granted job's call, then completes its lease whatever happened, so
/// the client never leaks concurrency.
async fn run_call(shared: &Shared, taken: Taken, lease_id: LeaseId, abort: &mut watch::Receiver<bool>) {
    let Taken { queue, entry } = taken;
    if *abort.borrow() {
        // The deadline passed while the reserve was in flight: the call never starts.
        let _ = complete(shared, &entry.spec, lease_id, Some(0)).await;
        shared.answer_not_run(queue, entry);
        return;
    }
    let Entry {
        spec,
        execute,
        responder,
        reserve_attempts,
        ..
    } = entry;
    let mut call = tokio::spawn(execute());
    let joined = tokio::select! {
        joined = &mut call => joined,
        _ = wait_for_abort(abort) => {
            call.abort();
            call.await
        }
    };
    let (actual_tokens, ran) = match joined {
        Ok(Ok(tokens)) => (Some(tokens), Ok(tokens)),
        Ok(Err(error)) => (Some(0), Err(JobError::Execute(error))),
        Err(join_error) if join_error.is_panic() => (None, Err(JobError::Panicked)),
        Err(_cancelled) => (None, Err(JobError::Aborted)),
    };
    let complete_error = complete(shared, &spec, lease_id, actual_tokens).await.err();
    if complete_error.is_none() {
        let reserved_tokens = spec.llm_call().token_upper_bound();
        let tokens_returned = actual_tokens.is_some_and(|tokens| tokens < reserved_tokens);
        if shared.board().lease_completed(queue, tokens_returned, Instant::now()) {
            shared.work_ready.notify_one();
        }
    }
    if matches!(ran, Err(JobError::Aborted)) {
        shared.board().note_aborted(&spec.job_id);
    }
    let result = ran.map(|actual_tokens| JobDone {
        job_id: spec.job_id.clone(),
        lease_id,
        actual_tokens,
        reserve_attempts,
        complete_error,
    });
    shared.answer(queue, &spec, responder, result);
}

/// Resolves once shutdown's deadline passed; never if the scheduler is gone.
async fn wait_for_abort(abort: &mut watch::Receiver<bool>) {
    if abort.wait_for(|aborted| *aborted).await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// Completes `lease_id`, reconciling its token limits to `actual_tokens` (or
/// leaving them at the upper bound when `None`), retrying failures that may pass.
async fn complete(
    shared: &Shared,
    spec: &JobSpec,
    lease_id: LeaseId,
    actual_tokens: Option<u64>,
) -> Result<(), LimiterError> {
    let rules = shared.config.profile_rules(&spec.provider, &spec.model);
    let request = complete_request(spec, rules, lease_id, actual_tokens);
    let attempts_max = shared.config.complete_attempts_max();
    let mut attempt = 1;
    loop {
        let error = match limiter_call(shared, "complete", shared.limiter.complete(&request)).await {
            Ok(()) => return Ok(()),
            Err(error) => error,
        };
        let wait_ms = match &error {
            LimiterError::Unavailable { retry_after_ms } if *retry_after_ms > 0 => *retry_after_ms,
            LimiterError::Unavailable { .. } | LimiterError::Backend(_) => shared.config.fallback_retry_ms(),
            _ => {
                tracing::error!(job_id = %spec.job_id, %lease_id, %error, "complete refused; the lease is left to its timeout");
                return Err(error);
            }
        };
        if attempt >= attempts_max {
            tracing::error!(job_id = %spec.job_id, %lease_id, %error, attempt, "complete failed; the lease is left to its timeout");
            return Err(error);
        }
        tracing::warn!(job_id = %spec.job_id, %lease_id, %error, attempt, "complete failed; retrying");
        tokio::time::sleep(Duration::from_millis(wait_ms.min(COMPLETE_RETRY_WAIT_MS_MAX))).await;
        attempt += 1;
    }
}

/// Runs one limiter call bounded by `call_timeout`. A call that outlives it, or
/// panics, has an unknown outcome: the worker treats it as an unavailable
/// limiter (resend the same lease, retry the Complete) instead of dying with
/// the job, which would lose the job and one worker for good.
async fn limiter_call<T, F>(shared: &Shared, what: &str, call: F) -> Result<T, LimiterError>
where
    F: Future<Output = Result<T, LimiterError>> + Unpin,
{
    let unknown = LimiterError::Unavailable {
        retry_after_ms: shared.config.fallback_retry_ms(),
    };
    match tokio::time::timeout(shared.config.call_timeout(), CatchUnwind(call)).await {
        Ok(Ok(result)) => result,
        Ok(Err(_panic)) => {
            tracing::error!(call = what, "the limiter panicked; the outcome is treated as unknown");
            Err(unknown)
        }
        Err(_elapsed) => Err(unknown),
    }
}

/// A future that turns a panic while polling the inner future into `Err`.
/// The limiter's futures are boxed by `async_trait`, hence `Unpin`.
struct CatchUnwind<F>(F);

impl<F: Future + Unpin> Future for CatchUnwind<F> {
    type Output = std::thread::Result<F::Output>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let inner = &mut self.0;
        // Unwind safety: after a panic the inner future is never polled again, and
        // the limiter answers for its own state (the memory backend recovers a
        // poisoned lock; its state is only changed after every check passed).
        match std::panic::catch_unwind(AssertUnwindSafe(|| Pin::new(inner).poll(cx))) {
            Ok(Poll::Pending) => Poll::Pending,
            Ok(Poll::Ready(output)) => Poll::Ready(Ok(output)),
            Err(payload) => Poll::Ready(Err(payload)),
        }
    }
}
