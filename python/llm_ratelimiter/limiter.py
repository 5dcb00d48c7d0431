"""The limiters: :class:`Limiter` in this process, :class:`RemoteLimiter` over
HTTP to ``ratelimiterd``. Both have the same interface, sync and asyncio."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import threading
import time
from typing import (
    Any, AsyncIterator, Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple, TypeVar, Union,
)

from . import _arguments, _native, _tracing
from ._native import Denial, Reservation
from .errors import (
    ArgumentTypeError,
    InvalidArgumentError,
    LimiterUnavailableError,
    RateLimiterError,
    ReservationDeniedError,
    ReservationTimeoutError,
)
from .headers import HeadersLike, LimitMismatch, header_pairs, mismatches_from_json, read_provider_headers
from .limits import DefinitionLike, LimitReport, definition_json
from .llm import LlmCall, Tokenizer, usage_tokens

__all__ = ["Limiter", "RemoteLimiter", "Lease", "LlmLease", "Pairs"]

#: ``(key, amount)`` pairs: :class:`Requirement` / :class:`Actual` or plain tuples.
Pairs = Sequence[Tuple[str, int]]

#: How long the context managers wait for a grant by default, in seconds: two
#: minutes, so that a full per-minute window's hint (60 s plus its margin, about
#: 60.25 s) is waited out rather than raised at once.
WAIT_TIMEOUT_S_DEFAULT = 120.0
#: Attempts at Complete when the limiter is unreachable: Complete is idempotent,
#: and a hold that is never completed still ends at its timeout.
COMPLETE_ATTEMPTS_MAX = 3
#: The longest pause of a model after a provider's 429, in ms (the library's bound).
PAUSE_MS_MAX: int = _native.PAUSE_MS_MAX
#: How often a running pause holds again what freed, in seconds (the library's
#: ``REHOLD_INTERVAL_MS``): a new pause ending less than this after the running one is
#: not started.
REHOLD_INTERVAL_S = 0.1
#: Where :meth:`observe_response` warns of limits configured above the provider's.
_LOG = logging.getLogger("llm_ratelimiter")


class Lease:
    """A granted reservation held by a context manager. Report what the call
    used with :meth:`report`; Complete runs on exit, after an exception too."""

    def __init__(self, reservation: Reservation, requirements: Pairs) -> None:
        self.reservation = reservation
        self.requirements = list(requirements)
        self.actuals: Optional[List[Tuple[str, int]]] = None

    @property
    def lease_id(self) -> str:
        """The lease's id, for logs and for completing it by hand."""
        return self.reservation.lease_id

    def report(self, actuals: Pairs) -> None:
        """Sets the usage Complete reconciles the rolling limits to. Without a
        report the limits stay at the reserved amounts (safe, never under)."""
        self.actuals = _arguments.pairs("actuals", actuals)


class LlmLease(Lease):
    """A lease for one LLM call: report the provider's ``usage``."""

    def __init__(self, reservation: Reservation, call: LlmCall) -> None:
        super().__init__(reservation, call.requirements())
        self.call = call

    def record_usage(self, usage: Any) -> int:
        """Reports the tokens the provider charged: an ``int``, an OpenAI or
        Anthropic response, or its ``usage``. Answers the count."""
        tokens = usage_tokens(usage)
        self.report(self.call.actuals(tokens))
        return tokens


