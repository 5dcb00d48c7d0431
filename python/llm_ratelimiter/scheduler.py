"""The asyncio scheduler: runs LLM calls as fast as their limits allow.

Jobs wait in one queue per (provider, model); within a queue, each class shares
what frees up by its weight (``classes``, highest first: the class due next is the
one with the lowest pass, which each of its jobs advances by 1/share), each tenant
has its own line within a class and tenants take turns, and workers take the
queues with ready work in turn. So neither a saturated model nor one tenant's burst holds up the
rest (no head-of-line blocking). The limiting decisions are the limiter's (the
Rust library); this module only orders Python coroutines around them:

- Each attempt reserves under a new lease id. A "not now" denial on a key every
  job of the queue needs (the model's rpm, tpm, concurrency) pauses that queue
  for the hint; a denial on a tenant's budget pauses only that tenant's line.
  A Complete in the queue ends a pause on tpm or concurrency at once.
- An unknown outcome is retried with the same lease id after the hint.
- A job that can never fit fails at once with :class:`ReservationDeniedError`.
- Complete always runs: after success (tokens reconciled to the usage), after an
  exception or a cancellation (concurrency released, tokens left at the
  reserved upper bound, since what the provider charged is unknown).
- Queues are bounded: :meth:`Scheduler.submit` raises :class:`QueueFullError`.
- :meth:`Scheduler.shutdown` answers jobs that did not run with
  :class:`JobNotRunError` and reports them.
"""

from __future__ import annotations

import asyncio
import collections
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Deque, Dict, Generic, List, Optional, Sequence, Tuple, TypeVar

from . import _arguments, _native
from .errors import (
    ArgumentTypeError,
    InvalidArgumentError,
    JobNotRunError,
    LimiterUnavailableError,
    QueueFullError,
    ReservationDeniedError,
    SchedulerClosedError,
)
from .limiter import _LimiterBase, _run_to_end
from .llm import LlmCall, Tokenizer, usage_tokens

__all__ = ["Scheduler", "JobResult", "ShutdownReport"]

T = TypeVar("T")

#: Calls in flight at once by default: one worker per call.
WORKERS_DEFAULT = 16
#: Queued jobs by default, all queues together: enough for bursts, small enough
#: that a stuck provider is noticed as QueueFullError rather than as memory.
QUEUED_JOBS_MAX_DEFAULT = 10_000
#: Retries of one attempt whose outcome is unknown (same lease id) before the job fails.
UNKNOWN_RETRIES_MAX_DEFAULT = 5
#: The most classes a scheduler takes: classes are tiers of importance, scanned at each take.
CLASSES_MAX = 16
#: The largest share of a class; 1,000 to 1 already means "one waits for the other".
CLASS_SHARE_MAX = 1_000
#: The pass a take of a class with share 1 advances (see the Rust core's scheduler).
_STRIDE_UNIT = 1 << 40
#: The one class of a scheduler given no ``classes``.
DEFAULT_CLASS = "default"
#: How long shutdown lets running calls finish by default, in seconds.
SHUTDOWN_TIMEOUT_S_DEFAULT = 10.0


@dataclass(frozen=True)
class JobResult(Generic[T]):
    """A job that ran: what the call returned and what it was charged."""

    job_id: str
    #: The lease of the attempt that ran.
    lease_id: str
    #: What the call returned.
    value: T
    #: The tokens Complete reconciled to.
    used_tokens: int
    #: Reserve attempts, the granted one included.
    attempts: int


@dataclass(frozen=True)
class ShutdownReport:
    """What shutdown left undone."""

    #: Jobs that never started: nothing was reserved for them.
    not_run: List[str] = field(default_factory=list)
    #: Jobs whose call was cancelled at the deadline (Complete still ran).
    aborted: List[str] = field(default_factory=list)


@dataclass
class _Job:
    job_id: str
    call: LlmCall
    requirements: List[Tuple[str, int]]
    run: Callable[[], Awaitable[Any]]
    usage: Callable[[Any], int]
    future: "asyncio.Future[JobResult[Any]]"
    class_index: int = 0
    attempts: int = 0
    task: Optional["asyncio.Task[Any]"] = None


