"""The openai SDK through the gateway: sync, async and streaming calls of chat
completions, embeddings and responses, each reconciled to the provider's usage."""

from __future__ import annotations

import asyncio

import openai
import pytest

from conftest import TENANT_DAILY, Gateway, assert_charged, model_key, tokens

SYSTEM = "You answer briefly."
QUESTION = "What is the capital of France, and why?"
TPM = model_key("openai", "gpt-4o-mini", "tpm")
RPM = model_key("openai", "gpt-4o-mini", "rpm")
CONCURRENCY = model_key("openai", "gpt-4o-mini", "concurrency")


def client(gw: Gateway) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.openai_base_url, api_key=gw.api_key, max_retries=0)


def messages() -> list[dict[str, str]]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}]


PROMPT = tokens(SYSTEM, QUESTION)


def test_chat_sync_usage_is_the_providers_and_is_what_the_limits_keep(gw: Gateway) -> None:
    before = gw.usage_of([TPM, RPM, CONCURRENCY, TENANT_DAILY])
    completion = client(gw).chat.completions.create(
        model="gpt-4o-mini", messages=messages(), max_tokens=40, extra_body={"sim_output_tokens": 7}
    )
    assert completion.usage is not None
    assert (completion.usage.prompt_tokens, completion.usage.completion_tokens) == (PROMPT, 7)
    assert completion.choices[0].finish_reason == "stop"
    assert completion.choices[0].message.content == "the cat sat off her red mat "
    assert_charged(gw, before, {TPM: PROMPT + 7, RPM: 1, CONCURRENCY: 0, TENANT_DAILY: PROMPT + 7})


def test_chat_async_calls_each_reconcile(gw: Gateway) -> None:
    before = gw.usage_of([TPM, RPM])

    async def run() -> list[int]:
        async with openai.AsyncOpenAI(base_url=gw.openai_base_url, api_key=gw.api_key, max_retries=0) as aclient:
            calls = [
                aclient.chat.completions.create(model="gpt-4o-mini", messages=messages(), max_tokens=n)
                for n in (1, 2, 3, 4, 5)
            ]
            return [c.usage.completion_tokens for c in await asyncio.gather(*calls)]

    assert asyncio.run(run()) == [1, 2, 3, 4, 5]
    assert_charged(gw, before, {TPM: 5 * PROMPT + 15, RPM: 5})


@pytest.mark.parametrize("include_usage", [True, False])
def test_chat_stream_passes_chunks_and_reconciles_from_the_streams_usage(gw: Gateway, include_usage: bool) -> None:
    before = gw.usage_of([TPM, RPM, CONCURRENCY])
    extra = {"stream_options": {"include_usage": True}} if include_usage else {}
    stream = client(gw).chat.completions.create(
        model="gpt-4o-mini", messages=messages(), max_tokens=9, stream=True, **extra
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "the cat sat off her red mat and ate "
    usages = [c.usage for c in chunks if c.usage is not None]
    if include_usage:
        # The client asked: one usage chunk, last, with no choices.
        assert len(usages) == 1 and chunks[-1].choices == []
        assert (usages[0].prompt_tokens, usages[0].completion_tokens) == (PROMPT, 9)
    else:
        # The gateway asked the provider for usage and must not pass that chunk on.
        assert usages == [] and all(c.choices for c in chunks)
    assert_charged(gw, before, {TPM: PROMPT + 9, RPM: 1, CONCURRENCY: 0})


def test_embeddings_charge_the_inputs(gw: Gateway) -> None:
    key = model_key("openai", "text-embedding-3-small", "tpm")
    before = gw.usage_of([key])
    # Words whose count is the same by the simulator's rule and by o200k_base (one
    # token per three letters and a space): embeddings have no output bound to
    # absorb a difference, and the gateway reserves its own count.
    inputs = ["the cat sat off her red mat", "and ate two big fig for tea now"]
    result = client(gw).embeddings.create(model="text-embedding-3-small", input=inputs)
    assert [d.index for d in result.data] == [0, 1]
    assert all(len(d.embedding) == 16 for d in result.data)
    assert result.usage.prompt_tokens == tokens(*inputs)
    assert_charged(gw, before, {key: tokens(*inputs)})


def test_responses_sync_and_stream_reconcile(gw: Gateway) -> None:
    before = gw.usage_of([TPM, RPM])
    response = client(gw).responses.create(
        model="gpt-4o-mini", instructions=SYSTEM, input=QUESTION, max_output_tokens=30,
        extra_body={"sim_output_tokens": 4},
    )
    assert response.usage is not None
    assert (response.usage.input_tokens, response.usage.output_tokens) == (PROMPT, 4)
    assert response.output_text == "the cat sat off "
    events = list(client(gw).responses.create(
        model="gpt-4o-mini", instructions=SYSTEM, input=QUESTION, max_output_tokens=30, stream=True,
        extra_body={"sim_output_tokens": 6},
    ))
    assert [e.type for e in events][0] == "response.created"
    assert events[-1].type == "response.completed"
    assert events[-1].response.usage.output_tokens == 6
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == "the cat sat off her red "
    assert_charged(gw, before, {TPM: 2 * PROMPT + 10, RPM: 2})


def test_a_web_search_is_billed_as_input_and_charged_as_the_provider_counts_it(gw: Gateway) -> None:
    # OpenAI bills a web search's content as 8,000 input tokens of the call
    # (https://platform.openai.com/docs/pricing#built-in-tools): more than the call reserved.
    before = gw.usage_of([TPM, TENANT_DAILY])
    response = client(gw).responses.create(
        model="gpt-4o-mini", input=QUESTION, tools=[{"type": "web_search"}], max_output_tokens=30,
        extra_body={"sim_output_tokens": 3},
    )
    assert [item.type for item in response.output] == ["web_search_call", "message"]
    assert response.usage is not None
    searched = tokens(QUESTION) + 8_000
    assert (response.usage.input_tokens, response.usage.output_tokens) == (searched, 3)
    assert response.output_text == "the cat sat "
    assert_charged(gw, before, {TPM: searched + 3, TENANT_DAILY: searched + 3})


def test_models_lists_the_configured_models(gw: Gateway) -> None:
    ids = {m.id for m in client(gw).models.list()}
    assert {"gpt-4o-mini", "gpt-4o", "text-embedding-3-small"} <= ids
    if gw.is_gateway:
        # The gateway lists what it is configured with, not what the provider has.
        assert "claude-sonnet-4-5" not in ids
