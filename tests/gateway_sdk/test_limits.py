"""Limits through the gateway: concurrency never exceeded under 64 concurrent
streams, a cancelled stream's slot released at once, upstream failures released
and answered in the provider's shape."""

from __future__ import annotations

import asyncio

import httpx
import openai
import pytest

from conftest import NARROW_CONCURRENCY, Gateway, model_key, tokens

QUESTION = "Count slowly to twenty."
NARROW = "gpt-4o"
NARROW_CONCURRENCY_KEY = model_key("openai", NARROW, "concurrency")
NARROW_TPM = model_key("openai", NARROW, "tpm")
STREAMS = 64


def client(gw: Gateway) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.openai_base_url, api_key=gw.api_key, max_retries=0)


def test_64_concurrent_streams_never_exceed_the_models_concurrency(gw: Gateway) -> None:
    gw.require_gateway()
    gw.reset_sim_stats()
    throttled_before = gw.sim_stats()["counts"]["throttled"]

    async def one(aclient: openai.AsyncOpenAI) -> str:
        stream = await aclient.chat.completions.create(
            model=NARROW, messages=[{"role": "user", "content": QUESTION}], max_tokens=20, stream=True
        )
        return "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])

    async def run() -> list[str]:
        async with openai.AsyncOpenAI(base_url=gw.openai_base_url, api_key=gw.api_key, max_retries=0) as aclient:
            return await asyncio.gather(*[one(aclient) for _ in range(STREAMS)])

    texts = asyncio.run(run())
    assert len(texts) == STREAMS and all(len(t) == 20 * 4 for t in texts)
    stats = gw.sim_stats()
    # Queued, never past the limit: the provider never served more at once.
    assert 1 <= stats["in_flight_max"] <= NARROW_CONCURRENCY, stats
    assert stats["counts"]["throttled"] == throttled_before
    gw.wait_in_use(NARROW_CONCURRENCY_KEY, 0)


def test_a_cancelled_stream_releases_its_slot_at_once(gw: Gateway) -> None:
    before = gw.usage_of([NARROW_TPM])
    stream = client(gw).chat.completions.create(
        model=NARROW, messages=[{"role": "user", "content": QUESTION}], max_tokens=4000, stream=True
    )
    seen = 0
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            seen += 1
        if seen == 3:
            break
    stream.close()
    if gw.is_gateway:
        gw.wait_in_use(NARROW_CONCURRENCY_KEY, 0)
        # Never less than the provider can have counted: the prompt and what it wrote.
        charged = gw.in_use(NARROW_TPM) - before[NARROW_TPM]
        assert charged >= tokens(QUESTION) + seen
    else:
        gw.wait_sim_idle()
    # The 4000-token call (8 s at the simulator's pace) no longer holds anything.
    completion = client(gw).chat.completions.create(
        model=NARROW, messages=[{"role": "user", "content": QUESTION}], max_tokens=1
    )
    assert completion.usage.completion_tokens == 1


def test_an_upstream_error_is_answered_in_the_providers_shape_and_released(gw: Gateway) -> None:
    gw.fault(mode="status", status=500, count=1, model="gpt-4o-mini")
    with pytest.raises(openai.InternalServerError) as raised:
        client(gw).chat.completions.create(
            model="gpt-4o-mini", messages=[{"role": "user", "content": QUESTION}], max_tokens=5
        )
    assert raised.value.status_code in (500, 502)
    # The provider's error shape: the SDK found {"error": {"message": ...}}.
    assert isinstance(raised.value.body, dict) and raised.value.body.get("message"), raised.value.body
    if gw.is_gateway:
        gw.wait_in_use(model_key("openai", "gpt-4o-mini", "concurrency"), 0)


def test_a_stream_dropped_by_the_provider_fails_the_client_and_is_released(gw: Gateway) -> None:
    gw.fault(mode="drop", after_events=4, count=1, model="gpt-4o-mini")
    with pytest.raises((openai.APIError, httpx.HTTPError)):
        stream = client(gw).chat.completions.create(
            model="gpt-4o-mini", messages=[{"role": "user", "content": QUESTION}], max_tokens=50, stream=True
        )
        chunks = list(stream)
        # A stream that ends without its finish reason and [DONE] is a failure too.
        if not any(c.choices and c.choices[0].finish_reason for c in chunks):
            raise httpx.RemoteProtocolError("the stream ended early")
    if gw.is_gateway:
        gw.wait_in_use(model_key("openai", "gpt-4o-mini", "concurrency"), 0)