@dataclass
class _ModelQueue:
    """One (provider, model): a line per (class, tenant); classes by their shares,
    tenants in turn within a class."""

    strides: List[int]
    lines: "collections.OrderedDict[Tuple[int, str], Deque[_Job]]" = field(default_factory=collections.OrderedDict)
    passes: List[int] = field(default_factory=list)
    paused_until: float = 0.0
    paused_key: str = ""
    tenant_paused_until: Dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.passes = [0] * len(self.strides)

    def add(self, job: _Job, front: bool) -> None:
        """Puts ``job`` in its line. A class that had no line rejoins at the lowest
        pass of those waiting: it cannot bank turns while it had nothing to run."""
        name = (job.class_index, job.call.tenant_id)
        waiting = {cls for cls, _ in self.lines}
        if job.class_index not in waiting and waiting:
            floor = min(self.passes[cls] for cls in waiting)
            self.passes[job.class_index] = max(self.passes[job.class_index], floor)
        line = self.lines.setdefault(name, collections.deque())
        if front:
            line.appendleft(job)
        else:
            line.append(job)

    def give_back(self, job: _Job) -> None:
        """A taken job was denied: its class keeps its turn, so turns count grants."""
        self.passes[job.class_index] = max(0, self.passes[job.class_index] - self.strides[job.class_index])

    def next_job(self, now: float) -> Optional[_Job]:
        if self.paused_until > now:
            return None
        first_in_turn: Dict[int, Tuple[int, str]] = {}
        for name in self.lines:
            if self.tenant_paused_until.get(name[1], 0.0) <= now:
                first_in_turn.setdefault(name[0], name)
        if not first_in_turn:
            return None
        class_index = min(first_in_turn, key=lambda cls: (self.passes[cls], cls))
        name = first_in_turn[class_index]
        line = self.lines[name]
        job = line.popleft()
        if line:
            self.lines.move_to_end(name)
        else:
            del self.lines[name]
        self.passes[class_index] += self.strides[class_index]
        return job

    def wake_at(self) -> float:
        """When a paused queue or line may have work again (inf: never by time)."""
        times = [self.paused_until] + [self.tenant_paused_until.get(t, 0.0) for _, t in self.lines]
        return min((t for t in times if t > 0), default=float("inf"))


