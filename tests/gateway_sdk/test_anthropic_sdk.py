"""The anthropic SDK through the gateway: sync, async and streaming messages, input
and output tokens reconciled on their own limits; count_tokens forwarded unlimited."""

from __future__ import annotations

import asyncio

import anthropic

from conftest import TENANT_DAILY, Gateway, assert_charged, model_key, tokens

MODEL = "claude-haiku-4-5"
SYSTEM = "You are terse."
QUESTION = "Name three primary colours."
PROMPT = tokens(SYSTEM, QUESTION)
INPUT = model_key("anthropic", MODEL, "input_tpm")
OUTPUT = model_key("anthropic", MODEL, "output_tpm")
RPM = model_key("anthropic", MODEL, "rpm")
CONCURRENCY = model_key("anthropic", MODEL, "concurrency")


def client(gw: Gateway) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gw.base_url, api_key=gw.api_key, max_retries=0)


def test_messages_sync_reconciles_input_and_output(gw: Gateway) -> None:
    before = gw.usage_of([INPUT, OUTPUT, RPM, CONCURRENCY, TENANT_DAILY])
    message = client(gw).messages.create(
        model=MODEL, system=SYSTEM, max_tokens=50, messages=[{"role": "user", "content": QUESTION}],
        extra_body={"sim_output_tokens": 5},
    )
    assert (message.usage.input_tokens, message.usage.output_tokens) == (PROMPT, 5)
    assert message.stop_reason == "end_turn"
    assert message.content[0].text == "the cat sat off her "
    assert_charged(gw, before, {INPUT: PROMPT, OUTPUT: 5, RPM: 1, CONCURRENCY: 0, TENANT_DAILY: PROMPT + 5})


def test_messages_async_calls_each_reconcile(gw: Gateway) -> None:
    before = gw.usage_of([INPUT, OUTPUT])

    async def run() -> list[int]:
        async with anthropic.AsyncAnthropic(base_url=gw.base_url, api_key=gw.api_key, max_retries=0) as aclient:
            calls = [
                aclient.messages.create(model=MODEL, system=SYSTEM, max_tokens=n,
                                        messages=[{"role": "user", "content": QUESTION}])
                for n in (2, 4, 6)
            ]
            return [m.usage.output_tokens for m in await asyncio.gather(*calls)]

    assert asyncio.run(run()) == [2, 4, 6]
    assert_charged(gw, before, {INPUT: 3 * PROMPT, OUTPUT: 12})


def test_messages_stream_takes_the_last_cumulative_output_count(gw: Gateway) -> None:
    before = gw.usage_of([INPUT, OUTPUT, CONCURRENCY])
    with client(gw).messages.stream(
        model=MODEL, system=SYSTEM, max_tokens=64, messages=[{"role": "user", "content": QUESTION}],
        extra_body={"sim_output_tokens": 8},
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == "the cat sat off her red mat and "
    assert (final.usage.input_tokens, final.usage.output_tokens) == (PROMPT, 8)
    # message_start says 1 output token, message_delta 8 in all: 8, not 9.
    assert_charged(gw, before, {INPUT: PROMPT, OUTPUT: 8, CONCURRENCY: 0})


def test_raw_stream_events_pass_through_in_order(gw: Gateway) -> None:
    events = list(client(gw).messages.create(
        model=MODEL, max_tokens=3, stream=True, messages=[{"role": "user", "content": QUESTION}],
    ))
    kinds = [e.type for e in events]
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
    assert kinds.count("content_block_delta") == 3


def test_count_tokens_is_forwarded_and_not_limited(gw: Gateway) -> None:
    before = gw.usage_of([INPUT, RPM])
    counted = client(gw).messages.count_tokens(
        model=MODEL, system=SYSTEM, messages=[{"role": "user", "content": QUESTION}]
    )
    assert counted.input_tokens == PROMPT
    assert_charged(gw, before, {INPUT: 0, RPM: 0})