class _Frees:
    """Wakes the waits of one limiter as soon as capacity frees in this process (a
    Complete, which releases holds and reconciles down; a definition, which may raise
    a limit), and knows whether anything granted here is still held (then something
    may free before a denial's hint)."""

    def __init__(self) -> None:
        self._lock = threading.Condition()
        self.epoch = 0
        self._held: set = set()
        self._events: List[Tuple[asyncio.AbstractEventLoop, asyncio.Event]] = []

    def granted(self, lease_id: str) -> None:
        with self._lock:
            self._held.add(lease_id)

    def freed(self, lease_id: Optional[str]) -> None:
        with self._lock:
            if lease_id is not None:
                self._held.discard(lease_id)
            self.epoch += 1
            self._lock.notify_all()
            for loop, event in self._events:
                loop.call_soon_threadsafe(event.set)

    def holding(self) -> bool:
        with self._lock:
            return bool(self._held)

    def wait(self, epoch: int, timeout_s: float) -> None:
        """Sleeps up to ``timeout_s``, ending early once the epoch moved past ``epoch``."""
        with self._lock:
            self._lock.wait_for(lambda: self.epoch != epoch, max(timeout_s, 0.0))

    async def await_(self, epoch: int, timeout_s: float) -> None:
        """:meth:`wait` for asyncio, without blocking the loop."""
        event = asyncio.Event()
        entry = (asyncio.get_running_loop(), event)
        with self._lock:
            if self.epoch != epoch:
                return
            self._events.append(entry)
        try:
            await asyncio.wait_for(event.wait(), max(timeout_s, 0.0))
        except asyncio.TimeoutError:
            pass
        finally:
            with self._lock:
                self._events.remove(entry)


class _Pauses:
    """The models this limiter paused after a provider's 429, and when each pause ends
    (``time.monotonic()``), so that a wait for a paused model lasts past it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._until: dict = {}
        self.warned: set = set()

    def start(self, provider: str, model: str, duration_s: float) -> None:
        with self._lock:
            until = time.monotonic() + duration_s
            self._until[(provider, model)] = max(until, self._until.get((provider, model), 0.0))

    def covers(self, provider: str, model: str, duration_s: float) -> bool:
        """Whether the pause running ends no more than a re-hold interval before one of
        ``duration_s`` from now would: the burst of 429s of the calls in flight when the
        provider's limit ran out then makes one pause, not one per call."""
        with self._lock:
            running = self._until.get((provider, model), 0.0)
        return time.monotonic() + duration_s < running + REHOLD_INTERVAL_S

    def left_s(self, provider: str, model: str) -> float:
        with self._lock:
            return max(self._until.get((provider, model), 0.0) - time.monotonic(), 0.0)

    def end_of(self, key: Optional[str]) -> Optional[float]:
        """When the pause of the model ``key`` belongs to ends, if one runs."""
        if key is None:
            return None
        now = time.monotonic()
        with self._lock:
            ends = [until for (provider, model), until in self._until.items()
                    if until > now and key.startswith(_model_prefix(provider, model))]
        return max(ends, default=None)


def _model_prefix(provider: str, model: str) -> str:
    """The start of every key of ``provider``'s ``model``."""
    return f"global:llm:{provider}:{model}:"


#: Creates a limiter's :class:`_Frees` and :class:`_Pauses` once, whichever thread asks first.
_FREES_LOCK = threading.Lock()

#: A limiter's lazily made state (:class:`_Frees`, :class:`_Pauses`).
_State = TypeVar("_State")


