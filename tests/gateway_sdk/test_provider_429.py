"""A provider 429 is passed to the client with the provider's hints, and the model
cools down: the calls behind it get the gateway's 429 without reaching the
provider, until the provider's hint has passed."""

from __future__ import annotations

import time

import openai
import pytest

from conftest import SETTLE_TIMEOUT_S, Gateway

#: The provider's hint: long enough that the second call surely falls inside it,
#: short enough to wait out.
RETRY_AFTER_MS = 3_000
MODEL = "sim-model"


def client(gw: Gateway) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.openai_base_url, api_key=gw.api_key, max_retries=0)


def call(gw: Gateway) -> openai.ChatCompletion:
    return client(gw).chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=1)


def refused(gw: Gateway) -> openai.RateLimitError:
    with pytest.raises(openai.RateLimitError) as raised:
        call(gw)
    return raised.value


def provider_429(gw: Gateway) -> None:
    """Arms one provider 429 for the model and sees it passed through."""
    gw.fault(mode="status", status=429, retry_after_ms=RETRY_AFTER_MS, count=1, model=MODEL)
    first = refused(gw)
    assert first.response.headers["retry-after-ms"] == str(RETRY_AFTER_MS)
    assert first.response.headers["retry-after"] == str(RETRY_AFTER_MS // 1000)


def wait_until_served(gw: Gateway) -> float:
    """Calls until one is served; returns when, on the monotonic clock."""
    deadline = time.monotonic() + RETRY_AFTER_MS / 1000 + SETTLE_TIMEOUT_S
    while True:
        try:
            call(gw)
            return time.monotonic()
        except openai.RateLimitError:
            assert time.monotonic() < deadline, "the model stayed cooled down past the provider's hint"
            time.sleep(0.1)


def test_a_provider_429_is_passed_through_and_cools_the_model_down(gw: Gateway) -> None:
    started = time.monotonic()
    provider_429(gw)
    gw.require_gateway()
    calls = gw.sim_stats()["calls"]
    second = refused(gw)
    assert gw.sim_stats()["calls"] == calls, "a call during the cooldown reached the provider"
    assert int(second.response.headers["retry-after-ms"]) > 0
    # Other models are not cooled down.
    other = client(gw).chat.completions.create(
        model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}], max_tokens=1
    )
    assert other.usage.completion_tokens == 1
    # The cooldown ends with the provider's hint, not with the one-minute window.
    assert wait_until_served(gw) - started >= RETRY_AFTER_MS / 1000


def test_the_cooldowns_429_hints_no_longer_than_the_provider(gw: Gateway) -> None:
    gw.require_gateway()
    provider_429(gw)
    try:
        hint_ms = int(refused(gw).response.headers["retry-after-ms"])
    finally:
        wait_until_served(gw)
    assert 0 < hint_ms <= RETRY_AFTER_MS
