"""Counting as the provider counts, through the real SDKs: an image reserved and
charged by the model's rule (sized from the image's own header), a tenant's budget
charged what Anthropic bills (cache reads included) while the model's input limit
is not, and Claude prompts reserved by the calibrated estimate once the provider's
reports are in (docs/gateway.md, "Counting", "Calibration", "Reconciling")."""

from __future__ import annotations

import base64
import re
import struct

import anthropic
import openai

from conftest import TENANT_DAILY, Gateway, http, model_key

#: gpt-4o-mini's bill for a 1,024 x 1,024 image: 2,833 + 4 tiles x 5,667 (OpenAI's table).
IMAGE_TOKENS = 2_833 + 4 * 5_667


def png_data_url(width: int, height: int) -> str:
    """A PNG's signature and header chunk: all that is read of it for its size."""
    header = b"\x89PNG\r\n\x1a\n" + struct.pack(">I4sIIBBBBB", 13, b"IHDR", width, height, 8, 6, 0, 0, 0)
    return "data:image/png;base64," + base64.b64encode(header).decode()


def reserved(gw: Gateway, model: str) -> int:
    """The tokens the gateway reserved so far for the tenant on ``model`` (its metric)."""
    status, _, body = http("GET", f"{gw.admin_url}/metrics")
    assert status == 200
    pattern = rf'ratelimiterd_gateway_tokens_reserved_total{{model="{re.escape(model)}",tenant="acme"}} (\d+)'
    found = re.search(pattern, body.decode())
    return int(found.group(1)) if found else 0


def test_an_image_is_reserved_and_charged_as_openai_bills_it(gw: Gateway) -> None:
    gw.require_gateway()
    client = openai.OpenAI(base_url=gw.openai_base_url, api_key=gw.api_key, max_retries=0)
    tpm = model_key("openai", "gpt-4o-mini", "tpm")
    before, reserved_before = gw.in_use(tpm), reserved(gw, "gpt-4o-mini")
    completion = client.chat.completions.create(
        model="gpt-4o-mini", max_tokens=10, extra_body={"sim_output_tokens": 10},
        messages=[{"role": "user", "content": [
            {"type": "text", "text": "What is it?"},
            {"type": "image_url", "image_url": {"url": png_data_url(1024, 1024), "detail": "high"}},
        ]}],
    )
    usage = completion.usage
    assert usage.prompt_tokens >= IMAGE_TOKENS
    reservation = reserved(gw, "gpt-4o-mini") - reserved_before
    assert usage.total_tokens <= reservation <= usage.total_tokens + 20, (reservation, usage)
    gw.wait_in_use(tpm, before + usage.total_tokens)


def test_a_budget_counts_cache_reads_and_the_input_limit_does_not(gw: Gateway) -> None:
    gw.require_gateway()
    client = anthropic.Anthropic(base_url=gw.base_url, api_key=gw.api_key, max_retries=0)
    model = "claude-haiku-4-5"
    input_tpm = model_key("anthropic", model, "input_tpm")
    # 2,500 simulator tokens: above Haiku's 2,048-token cache minimum.
    system = [{"type": "text", "text": "the cat sat " * 834, "cache_control": {"type": "ephemeral"}}]
    before = gw.usage_of([input_tpm, TENANT_DAILY])
    billed = limited = 0
    for call in range(2):
        message = client.messages.create(
            model=model, max_tokens=8, system=system, extra_body={"sim_output_tokens": 3},
            messages=[{"role": "user", "content": "Describe the cat."}],
        )
        u = message.usage
        expected = (0, 2_502) if call == 0 else (2_502, 0)
        assert (u.cache_read_input_tokens, u.cache_creation_input_tokens) == expected, u
        billed += u.input_tokens + u.cache_creation_input_tokens + u.cache_read_input_tokens + u.output_tokens
        limited += u.input_tokens + u.cache_creation_input_tokens
    gw.wait_in_use(TENANT_DAILY, before[TENANT_DAILY] + billed)
    gw.wait_in_use(input_tpm, before[input_tpm] + limited)


def test_claude_prompts_are_reserved_by_the_calibrated_estimate(gw: Gateway) -> None:
    gw.require_gateway()
    client = anthropic.Anthropic(base_url=gw.base_url, api_key=gw.api_key, max_retries=0)
    model = "claude-haiku-4-5"
    ratios = []
    for call in range(40):
        text = "the cat sat on the mat and ate two big figs " * (20 + call)
        before = reserved(gw, model)
        message = client.messages.create(
            model=model, max_tokens=4, extra_body={"sim_output_tokens": 1},
            messages=[{"role": "user", "content": text}],
        )
        reservation = reserved(gw, model) - before - 4
        assert reservation >= message.usage.input_tokens
        ratios.append(reservation / message.usage.input_tokens)
    # The byte bound first (4 bytes a token in the simulator), then the calibrated count.
    assert ratios[0] > 3.9, ratios
    assert ratios[-1] <= 1.3, ratios