class _LimiterBase:
    """What both limiters share: the interface around the native calls."""

    _native: Any

    def _shared_state(self, name: str, factory: Callable[[], _State]) -> _State:
        """The limiter's ``name`` state, made by ``factory`` on first use, once
        whichever thread asks first."""
        state = self.__dict__.get(name)
        if state is None:
            with _FREES_LOCK:
                state = self.__dict__.setdefault(name, factory())
        return state

    @property
    def _frees(self) -> _Frees:
        return self._shared_state("_frees_state", _Frees)

    @property
    def _pauses(self) -> _Pauses:
        return self._shared_state("_pauses_state", _Pauses)

    # Reserve and complete -------------------------------------------------

    def _trace_kwargs(self) -> Dict[str, Optional[str]]:
        """The trace context sent with a call: none in this process."""
        return {}

    def reserve(
        self, requirements: Pairs, *, lease_id: Optional[str] = None, job_id: Optional[str] = None
    ) -> Reservation:
        """Reserves every requirement or none. A denial is returned, not raised;
        retry a denial with a **new** lease id (the default). Raises
        :class:`LimiterUnavailableError` (with the lease id) when the outcome is unknown."""
        reservation = self._native.reserve(requirements, lease_id=lease_id, job_id=job_id, **self._trace_kwargs())
        if reservation.allowed:
            self._frees.granted(reservation.lease_id)
        return reservation

    def complete(self, lease_id: str, actuals: Optional[Pairs] = None, *, job_id: Optional[str] = None) -> None:
        """Releases the lease's concurrency holds and reconciles its rolling
        limits to ``actuals``. Idempotent: completing twice or completing an
        unknown lease does nothing."""
        self._native.complete(lease_id, actuals, job_id=job_id, **self._trace_kwargs())
        self._frees.freed(lease_id)

    async def areserve(
        self, requirements: Pairs, *, lease_id: Optional[str] = None, job_id: Optional[str] = None
    ) -> Reservation:
        """:meth:`reserve` for asyncio."""
        raise NotImplementedError  # pragma: no cover

    async def acomplete(
        self, lease_id: str, actuals: Optional[Pairs] = None, *, job_id: Optional[str] = None
    ) -> None:
        """:meth:`complete` for asyncio."""
        raise NotImplementedError  # pragma: no cover

    # Admin -----------------------------------------------------------------

    def define(self, definition: DefinitionLike) -> LimitReport:
        """Defines (or redefines) a limit; a lower capacity starts a decrease."""
        report = LimitReport.from_json(self._native.define(definition_json(definition)))
        self._frees.freed(None)
        return report

    def define_many(self, definitions: Iterable[DefinitionLike]) -> List[LimitReport]:
        """Defines each limit in turn."""
        return [self.define(d) for d in definitions]

    def limits(self) -> List[LimitReport]:
        """Every limit with its usage, ordered by key."""
        return [LimitReport.from_mapping(r) for r in json.loads(self._native.limits())]

    def limit(self, key: str) -> Optional[LimitReport]:
        """One limit with its usage; ``None`` when it is not defined."""
        text = self._native.limit(key)
        return None if text is None else LimitReport.from_json(text)

    # Learning from the provider's headers ----------------------------------

    def limits_above_provider(self, provider: str, model: str, headers: HeadersLike) -> List[LimitMismatch]:
        """The limits of ``provider``'s ``model`` defined above what the provider's
        response ``headers`` report (compared per minute): each is a limit the provider
        refuses before this limiter does. Reads this limiter's definitions (a
        :class:`RemoteLimiter` needs the admin token for that)."""
        prefix = _model_prefix(_arguments_str("provider", provider), _arguments_str("model", model))
        definitions = [json.loads(definition_json(r.definition)) for r in self.limits()
                       if r.definition.key.startswith(prefix)]
        text = _native.limits_above_provider(header_pairs(headers), provider, model, json.dumps(definitions))
        return mismatches_from_json(text)

    def pause_model(
        self, provider: str, model: str, *, duration_s: Optional[float] = None,
        headers: Optional[HeadersLike] = None,
    ) -> float:
        """Pauses ``provider``'s ``model`` after its 429: holds the free capacity of the
        model's keys for ``duration_s``, else the time the 429's ``headers`` ask for
        (``retry-after-ms``, ``retry-after``, the limits' resets; 1 s when they name
        none), at most ten minutes. The hold is in the limiter, so on a
        :class:`RemoteLimiter` every client of the server is paused too; capacity
        freed meanwhile is held again every 100 ms, and the hold ends by itself. A
        pause of the model already running until then (or less than 100 ms before) is
        left to cover it: no second pause starts. Answers the pause in seconds."""
        _arguments_str("provider", provider)
        _arguments_str("model", model)
        if duration_s is not None:
            duration_ms = math.ceil(_arguments.seconds("duration_s", duration_s) * 1000)
            if not 1 <= duration_ms <= PAUSE_MS_MAX:
                raise InvalidArgumentError(f"duration_s must be 0.001..={PAUSE_MS_MAX // 1000} s, got {duration_s}",
                                           field="duration_s")
        elif headers is not None:
            duration_ms = read_provider_headers(headers).pause_ms
        else:
            raise ArgumentTypeError("pause_model needs duration_s or headers", field="duration_s")
        if not self._pauses.covers(provider, model, duration_ms / 1000):
            self._native.pause(self._model_keys(provider, model), duration_ms)
            self._pauses.start(provider, model, duration_ms / 1000)
        return duration_ms / 1000

    def paused_s(self, provider: str, model: str) -> float:
        """Seconds left of this limiter's pause of ``provider``'s ``model``; 0 when none runs."""
        return self._pauses.left_s(provider, model)

    def observe_response(
        self, provider: str, model: str, status: int, headers: HeadersLike
    ) -> List[LimitMismatch]:
        """Learns from one response of ``provider``'s ``model``: answers the limits
        configured above the provider's (logged once per model as a warning), and
        after a 429 pauses the model until the provider's reset (:meth:`pause_model`).
        Call it with every response's status and headers."""
        _arguments.uint("status", status, maximum=999)
        try:
            mismatches = self.limits_above_provider(provider, model, headers)
        except RateLimiterError as error:
            if isinstance(error, ArgumentTypeError):
                raise
            mismatches = []  # The definitions cannot be read here (no admin token).
        if mismatches and (provider, model) not in self._pauses.warned:
            self._pauses.warned.add((provider, model))
            _LOG.warning("the configured limits of %s %s are above the provider's: %s; expect provider 429s",
                         provider, model, mismatches)
        if status == 429:
            self.pause_model(provider, model, headers=headers)
        return mismatches

    def _model_keys(self, provider: str, model: str) -> List[str]:
        """The keys a pause of the model holds: every defined key of the model, or,
        where the definitions cannot be read (a client without the admin token), its
        ``rpm`` key, which every call of the model reserves."""
        prefix = _model_prefix(provider, model)
        try:
            keys = [r.definition.key for r in self.limits() if r.definition.key.startswith(prefix)]
        except RateLimiterError:
            keys = []
        return keys or [prefix + "rpm"]

    def _after_denial(self, denial: Optional[Denial], deadline: float, timeout_s: float) -> Tuple[float, bool]:
        """The wait's deadline after ``denial``, and whether something this limiter
        holds may free the denied key before the denial's hint. A wait denied by this
        limiter's pause of a model counts its timeout from the pause's end: a pause is
        the provider's time, not the caller's. The pause's holds are this limiter's
        and are released at its end, while the hint adds the window's margin and the
        backend's jitter (the retry policy's ``jitter_ms``) to the holds' end: a hint
        past the deadline then waits until the deadline and tries again, rather than
        giving up at once."""
        end = self._pauses.end_of(denial.key if denial is not None else None)
        if end is None:
            return deadline, self._frees.holding()
        return max(deadline, end + timeout_s), True

    # Waiting for a grant ---------------------------------------------------

    def reserve_wait(
        self, requirements: Pairs, *, timeout_s: float = WAIT_TIMEOUT_S_DEFAULT, job_id: Optional[str] = None
    ) -> Reservation:
        """Reserves, waiting while denied with a new lease id per attempt, until granted
        or ``timeout_s``. A wait ends at the denial's hint, or as soon as capacity frees
        in this process (a Complete or a definition on this limiter), whichever is first.
        A hint past the deadline raises at once only when nothing granted by this limiter
        is still held (then nothing can free sooner); otherwise the wait lasts until the
        deadline, woken by frees. An unknown outcome is retried with the same lease id.
        Raises :class:`ReservationDeniedError` when the requirements can never fit and
        :class:`ReservationTimeoutError` at the deadline."""
        timeout_s = _arguments.seconds("timeout_s", timeout_s)
        deadline = time.monotonic() + timeout_s
        lease_id: Optional[str] = None
        while True:
            epoch = self._frees.epoch
            try:
                reservation = self.reserve(requirements, lease_id=lease_id, job_id=job_id)
            except LimiterUnavailableError as error:
                lease_id = error.lease_id
                _sleep_or_raise(deadline, error.retry_after_ms, None, error)
                time.sleep(error.retry_after_ms / 1000)
                continue
            if reservation.allowed:
                return reservation
            lease_id = None
            deadline, holding = self._after_denial(reservation.denial, deadline, timeout_s)
            self._frees.wait(epoch, _wait_s(reservation.denial, deadline, holding))

    async def areserve_wait(
        self, requirements: Pairs, *, timeout_s: float = WAIT_TIMEOUT_S_DEFAULT, job_id: Optional[str] = None
    ) -> Reservation:
        """:meth:`reserve_wait` for asyncio: waits without blocking the loop."""
        timeout_s = _arguments.seconds("timeout_s", timeout_s)
        deadline = time.monotonic() + timeout_s
        lease_id: Optional[str] = None
        while True:
            epoch = self._frees.epoch
            try:
                reservation = await self.areserve(requirements, lease_id=lease_id, job_id=job_id)
            except LimiterUnavailableError as error:
                lease_id = error.lease_id
                _sleep_or_raise(deadline, error.retry_after_ms, None, error)
                await asyncio.sleep(error.retry_after_ms / 1000)
                continue
            if reservation.allowed:
                return reservation
            lease_id = None
            deadline, holding = self._after_denial(reservation.denial, deadline, timeout_s)
            await self._frees.await_(epoch, _wait_s(reservation.denial, deadline, holding))

    @contextlib.contextmanager
    def reservation(
        self, requirements: Pairs, *, timeout_s: float = WAIT_TIMEOUT_S_DEFAULT, job_id: Optional[str] = None
    ) -> Iterator[Lease]:
        """Reserves (waiting while denied, up to ``timeout_s``), yields the
        :class:`Lease`, and completes it on exit with what was reported."""
        lease = Lease(self.reserve_wait(requirements, timeout_s=timeout_s, job_id=job_id), requirements)
        try:
            yield lease
        finally:
            self._complete_lease(lease, job_id)

    @contextlib.asynccontextmanager
    async def areservation(
        self, requirements: Pairs, *, timeout_s: float = WAIT_TIMEOUT_S_DEFAULT, job_id: Optional[str] = None
    ) -> AsyncIterator[Lease]:
        """:meth:`reservation` for asyncio; Complete runs after a cancellation too."""
        reservation = await self.areserve_wait(requirements, timeout_s=timeout_s, job_id=job_id)
        lease = Lease(reservation, requirements)
        try:
            yield lease
        finally:
            await self._acomplete_lease(lease, job_id)

    @contextlib.contextmanager
    def llm_call(
        self, provider: str, model: str, tenant_id: str, prompt: str, max_tokens: int, *,
        prompt_tokens: Optional[int] = None, tokenizer: Optional[Tokenizer] = None, daily_budget: bool = False,
        timeout_s: float = WAIT_TIMEOUT_S_DEFAULT, job_id: Optional[str] = None,
    ) -> Iterator[LlmLease]:
        """One LLM call under one reservation: yields an :class:`LlmLease`; call
        ``lease.record_usage(response.usage)`` and Complete reconciles to it."""
        call = LlmCall.create(provider, model, tenant_id, prompt, max_tokens, prompt_tokens=prompt_tokens,
                              tokenizer=tokenizer, daily_budget=daily_budget)
        lease = LlmLease(self.reserve_wait(call.requirements(), timeout_s=timeout_s, job_id=job_id), call)
        try:
            yield lease
        finally:
            self._complete_lease(lease, job_id)

    @contextlib.asynccontextmanager
    async def allm_call(
        self, provider: str, model: str, tenant_id: str, prompt: str, max_tokens: int, *,
        prompt_tokens: Optional[int] = None, tokenizer: Optional[Tokenizer] = None, daily_budget: bool = False,
        timeout_s: float = WAIT_TIMEOUT_S_DEFAULT, job_id: Optional[str] = None,
    ) -> AsyncIterator[LlmLease]:
        """:meth:`llm_call` for asyncio."""
        call = LlmCall.create(provider, model, tenant_id, prompt, max_tokens, prompt_tokens=prompt_tokens,
                              tokenizer=tokenizer, daily_budget=daily_budget)
        reservation = await self.areserve_wait(call.requirements(), timeout_s=timeout_s, job_id=job_id)
        lease = LlmLease(reservation, call)
        try:
            yield lease
        finally:
            await self._acomplete_lease(lease, job_id)

    def _complete_lease(self, lease: Lease, job_id: Optional[str]) -> None:
        for attempt in range(COMPLETE_ATTEMPTS_MAX):
            try:
                self.complete(lease.lease_id, lease.actuals, job_id=job_id)
                return
            except LimiterUnavailableError as error:
                if attempt + 1 == COMPLETE_ATTEMPTS_MAX:
                    raise
                time.sleep(error.retry_after_ms / 1000)

    async def _acomplete_lease(self, lease: Lease, job_id: Optional[str]) -> None:
        async def complete() -> None:
            for attempt in range(COMPLETE_ATTEMPTS_MAX):
                try:
                    await self.acomplete(lease.lease_id, lease.actuals, job_id=job_id)
                    return
                except LimiterUnavailableError as error:
                    if attempt + 1 == COMPLETE_ATTEMPTS_MAX:
                        raise
                    await asyncio.sleep(error.retry_after_ms / 1000)

        await _run_to_end(complete())


