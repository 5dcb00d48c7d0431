"""Provider profiles from Python (``llm_limits(..., profile=True)``) and waits that
wake as soon as capacity frees in the process."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import pytest

from llm_ratelimiter import (
    InvalidArgumentError, Limiter, LimitDefinition, LlmCall, ReservationTimeoutError, llm_limits,
)


def test_openai_profile_quantizes_and_reserves_its_estimate() -> None:
    # OpenAI tier 1 gpt-4o-mini: 500 RPM, 200,000 TPM; "60,000 requests/minute may be
    # enforced as 1,000 requests/second" (docs/provider-profiles.md).
    limits = llm_limits("openai", "py-mini", rpm=500, tpm=200_000, profile=True)
    assert [(d.key, d.capacity, d.window_seconds, d.window_margin_ms) for d in limits] == [
        ("global:llm:openai:py-mini:rpm", 8, 1, 10),
        ("global:llm:openai:py-mini:tpm", 16_666, 5, 50),
    ]
    call = LlmCall.create("openai", "py-mini", "t", "word " * 100, 400, prompt_tokens=100)
    # OpenAI counts 500 characters as 125 tokens, more than the exact 100: reserve its count.
    assert [r.amount for r in call.requirements()] == [1, 525]
    assert [a.actual_amount for a in call.actuals(103)] == [525], "OpenAI keeps its estimate"


def test_anthropic_profile_splits_input_and_output() -> None:
    limits = llm_limits("anthropic", "py-sonnet", rpm=4_000, input_tpm=2_000_000, output_tpm=400_000,
                        concurrency=8, profile=True)
    assert [(d.key.rsplit(":", 1)[1], d.kind) for d in limits] == [
        ("rpm", "bucket"), ("itpm", "bucket"), ("otpm", "bucket"), ("concurrency", "concurrency")]
    call = LlmCall.create("anthropic", "py-sonnet", "t", "x" * 40, 300, prompt_tokens=10, daily_budget=True)
    assert [(r.key.rsplit(":", 1)[1], r.amount) for r in call.requirements()] == [
        ("rpm", 1), ("itpm", 10), ("otpm", 300), ("concurrency", 1), ("daily_tokens", 310)]
    assert [(a.key.rsplit(":", 1)[1], a.actual_amount) for a in call.actuals(50)] == [
        ("itpm", 10), ("otpm", 40), ("daily_tokens", 50)]
    # A manual clock: no refill second passes between the call and the report.
    limiter = Limiter(limits, manual_clock_unix_ms=1_700_000_000_000)
    with limiter.llm_call("anthropic", "py-sonnet", "t", "x" * 40, 300, prompt_tokens=10) as lease:
        lease.record_usage({"input_tokens": 10, "output_tokens": 40})
    assert limiter.limit("global:llm:anthropic:py-sonnet:otpm").in_use == 40, "taken, 260 given back"
    limiter.advance_clock_ms(1_000)
    assert limiter.limit("global:llm:anthropic:py-sonnet:otpm").in_use == 0, "a second's refill is 6,666"


def test_a_bucket_definition_grants_its_burst_and_one_without_burst_is_refused() -> None:
    bucket = LimitDefinition.bucket("py:bucket", 6_000, 60, unit="tokens")
    assert json.loads(bucket.to_json())["kind"] == "bucket"
    limiter = Limiter([bucket], manual_clock_unix_ms=1_700_000_000_000)
    # 6,000 a minute keeps 6,000 less a second's refill and the 240 ms margin's (124).
    burst = 6_000 - 124
    lease = limiter.reserve([("py:bucket", burst)])
    assert limiter.limit("py:bucket").in_use == burst
    never = limiter.reserve([("py:bucket", burst + 1)])
    assert not never and never.denial.reason == "exceeds_capacity", "above the burst: denied for ever"
    limiter.complete(lease.lease_id, [("py:bucket", 100)])
    assert limiter.limit("py:bucket").in_use == 100, "the unused part comes back at once"
    with pytest.raises(InvalidArgumentError):
        Limiter([LimitDefinition.bucket("py:tiny", 1, 1)])


def _full_window_limiter() -> Limiter:
    return Limiter([LimitDefinition.rolling("tokens", 1_000, 60)])


def test_a_wait_is_woken_by_a_complete_that_reconciles_down() -> None:
    limiter = _full_window_limiter()
    first = limiter.reserve([("tokens", 900)])
    # The next 500 fit only once the first reconciles to 10; its hint is a whole window
    # (about 60 s), past this wait's deadline: the old wait raised at once.
    threading.Timer(0.2, lambda: limiter.complete(first.lease_id, [("tokens", 10)])).start()
    with limiter.reservation([("tokens", 500)], timeout_s=30) as lease:
        assert lease.lease_id != first.lease_id
    assert limiter.limit("tokens").in_use == 510


def test_an_async_wait_is_woken_by_a_complete() -> None:
    async def main() -> None:
        limiter = _full_window_limiter()
        first = await limiter.areserve([("tokens", 900)])

        async def complete_later() -> None:
            await asyncio.sleep(0.2)
            await limiter.acomplete(first.lease_id, [("tokens", 10)])

        task = asyncio.ensure_future(complete_later())
        async with limiter.areservation([("tokens", 500)], timeout_s=30):
            pass
        await task

    asyncio.run(main())


def test_a_hint_past_the_deadline_raises_at_once_when_nothing_held_can_free() -> None:
    limiter = _full_window_limiter()
    done = limiter.reserve([("tokens", 900)])
    limiter.complete(done.lease_id)  # Complete, but its tokens stay in the window.
    started = time.monotonic()
    with pytest.raises(ReservationTimeoutError) as info:
        with limiter.reservation([("tokens", 500)], timeout_s=30):
            pass
    assert info.value.denial.retry_after_ms > 30_000
    # At once, not after the 30 s timeout (20 s of slack for a loaded machine).
    assert time.monotonic() - started < 20
