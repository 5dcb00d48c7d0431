"""Every bad argument of every public entry point raises the package's typed
error, naming the argument (issue 21): :class:`ArgumentTypeError` (a
``TypeError``) for a wrong type, :class:`InvalidArgumentError` (a
``ValueError``) for a wrong value. Never a plain ``TypeError``, ``ValueError``
or ``OverflowError`` from deep inside, and nothing is changed."""

from __future__ import annotations

import asyncio
import math
from typing import Any, Callable, List, Tuple, Type

import pytest

from llm_ratelimiter import (
    ArgumentTypeError,
    InvalidArgumentError,
    LimitDefinition,
    Limiter,
    RemoteLimiter,
    Scheduler,
    new_lease_id,
)
from llm_ratelimiter.limiter import Lease

KEY = "global:llm:args:m:tpm"
START_MS = 1_700_000_000_000

Case = Tuple[str, Callable[[], Any], Type[Exception], str]


def _limiter() -> Limiter:
    return Limiter([LimitDefinition.rolling(KEY, 100, 60)], manual_clock_unix_ms=START_MS)


def _lease() -> Lease:
    lim = _limiter()
    return Lease(lim.reserve([(KEY, 1)]), [(KEY, 1)])


LIM = _limiter()
LEASE = new_lease_id()

CASES: List[Case] = [
    # Limiter(...)
    ("Limiter limits int", lambda: Limiter(5), ArgumentTypeError, "limits"),  # type: ignore[arg-type]
    ("Limiter limits str", lambda: Limiter("abc"), ArgumentTypeError, "limits"),  # type: ignore[arg-type]
    ("Limiter leases_max str", lambda: Limiter(leases_max="3"), ArgumentTypeError, "leases_max"),  # type: ignore
    ("Limiter leases_max negative", lambda: Limiter(leases_max=-1), InvalidArgumentError, "leases_max"),
    ("Limiter leases_max bool", lambda: Limiter(leases_max=True), ArgumentTypeError, "leases_max"),
    ("Limiter leases_max 2**64", lambda: Limiter(leases_max=2**64), InvalidArgumentError, "leases_max"),
    ("Limiter settled float", lambda: Limiter(settled_leases_max=1.5), ArgumentTypeError,  # type: ignore
     "settled_leases_max"),
    ("Limiter failed negative", lambda: Limiter(failed_leases_max=-5), InvalidArgumentError, "failed_leases_max"),
    ("Limiter decrease_retry_ms str", lambda: Limiter(decrease_retry_ms="1"), ArgumentTypeError,  # type: ignore
     "decrease_retry_ms"),
    ("Limiter manual clock negative", lambda: Limiter(manual_clock_unix_ms=-1), InvalidArgumentError,
     "manual_clock_unix_ms"),
    ("Limiter manual clock float", lambda: Limiter(manual_clock_unix_ms=1.0), ArgumentTypeError,  # type: ignore
     "manual_clock_unix_ms"),
    ("Limiter limits_file int", lambda: Limiter(limits_file=5), ArgumentTypeError, "path"),  # type: ignore
    # reserve / complete / admin
    ("reserve int", lambda: LIM.reserve(5), ArgumentTypeError, "requirements"),  # type: ignore[arg-type]
    ("reserve negative amount", lambda: LIM.reserve([(KEY, -1)]), InvalidArgumentError, "requirements[0].amount"),
    ("reserve lease_id int", lambda: LIM.reserve([(KEY, 1)], lease_id=5), ArgumentTypeError,  # type: ignore
     "lease_id"),
    ("reserve lease_id bad", lambda: LIM.reserve([(KEY, 1)], lease_id="nope"), InvalidArgumentError, "lease_id"),
    ("reserve job_id int", lambda: LIM.reserve([(KEY, 1)], job_id=5), ArgumentTypeError, "job_id"),  # type: ignore
    ("complete None", lambda: LIM.complete(None), ArgumentTypeError, "lease_id"),  # type: ignore[arg-type]
    ("complete bad id", lambda: LIM.complete("nope"), InvalidArgumentError, "lease_id"),
    ("complete actuals int", lambda: LIM.complete(LEASE, 5), ArgumentTypeError, "actuals"),  # type: ignore
    ("define int", lambda: LIM.define(5), ArgumentTypeError, "definition"),  # type: ignore[arg-type]
    ("limit int", lambda: LIM.limit(5), ArgumentTypeError, "key"),  # type: ignore[arg-type]
    ("limit bad key", lambda: LIM.limit("bad key"), InvalidArgumentError, "key"),
    ("load_limits_file int", lambda: LIM.load_limits_file(5), ArgumentTypeError, "path"),  # type: ignore
    ("advance_clock_ms negative", lambda: LIM.advance_clock_ms(-1), InvalidArgumentError, "ms"),
    ("advance_clock_ms str", lambda: LIM.advance_clock_ms("1"), ArgumentTypeError, "ms"),  # type: ignore
    # waiting
    ("reserve_wait timeout str", lambda: LIM.reserve_wait([(KEY, 1)], timeout_s="1"), ArgumentTypeError,  # type: ignore
     "timeout_s"),
    ("reserve_wait timeout negative", lambda: LIM.reserve_wait([(KEY, 1)], timeout_s=-1), InvalidArgumentError,
     "timeout_s"),
    ("reserve_wait timeout nan", lambda: LIM.reserve_wait([(KEY, 1)], timeout_s=math.nan), InvalidArgumentError,
     "timeout_s"),
    ("areserve_wait timeout str", lambda: asyncio.run(LIM.areserve_wait([(KEY, 1)], timeout_s="1")),  # type: ignore
     ArgumentTypeError, "timeout_s"),
    ("reservation timeout inf", lambda: LIM.reservation([(KEY, 1)], timeout_s=math.inf).__enter__(),
     InvalidArgumentError, "timeout_s"),
    ("Lease.report int", lambda: _lease().report(5), ArgumentTypeError, "actuals"),  # type: ignore[arg-type]
    ("Lease.report single", lambda: _lease().report([(KEY,)]), ArgumentTypeError, "actuals[0]"),  # type: ignore
    # RemoteLimiter(...): no server needed, nothing is sent
    ("RemoteLimiter url int", lambda: RemoteLimiter(5), ArgumentTypeError, "base_url"),  # type: ignore[arg-type]
    ("RemoteLimiter url bytes", lambda: RemoteLimiter(b"http://x"), ArgumentTypeError, "base_url"),  # type: ignore
    ("RemoteLimiter url list of int", lambda: RemoteLimiter([5]), ArgumentTypeError, "base_url"),  # type: ignore
    ("RemoteLimiter url None", lambda: RemoteLimiter(None), ArgumentTypeError, "base_url"),  # type: ignore
    ("RemoteLimiter url bad", lambda: RemoteLimiter("not a url"), InvalidArgumentError, "base_urls"),
    ("RemoteLimiter no url", lambda: RemoteLimiter([]), InvalidArgumentError, "base_urls"),
    ("RemoteLimiter token int", lambda: RemoteLimiter("http://127.0.0.1:1", token=5), ArgumentTypeError,  # type: ignore
     "token"),
    ("RemoteLimiter timeout negative", lambda: RemoteLimiter("http://127.0.0.1:1", request_timeout_ms=-1),
     InvalidArgumentError, "request_timeout_ms"),
    ("RemoteLimiter connect str", lambda: RemoteLimiter("http://127.0.0.1:1", connect_timeout_ms="1"),  # type: ignore
     ArgumentTypeError, "connect_timeout_ms"),
    ("RemoteLimiter retries 2**32", lambda: RemoteLimiter("http://127.0.0.1:1", retries_max=2**32),
     InvalidArgumentError, "retries_max"),
    ("RemoteLimiter retry wait float", lambda: RemoteLimiter("http://127.0.0.1:1", retry_wait_ms_max=0.5),  # type: ignore
     ArgumentTypeError, "retry_wait_ms_max"),
]