def _arguments_str(name: str, value: Any) -> str:
    """A ``str`` argument (a provider or model name)."""
    if not isinstance(value, str):
        raise ArgumentTypeError(f"{name} must be a str, got {type(value).__name__}", field=name)
    return value


async def _run_to_end(work: Any) -> None:
    """Awaits ``work`` to its end even if the awaiting task is cancelled meanwhile,
    then re-raises the cancellation: Complete must not be cut short."""
    task = asyncio.ensure_future(work)
    try:
        await asyncio.shield(task)
    except asyncio.CancelledError:
        await task
        raise


def _wait_s(denial: Optional[Denial], deadline: float, holding: bool) -> float:
    """How long to wait after a denial (a free may end it sooner), or the exception
    that ends the wait: the requirements never fit, the deadline passed, or the hint
    reaches past it while nothing held in this process can free sooner."""
    assert denial is not None
    if denial.reason == "exceeds_capacity":
        raise ReservationDeniedError(f"can never be granted: {denial.error_code}", denial=denial)
    left_s = deadline - time.monotonic()
    if left_s <= 0 or (not holding and denial.retry_after_ms / 1000 > left_s):
        raise ReservationTimeoutError(
            f"no grant before the deadline (next try in {denial.retry_after_ms} ms)", denial=denial
        )
    return min(denial.retry_after_ms / 1000, left_s)


