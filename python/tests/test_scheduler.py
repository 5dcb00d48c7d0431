"""The asyncio scheduler and the context managers."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from llm_ratelimiter import (
    JobNotRunError,
    LimitDefinition,
    Limiter,
    QueueFullError,
    ReservationDeniedError,
    ReservationTimeoutError,
    Scheduler,
    llm_limits,
)


def two_models(concurrency_a: int = 1) -> Limiter:
    return Limiter(llm_limits("p", "a", rpm=10_000, tpm=1_000_000, concurrency=concurrency_a)
                   + llm_limits("p", "b", rpm=10_000, tpm=1_000_000, concurrency=10))


def job(**kw: object) -> dict:
    return dict(dict(provider="p", model="a", tenant_id="t1", prompt="x", max_tokens=10, prompt_tokens=1), **kw)


def test_a_saturated_model_does_not_hold_up_another() -> None:
    async def main() -> None:
        limiter = two_models(concurrency_a=1)
        release = asyncio.Event()
        done_b: list = []

        async def slow() -> int:
            await release.wait()
            return 5

        async def fast() -> int:
            done_b.append(time.monotonic())
            return 3

        async with Scheduler(limiter, workers=4) as s:
            a_jobs = [s.submit(slow, **job()) for _ in range(3)]
            b_jobs = [s.submit(fast, **job(model="b")) for _ in range(5)]
            b_results = await asyncio.wait_for(asyncio.gather(*b_jobs), 5)
            assert [r.used_tokens for r in b_results] == [3] * 5
            assert not any(j.done() for j in a_jobs)
            release.set()
            a_results = await asyncio.wait_for(asyncio.gather(*a_jobs), 10)
        assert all(r.used_tokens == 5 for r in a_results)
        assert limiter.limit("global:llm:p:a:concurrency").in_use == 0
        assert limiter.limit("global:llm:p:a:tpm").in_use == 15

    asyncio.run(main())


def test_tenants_take_turns() -> None:
    async def main() -> None:
        limiter = two_models(concurrency_a=1)
        order: list = []

        def call(tenant: str):
            async def run() -> int:
                order.append(tenant)
                await asyncio.sleep(0.005)
                return 1
            return run

        async with Scheduler(limiter, workers=1) as s:
            jobs = [s.submit(call("big"), **job(tenant_id="big")) for _ in range(6)]
            jobs += [s.submit(call("small"), **job(tenant_id="small")) for _ in range(2)]
            await asyncio.gather(*jobs)
        assert order[:4] == ["big", "small", "big", "small"], order

    asyncio.run(main())


def test_complete_runs_after_an_exception_and_a_cancellation() -> None:
    async def main() -> None:
        limiter = two_models(concurrency_a=2)
        started = asyncio.Event()

        async def boom() -> int:
            raise RuntimeError("provider failed")

        async def hang() -> int:
            started.set()
            await asyncio.sleep(3600)
            return 0

        async with Scheduler(limiter, workers=2) as s:
            with pytest.raises(RuntimeError):
                await s.submit(boom, **job())
            hanging = s.submit(hang, **job())
            await started.wait()
            assert limiter.limit("global:llm:p:a:concurrency").in_use == 1
            hanging.cancel()
            for _ in range(100):
                if limiter.limit("global:llm:p:a:concurrency").in_use == 0:
                    break
                await asyncio.sleep(0.01)
        assert limiter.limit("global:llm:p:a:concurrency").in_use == 0
        # Both failures kept their tokens at the reserved bound: the charge is unknown.
        assert limiter.limit("global:llm:p:a:tpm").in_use == 22

    asyncio.run(main())


def test_never_fitting_jobs_fail_and_denied_jobs_wait() -> None:
    async def main() -> None:
        limiter = Limiter(llm_limits("p", "a", rpm=1, tpm=100, concurrency=5, window_seconds=1))

        async def run() -> int:
            return 1

        async with Scheduler(limiter, workers=2) as s:
            with pytest.raises(ReservationDeniedError) as info:
                await s.submit(run, **job(max_tokens=500))
            assert info.value.denial.reason == "exceeds_capacity"
            started = time.monotonic()
            results = await asyncio.wait_for(asyncio.gather(s.submit(run, **job()), s.submit(run, **job())), 5)
            assert time.monotonic() - started >= 0.9  # the second waited for the rpm window
            assert sorted(r.attempts for r in results)[0] == 1 and sorted(r.attempts for r in results)[1] >= 2

    asyncio.run(main())


def test_bounded_queue_and_shutdown_report() -> None:
    async def main() -> None:
        limiter = two_models(concurrency_a=1)
        gate = asyncio.Event()

        async def blocked() -> int:
            await gate.wait()
            return 1

        s = Scheduler(limiter, workers=1, queued_jobs_max=3)
        running = s.submit(blocked, **job(job_id="running"))
        await asyncio.sleep(0.05)
        waiting = [s.submit(blocked, **job(job_id=f"w{i}")) for i in range(3)]
        with pytest.raises(QueueFullError):
            s.submit(blocked, **job())
        report = await s.shutdown(timeout_s=0.2)
        assert report.not_run == ["w0", "w1", "w2"] and report.aborted == ["running"]
        for w in waiting:
            with pytest.raises(JobNotRunError):
                await w
        assert running.cancelled()
        assert limiter.limit("global:llm:p:a:concurrency").in_use == 0

    asyncio.run(main())


def test_reservation_waits_while_denied_then_completes() -> None:
    limiter = Limiter([LimitDefinition.concurrency("slot", 1, 60)])
    first = limiter.reserve([("slot", 1)])
    threading.Timer(0.2, lambda: limiter.complete(first.lease_id)).start()
    with limiter.reservation([("slot", 1)], timeout_s=5) as lease:
        assert lease.lease_id != first.lease_id
        assert limiter.limit("slot").in_use == 1
    assert limiter.limit("slot").in_use == 0
    held = limiter.reserve([("slot", 1)])
    with pytest.raises(ReservationTimeoutError) as info:
        with limiter.reservation([("slot", 1)], timeout_s=0.01):
            pass
    assert info.value.denial.reason == "insufficient_capacity"
    limiter.complete(held.lease_id)


def test_async_reservation_completes_after_an_exception_and_a_cancellation() -> None:
    async def main() -> None:
        limiter = Limiter(llm_limits("p", "a", rpm=100, tpm=1_000, concurrency=1))
        with pytest.raises(KeyError):
            async with limiter.allm_call("p", "a", "t", "hello", 10, prompt_tokens=2):
                raise KeyError("x")
        assert limiter.limit("global:llm:p:a:concurrency").in_use == 0

        async def held() -> None:
            async with limiter.allm_call("p", "a", "t", "hello", 10, prompt_tokens=2) as lease:
                lease.record_usage({"total_tokens": 7})
                await asyncio.sleep(3600)

        task = asyncio.ensure_future(held())
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert limiter.limit("global:llm:p:a:concurrency").in_use == 0
        assert limiter.limit("global:llm:p:a:tpm").in_use == 12 + 7

    asyncio.run(main())


def test_classes_share_freed_capacity_by_their_shares() -> None:
    async def main() -> None:
        limiter = two_models(concurrency_a=1)
        order: list = []

        def call(name: str):
            async def run() -> int:
                order.append(name)
                await asyncio.sleep(0.001)
                return 1
            return run

        classes = [("interactive", 4), ("batch", 1)]
        async with Scheduler(limiter, workers=1, classes=classes) as s:
            # Batch first and from more tenants: neither earns it more turns.
            jobs = [s.submit(call("batch"), **job(tenant_id=f"etl{i % 3}"), job_class="batch") for i in range(60)]
            jobs += [s.submit(call("interactive"), **job(tenant_id="web"), job_class="interactive")
                     for _ in range(60)]
            await asyncio.gather(*jobs)
        first = order[1:51]  # The first take ran before the interactive jobs were submitted.
        assert first.count("interactive") == 40, first
        assert len(order) == 120

    asyncio.run(main())


def test_a_job_without_a_class_runs_in_the_lowest_and_an_unknown_class_is_refused() -> None:
    from llm_ratelimiter import InvalidArgumentError

    async def main() -> None:
        limiter = two_models(concurrency_a=1)
        order: list = []

        def call(name: str):
            async def run() -> int:
                order.append(name)
                await asyncio.sleep(0.001)
                return 1
            return run

        async with Scheduler(limiter, workers=1, classes=[("interactive", 4), ("batch", 1)]) as s:
            with pytest.raises(InvalidArgumentError, match="job_class"):
                s.submit(call("x"), **job(), job_class="urgent")
            jobs = [s.submit(call("unnamed"), **job(tenant_id="etl")) for _ in range(20)]
            jobs += [s.submit(call("interactive"), **job(tenant_id="web"), job_class="interactive")
                     for _ in range(20)]
            await asyncio.gather(*jobs)
        assert order[1:11].count("unnamed") <= 3, order

    asyncio.run(main())


@pytest.mark.parametrize("classes, message", [
    ([("a", 0)], "share"),
    ([("a", 1001)], "share"),
    ([("a", 1), ("a", 2)], "twice"),
    ([], "1..=16"),
    ([("", 1)], "name"),
])
def test_bad_classes_are_refused_by_name(classes: list, message: str) -> None:
    from llm_ratelimiter import InvalidArgumentError

    async def main() -> None:
        with pytest.raises(InvalidArgumentError, match=message):
            Scheduler(two_models(), classes=classes)

    asyncio.run(main())