@pytest.mark.parametrize("name,call,error,field", CASES, ids=[c[0] for c in CASES])
def test_a_bad_argument_raises_its_typed_error(name: str, call: Callable[[], Any], error: Type[Exception],
                                               field: str) -> None:
    with pytest.raises(error) as raised:
        call()
    assert type(raised.value) is error, f"{name}: {type(raised.value).__name__}: {raised.value}"
    assert raised.value.field == field, f"{name}: field {raised.value.field!r}: {raised.value}"


def test_nothing_changed_after_the_bad_arguments() -> None:
    assert LIM.limit(KEY).in_use == 0


def test_scheduler_arguments_raise_typed_errors() -> None:
    async def main() -> None:
        lim = _limiter()
        cases: List[Tuple[Callable[[], Any], Type[Exception], str]] = [
            (lambda: Scheduler(5), ArgumentTypeError, "limiter"),  # type: ignore[arg-type]
            (lambda: Scheduler(lim, workers=0), InvalidArgumentError, "workers"),
            (lambda: Scheduler(lim, workers="2"), ArgumentTypeError, "workers"),  # type: ignore[arg-type]
            (lambda: Scheduler(lim, queued_jobs_max=0), InvalidArgumentError, "queued_jobs_max"),
            (lambda: Scheduler(lim, unknown_retries_max=-1), InvalidArgumentError, "unknown_retries_max"),
        ]
        for call, error, field in cases:
            with pytest.raises(error) as raised:
                call()
            assert raised.value.field == field, raised.value
        async with Scheduler(lim) as scheduler:
            common = dict(provider="p", model="m", tenant_id="t", prompt="hi", max_tokens=10)
            for kwargs, error, field in [
                (dict(run=5), ArgumentTypeError, "run"),
                (dict(usage=5), ArgumentTypeError, "usage"),
                (dict(job_id=5), ArgumentTypeError, "job_id"),
            ]:
                run = kwargs.pop("run", lambda: asyncio.sleep(0))
                with pytest.raises(error) as raised:
                    scheduler.submit(run, **common, **kwargs)  # type: ignore[arg-type]
                assert raised.value.field == field, raised.value
            assert scheduler.queued == 0
            with pytest.raises(ArgumentTypeError):
                await scheduler.shutdown(timeout_s="1")  # type: ignore[arg-type]

    asyncio.run(main())