def _sleep_or_raise(
    deadline: float, wait_ms: int, denial: Optional[Denial], cause: Optional[BaseException]
) -> None:
    if time.monotonic() + wait_ms / 1000 > deadline:
        error = ReservationTimeoutError(
            f"no grant before the deadline (next try in {wait_ms} ms)", denial=denial
        )
        raise error from cause


class Limiter(_LimiterBase):
    """Limits held in this process (single-binary mode).

    Thread-safe: one instance serves every thread, and the GIL is released
    while Rust decides. Reserve and complete never wait (one short lock), so the
    asyncio twins run them directly on the loop.

    ``manual_clock_unix_ms`` starts a clock that only :meth:`advance_clock_ms`
    moves (tests and simulations); otherwise the system clock is used.

    A lowered capacity waits until usage fits it; the limiter then carries the
    decrease out by itself, as ``ratelimiterd`` does: a thread checks every
    ``decrease_check_interval_ms`` (default 1000; 0 leaves it to
    :meth:`apply_pending_decreases`). On a manual clock, every
    :meth:`advance_clock_ms` checks instead.
    """

    def __init__(
        self,
        limits: Iterable[DefinitionLike] = (),
        *,
        limits_file: Union[str, "os.PathLike[str]", None] = None,
        leases_max: Optional[int] = None,
        settled_leases_max: Optional[int] = None,
        failed_leases_max: Optional[int] = None,
        decrease_retry_ms: Optional[int] = None,
        manual_clock_unix_ms: Optional[int] = None,
        decrease_check_interval_ms: Optional[int] = None,
    ) -> None:
        for name, value in (("leases_max", leases_max), ("settled_leases_max", settled_leases_max),
                            ("failed_leases_max", failed_leases_max), ("decrease_retry_ms", decrease_retry_ms),
                            ("manual_clock_unix_ms", manual_clock_unix_ms),
                            ("decrease_check_interval_ms", decrease_check_interval_ms)):
            _arguments.optional_uint(name, value)
        if isinstance(limits, (str, bytes)) or not isinstance(limits, Iterable):
            raise ArgumentTypeError(f"limits must be an iterable of definitions, got {type(limits).__name__}",
                                    field="limits")
        self._native = _native.MemoryLimiter(
            leases_max=leases_max, settled_leases_max=settled_leases_max, failed_leases_max=failed_leases_max,
            decrease_retry_ms=decrease_retry_ms, manual_clock_unix_ms=manual_clock_unix_ms,
            decrease_check_interval_ms=decrease_check_interval_ms,
        )
        if limits_file is not None:
            self.load_limits_file(limits_file)
        self.define_many(limits)

    def load_limits_file(self, path: Union[str, "os.PathLike[str]"]) -> int:
        """Applies every limit of a registry file as ``ratelimiterd`` writes it
        (``data/limits.json``); answers how many."""
        if not isinstance(path, (str, os.PathLike)):
            raise ArgumentTypeError(f"path must be a str or a path, got {type(path).__name__}", field="path")
        return self._native.load_limits_file(os.fspath(path))

    def apply_pending_decreases(self) -> int:
        """Carries out the capacity decreases usage now allows; answers how many.
        The limiter does this by itself every ``decrease_check_interval_ms`` (on
        a manual clock, on every :meth:`advance_clock_ms`); call it to have a
        decrease carried out at once."""
        return self._native.apply_pending_decreases()

    def advance_clock_ms(self, ms: int) -> None:
        """Moves the manual clock forward (only with ``manual_clock_unix_ms``),
        then carries out the pending decreases usage now allows."""
        self._native.advance_clock_ms(_arguments.uint("ms", ms))

    async def areserve(
        self, requirements: Pairs, *, lease_id: Optional[str] = None, job_id: Optional[str] = None
    ) -> Reservation:
        """:meth:`reserve` for asyncio (it never waits, so it runs inline)."""
        return self.reserve(requirements, lease_id=lease_id, job_id=job_id)

    async def acomplete(
        self, lease_id: str, actuals: Optional[Pairs] = None, *, job_id: Optional[str] = None
    ) -> None:
        """:meth:`complete` for asyncio (it never waits, so it runs inline)."""
        self._native.complete(lease_id, actuals, job_id=job_id)
        self._frees.freed(lease_id)


