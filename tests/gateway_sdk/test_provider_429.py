"""A provider 429 is passed to the client with the provider's hints, and the model
cools down: the calls behind it get the gateway's 429 without reaching the provider."""

from __future__ import annotations

import openai
import pytest

from conftest import Gateway

#: The provider's hint: long enough that the second call surely falls inside it.
RETRY_AFTER_MS = 20_000


def test_a_provider_429_is_passed_through_and_cools_the_model_down(gw: Gateway) -> None:
    client = openai.OpenAI(base_url=gw.openai_base_url, api_key=gw.api_key, max_retries=0)
    gw.fault(mode="status", status=429, retry_after_ms=RETRY_AFTER_MS, count=1, model="sim-model")

    def call() -> openai.RateLimitError:
        with pytest.raises(openai.RateLimitError) as raised:
            client.chat.completions.create(
                model="sim-model", messages=[{"role": "user", "content": "hi"}], max_tokens=1
            )
        return raised.value

    first = call()
    assert first.response.headers["retry-after-ms"] == str(RETRY_AFTER_MS)
    assert first.response.headers["retry-after"] == str(RETRY_AFTER_MS // 1000)
    gw.require_gateway()
    calls = gw.sim_stats()["calls"]
    second = call()
    assert gw.sim_stats()["calls"] == calls, "a call during the cooldown reached the provider"
    hint_ms = int(second.response.headers["retry-after-ms"])
    assert 0 < hint_ms <= RETRY_AFTER_MS
    assert second.body is not None
    # Other models are not cooled down.
    ok = client.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}], max_tokens=1)
    assert ok.usage.completion_tokens == 1