class Scheduler:
    """Runs LLM jobs against a :class:`Limiter` or :class:`RemoteLimiter`.

    Use it as ``async with Scheduler(limiter) as scheduler:`` (shutdown on exit)
    and ``await scheduler.run(call, provider=..., ...)``, or :meth:`submit` to get
    a future. Create it inside a running event loop.
    """

    def __init__(
        self,
        limiter: _LimiterBase,
        *,
        workers: int = WORKERS_DEFAULT,
        queued_jobs_max: int = QUEUED_JOBS_MAX_DEFAULT,
        unknown_retries_max: int = UNKNOWN_RETRIES_MAX_DEFAULT,
        classes: Optional[Sequence[Tuple[str, int]]] = None,
    ) -> None:
        if not isinstance(limiter, _LimiterBase):
            raise ArgumentTypeError(
                f"limiter must be a Limiter or a RemoteLimiter, got {type(limiter).__name__}", field="limiter")
        _arguments.uint("workers", workers, minimum=1)
        _arguments.uint("queued_jobs_max", queued_jobs_max, minimum=1)
        _arguments.uint("unknown_retries_max", unknown_retries_max)
        self._classes = _check_classes(classes)
        self._strides = [_STRIDE_UNIT // share for _, share in self._classes]
        self._limiter = limiter
        self._queued_jobs_max = queued_jobs_max
        self._unknown_retries_max = unknown_retries_max
        self._queues: "collections.OrderedDict[Tuple[str, str], _ModelQueue]" = collections.OrderedDict()
        self._queued = 0
        self._running: Dict[str, _Job] = {}
        self._closed = False
        self._wakeup = asyncio.Event()
        self._workers = [asyncio.ensure_future(self._worker()) for _ in range(workers)]
        self._job_counter = 0

    async def __aenter__(self) -> "Scheduler":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.shutdown()

    @property
    def queued(self) -> int:
        """Jobs waiting for their turn or for capacity."""
        return self._queued

    def submit(
        self,
        run: Callable[[], Awaitable[T]],
        *,
        provider: str,
        model: str,
        tenant_id: str,
        prompt: str,
        max_tokens: int,
        prompt_tokens: Optional[int] = None,
        tokenizer: Optional[Tokenizer] = None,
        daily_budget: bool = False,
        job_id: Optional[str] = None,
        usage: Callable[[T], int] = usage_tokens,
        job_class: Optional[str] = None,
    ) -> "asyncio.Future[JobResult[T]]":
        """Queues one call: ``run()`` is awaited once its requirements are granted,
        and ``usage(result)`` (default: read the provider's ``usage``) gives the
        tokens Complete reconciles to. ``job_class`` names one of the scheduler's
        ``classes``; without it the job runs in the lowest class. Cancelling the
        returned future cancels the job (Complete still runs if it had started)."""
        _arguments.callable_("run", run)
        _arguments.callable_("usage", usage)
        _arguments.optional_str("job_id", job_id)
        _arguments.optional_str("job_class", job_class)
        class_index = self._class_index(job_class)
        if self._closed:
            raise SchedulerClosedError("the scheduler is shut down")
        if self._queued >= self._queued_jobs_max:
            raise QueueFullError(f"{self._queued} jobs are queued, the most allowed (queued_jobs_max)")
        call = LlmCall.create(provider, model, tenant_id, prompt, max_tokens, prompt_tokens=prompt_tokens,
                              tokenizer=tokenizer, daily_budget=daily_budget)
        self._job_counter += 1
        job = _Job(
            job_id=job_id or f"job-{self._job_counter}",
            call=call,
            requirements=[tuple(r) for r in call.requirements()],  # type: ignore[misc]
            run=run,
            usage=usage,
            future=asyncio.get_running_loop().create_future(),
            class_index=class_index,
        )
        job.future.add_done_callback(lambda f, job=job: self._on_future_done(job))
        queue = self._queues.setdefault((provider, model), _ModelQueue(self._strides))
        queue.add(job, front=False)
        self._queued += 1
        self._wakeup.set()
        return job.future

    async def run(self, run: Callable[[], Awaitable[T]], **kwargs: Any) -> JobResult[T]:
        """:meth:`submit` and wait for the result."""
        return await self.submit(run, **kwargs)

    async def shutdown(self, timeout_s: float = SHUTDOWN_TIMEOUT_S_DEFAULT) -> ShutdownReport:
        """Stops intake, answers queued jobs with :class:`JobNotRunError`, lets
        running calls finish for ``timeout_s``, then cancels them (Complete still
        runs). Answers what did not run or was cut short."""
        _arguments.seconds("timeout_s", timeout_s)
        self._closed = True
        not_run: List[str] = []
        for queue in self._queues.values():
            for line in queue.lines.values():
                for job in line:
                    not_run.append(job.job_id)
                    if not job.future.done():
                        job.future.set_exception(JobNotRunError("the scheduler shut down first", job_id=job.job_id))
            queue.lines.clear()
        self._queues.clear()
        self._queued = 0
        self._wakeup.set()
        aborted: List[str] = []
        _, pending = await asyncio.wait(self._workers, timeout=timeout_s) if self._workers else (set(), set())
        if pending:
            aborted = list(self._running)
            for job in list(self._running.values()):
                if job.task is not None:
                    job.task.cancel()
            await asyncio.wait(pending)
        self._workers = []
        return ShutdownReport(not_run=not_run, aborted=aborted)

    # Internals ---------------------------------------------------------------

    def _on_future_done(self, job: _Job) -> None:
        if job.future.cancelled() and job.task is not None:
            job.task.cancel()

    async def _next_job(self) -> Optional[Tuple[Tuple[str, str], _Job]]:
        while not self._closed:
            now = time.monotonic()
            wake_at = float("inf")
            for name in list(self._queues):
                queue = self._queues[name]
                job = queue.next_job(now)
                if job is None:
                    wake_at = min(wake_at, queue.wake_at())
                    continue
                self._queued -= 1
                self._queues.move_to_end(name)  # The next worker starts at another queue.
                if not queue.lines:
                    del self._queues[name]
                if job.future.done():  # Cancelled while queued: nothing reserved.
                    continue
                return name, job
            self._wakeup.clear()
            timeout = None if wake_at == float("inf") else max(0.0, wake_at - now)
            try:
                await asyncio.wait_for(self._wakeup.wait(), timeout)
            except asyncio.TimeoutError:
                pass
        return None

    def _class_index(self, job_class: Optional[str]) -> int:
        if job_class is None:
            return len(self._classes) - 1
        for index, (name, _) in enumerate(self._classes):
            if name == job_class:
                return index
        raise InvalidArgumentError(f"job_class {job_class!r} is not one of the scheduler's classes",
                                   field="job_class")

    def _requeue(self, name: Tuple[str, str], job: _Job, front: bool) -> "_ModelQueue":
        queue = self._queues.setdefault(name, _ModelQueue(self._strides))
        queue.add(job, front)
        self._queued += 1
        return queue

    async def _worker(self) -> None:
        while True:
            picked = await self._next_job()
            if picked is None:
                return
            name, job = picked
            await self._attempt(name, job)

    async def _attempt(self, name: Tuple[str, str], job: _Job) -> None:
        reservation = await self._reserve(job)
        if reservation is None:
            return
        if not reservation.allowed:
            denial = reservation.denial
            if denial.reason == "exceeds_capacity":
                job.future.set_exception(
                    ReservationDeniedError(f"job {job.job_id} can never fit: {denial.error_code}", denial=denial)
                )
                return
            if self._closed:
                job.future.set_exception(JobNotRunError("the scheduler shut down first", job_id=job.job_id))
                return
            queue = self._requeue(name, job, front=True)
            queue.give_back(job)
            until = time.monotonic() + denial.retry_after_ms / 1000
            if denial.key is not None and denial.key.startswith("tenant:"):
                queue.tenant_paused_until[job.call.tenant_id] = until
            else:
                queue.paused_until, queue.paused_key = until, denial.key or ""
            self._wakeup.set()
            return
        await self._execute(name, job, reservation.lease_id)

    async def _reserve(self, job: _Job) -> Any:
        """One attempt under a new lease id, retried with that id while the
        outcome is unknown; ``None`` when the job was answered with an error."""
        lease_id = _native.new_lease_id()
        for retry in range(self._unknown_retries_max + 1):
            job.attempts += 1
            try:
                return await self._limiter.areserve(job.requirements, lease_id=lease_id, job_id=job.job_id)
            except LimiterUnavailableError as error:
                if retry == self._unknown_retries_max:
                    _fail(job, error)
                    return None
                await asyncio.sleep(error.retry_after_ms / 1000)
            except Exception as error:  # Bad input or a bug: the job fails, the worker lives on.
                _fail(job, error)
                return None
        return None  # pragma: no cover

    async def _execute(self, name: Tuple[str, str], job: _Job, lease_id: str) -> None:
        self._running[job.job_id] = job
        job.task = asyncio.ensure_future(job.run())
        if job.future.cancelled():
            job.task.cancel()
        used: Optional[int] = None
        try:
            value = await asyncio.shield(job.task) if not job.task.done() else job.task.result()
            used = job.usage(value)
            if not job.future.done():
                job.future.set_result(JobResult(job.job_id, lease_id, value, used, job.attempts))
        except asyncio.CancelledError:
            if job.task is not None and not job.task.done():
                job.task.cancel()
            _fail(job, asyncio.CancelledError())
        except BaseException as error:  # The call's own failure is the job's result.
            _fail(job, error)
        finally:
            self._running.pop(job.job_id, None)
            actuals = job.call.actuals(used) if used is not None else None
            try:
                await _run_to_end(self._limiter.acomplete(lease_id, actuals, job_id=job.job_id))
            except Exception:  # noqa: BLE001 - the hold still ends at its timeout.
                pass
            queue = self._queues.get(name)
            if queue is not None and queue.paused_until and not queue.paused_key.endswith(":rpm"):
                queue.paused_until = 0.0
                self._wakeup.set()


def _check_classes(classes: Any) -> List[Tuple[str, int]]:
    """The scheduler's classes, highest first: ``(name, share)`` pairs, 1..=16 of
    them, names unique and non-empty, shares 1..=1000. ``None``: one class."""
    if classes is None:
        return [(DEFAULT_CLASS, 1)]
    if isinstance(classes, (str, bytes)) or not isinstance(classes, Sequence):
        raise ArgumentTypeError(f"classes must be a sequence of (name, share) pairs, got {type(classes).__name__}",
                                field="classes")
    if not 1 <= len(classes) <= CLASSES_MAX:
        raise InvalidArgumentError(f"classes must list 1..={CLASSES_MAX} classes, got {len(classes)}",
                                   field="classes")
    checked: List[Tuple[str, int]] = []
    for index, pair in enumerate(classes):
        field_name = f"classes[{index}]"
        if isinstance(pair, (str, bytes)) or not isinstance(pair, Sequence) or len(pair) != 2:
            raise ArgumentTypeError(f"{field_name} must be a (name, share) pair", field=field_name)
        name, share = pair
        if not isinstance(name, str) or not name:
            raise InvalidArgumentError(f"{field_name}: the name must be a non-empty str", field=field_name)
        if any(name == seen for seen, _ in checked):
            raise InvalidArgumentError(f"class {name!r} is declared twice", field=field_name)
        _arguments.uint(f"{field_name} share", share, minimum=1, maximum=CLASS_SHARE_MAX)
        checked.append((name, share))
    return checked


def _fail(job: _Job, error: BaseException) -> None:
    if job.future.done():
        return
    if isinstance(error, asyncio.CancelledError):
        job.future.cancel()
    else:
        job.future.set_exception(error)