class RemoteLimiter(_LimiterBase):
    """A limiter served by ``ratelimiterd`` over HTTP.

    Connections are kept alive and shared; every attempt has a timeout; an
    attempt without an answer (timeout, refused, 503) is retried ``retries_max``
    times with the same body, hence the same lease id, so a retry never reserves
    twice. When the outcome stays unknown, :class:`LimiterUnavailableError`
    carries the lease id to retry with. The asyncio twins do not take a thread:
    the request runs on the module's Rust runtime and resolves an asyncio future.

    ``base_url`` is one URL (a server, or a load balancer in front of a fleet) or
    a list of the servers of a fleet (at most 16), in failover order: a retry
    goes to the next server with the same lease id (Reserve and Complete are
    idempotent by lease id), ``retries_max`` bounding the retries across all of
    them, and the server that answered is where later calls start, so a dead
    server costs one failed attempt, not one per call. Denials and other errors
    are returned at once, never tried elsewhere.
    """

    def __init__(
        self,
        base_url: Union[str, Sequence[str]] = "http://127.0.0.1:8080",
        *,
        token: Optional[str] = None,
        request_timeout_ms: int = 2_000,
        connect_timeout_ms: int = 1_000,
        retries_max: int = 2,
        retry_wait_ms_max: int = 1_000,
    ) -> None:
        _arguments.optional_str("token", token)
        for name, value in (("request_timeout_ms", request_timeout_ms), ("connect_timeout_ms", connect_timeout_ms),
                            ("retry_wait_ms_max", retry_wait_ms_max)):
            _arguments.uint(name, value)
        _arguments.uint("retries_max", retries_max, maximum=2**32 - 1)
        #: The server URLs, in failover order.
        self.base_urls: Tuple[str, ...] = _arguments.urls("base_url", base_url)
        #: The first of them (the only one for a single server or a load balancer).
        self.base_url = self.base_urls[0] if self.base_urls else ""
        self._native = _native.RemoteLimiter(
            list(self.base_urls), token=token, request_timeout_ms=request_timeout_ms,
            connect_timeout_ms=connect_timeout_ms, retries_max=retries_max, retry_wait_ms_max=retry_wait_ms_max,
        )

    def _trace_kwargs(self) -> Dict[str, Optional[str]]:
        """The current OpenTelemetry span's context, when ``opentelemetry-api`` is installed."""
        return _tracing.trace_kwargs()

    async def areserve(
        self, requirements: Pairs, *, lease_id: Optional[str] = None, job_id: Optional[str] = None
    ) -> Reservation:
        """:meth:`reserve` for asyncio."""
        future, callback = _future_and_callback()
        self._native.reserve_async(requirements, callback, lease_id=lease_id, job_id=job_id, **self._trace_kwargs())
        reservation = await future
        if reservation.allowed:
            self._frees.granted(reservation.lease_id)
        return reservation

    async def acomplete(
        self, lease_id: str, actuals: Optional[Pairs] = None, *, job_id: Optional[str] = None
    ) -> None:
        """:meth:`complete` for asyncio."""
        future, callback = _future_and_callback()
        self._native.complete_async(lease_id, callback, actuals, job_id=job_id, **self._trace_kwargs())
        await future
        self._frees.freed(lease_id)

    async def adefine(self, definition: DefinitionLike) -> LimitReport:
        """:meth:`define` for asyncio (in a worker thread: admin calls are rare)."""
        return await asyncio.to_thread(self.define, definition)

    async def alimits(self) -> List[LimitReport]:
        """:meth:`limits` for asyncio."""
        return await asyncio.to_thread(self.limits)


def _future_and_callback() -> Tuple["asyncio.Future[Any]", Any]:
    """An asyncio future and the callback, called from a Rust thread, that resolves it."""
    loop = asyncio.get_running_loop()
    future: "asyncio.Future[Any]" = loop.create_future()

    def resolve(value: Any, error: Optional[BaseException]) -> None:
        if future.done():  # Cancelled meanwhile: the answer has no reader.
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(value)

    def callback(value: Any, error: Optional[BaseException]) -> None:
        with contextlib.suppress(RuntimeError):  # The loop closed: nobody waits any more.
            loop.call_soon_threadsafe(resolve, value, error)

    return future, callback
