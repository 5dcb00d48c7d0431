"""The remote limiter against a real ratelimiterd."""

from __future__ import annotations

import asyncio

import pytest

from conftest import free_port
from llm_ratelimiter import InvalidArgumentError, LimiterUnavailableError, RemoteLimiter, llm_limits, new_lease_id

TPM = "global:llm:r:m:tpm"
CONC = "global:llm:r:m:concurrency"


def test_admin_reserve_complete_sync(server_url: str) -> None:
    limiter = RemoteLimiter(server_url)
    reports = limiter.define_many(llm_limits("r", "m", rpm=100, tpm=1_000, concurrency=1))
    assert [r.status for r in reports] == ["active"] * 3
    assert {"global:llm:r:m:rpm", TPM, CONC} <= {r.definition.key for r in limiter.limits()}
    assert limiter.limit("global:llm:nothing:here:rpm") is None
    lease = new_lease_id()
    first = limiter.reserve([(TPM, 600), (CONC, 1)], lease_id=lease)
    again = limiter.reserve([(TPM, 600), (CONC, 1)], lease_id=lease)  # idempotent retry
    assert first.allowed and again.reserved_at_unix_ms == first.reserved_at_unix_ms
    denied = limiter.reserve([(TPM, 1), (CONC, 1)])
    assert denied.denial.reason == "insufficient_capacity" and denied.denial.key == CONC
    assert denied.denial.retry_after_ms > 0
    limiter.complete(lease, [(TPM, 100)])
    assert limiter.limit(TPM).in_use == 100 and limiter.limit(CONC).in_use == 0


def test_asyncio_twins(server_url: str) -> None:
    async def main() -> None:
        limiter = RemoteLimiter(server_url)
        limiter.define_many(llm_limits("r", "async", rpm=1_000, tpm=100_000, concurrency=50))
        reservations = await asyncio.gather(
            *[limiter.areserve([("global:llm:r:async:concurrency", 1)]) for _ in range(60)]
        )
        granted = [r for r in reservations if r.allowed]
        assert len(granted) == 50
        await asyncio.gather(*[limiter.acomplete(r.lease_id) for r in granted])
        assert limiter.limit("global:llm:r:async:concurrency").in_use == 0
        async with limiter.allm_call("r", "async", "acme", "hi", 10, prompt_tokens=1) as lease:
            lease.record_usage({"prompt_tokens": 1, "completion_tokens": 4})
        assert (await limiter.alimits())

    asyncio.run(main())


def test_an_unreachable_server_is_a_retryable_error_with_the_lease_id() -> None:
    limiter = RemoteLimiter(f"http://127.0.0.1:{free_port()}", retries_max=1, retry_wait_ms_max=10)
    lease = new_lease_id()
    with pytest.raises(LimiterUnavailableError) as info:
        limiter.reserve([(TPM, 1)], lease_id=lease)
    assert info.value.retryable and info.value.lease_id == lease and info.value.retry_after_ms > 0

    async def main() -> None:
        with pytest.raises(LimiterUnavailableError) as async_info:
            await limiter.areserve([(TPM, 1)], lease_id=lease)
        assert async_info.value.lease_id == lease

    asyncio.run(main())


def test_a_dead_first_server_fails_over_to_the_live_one_with_the_same_lease_id(server_url: str) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    fleet = RemoteLimiter([dead, server_url], retries_max=1, retry_wait_ms_max=10)
    assert fleet.base_urls == (dead, server_url) and fleet.base_url == dead
    fleet.define_many(llm_limits("r", "fleet", rpm=100, tpm=1_000, concurrency=5))  # admin calls fail over
    lease = new_lease_id()
    reservation = fleet.reserve([("global:llm:r:fleet:concurrency", 1)], lease_id=lease)
    assert reservation.allowed
    # The live server holds that very lease: a retry there is answered with the original.
    live = RemoteLimiter(server_url)
    again = live.reserve([("global:llm:r:fleet:concurrency", 1)], lease_id=lease)
    assert again.reserved_at_unix_ms == reservation.reserved_at_unix_ms
    assert live.limit("global:llm:r:fleet:concurrency").in_use == 1
    fleet.complete(lease)
    assert live.limit("global:llm:r:fleet:concurrency").in_use == 0


def test_without_retries_a_dead_first_server_is_not_skipped(server_url: str) -> None:
    limiter = RemoteLimiter([f"http://127.0.0.1:{free_port()}", server_url], retries_max=0)
    with pytest.raises(LimiterUnavailableError):
        limiter.limits()


def test_bad_server_lists_are_refused() -> None:
    with pytest.raises(InvalidArgumentError) as info:
        RemoteLimiter([])
    assert info.value.field == "base_urls"
    with pytest.raises(InvalidArgumentError):
        RemoteLimiter(["http://127.0.0.1:1", "https://127.0.0.1:2"])
    with pytest.raises(InvalidArgumentError):
        RemoteLimiter([f"http://127.0.0.1:{port}" for port in range(1, 18)])
