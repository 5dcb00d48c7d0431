"""Every bad input gets a clear error in the provider's shape, before anything is
reserved or forwarded: malformed JSON, a missing model, an unknown model (404),
a body over the limit (413), wrong types, a missing or wrong key (401)."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import httpx
import openai
import pytest

from conftest import UNCONFIGURED_MODEL, Gateway, http, model_key

#: Above the gateway's default body limit (8 MiB).
TOO_LARGE_BYTES = 9 * 1024 * 1024
OPENAI_RPM = model_key("openai", "gpt-4o-mini", "rpm")
ANTHROPIC_RPM = model_key("anthropic", "claude-haiku-4-5", "rpm")
CHAT = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}
MESSAGE = {"model": "claude-haiku-4-5", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}


def openai_headers(gw: Gateway, key: str | None = None) -> dict[str, str]:
    return {"authorization": f"Bearer {key or gw.api_key}", "content-type": "application/json"}


def anthropic_headers(gw: Gateway, key: str | None = None) -> dict[str, str]:
    return {"x-api-key": key or gw.api_key, "anthropic-version": "2023-06-01", "content-type": "application/json"}


def with_fields(body: dict[str, Any], **fields: Any) -> bytes:
    changed = {**body, **fields}
    return json.dumps({k: v for k, v in changed.items() if v is not ...}).encode()


CASES = [
    ("malformed JSON", b'{"model": "gpt-4o-mini", "messages": [', 400),
    ("missing model", with_fields(CHAT, model=...), 400),
    ("unknown model", with_fields(CHAT, model="gpt-9-does-not-exist"), 404),
    ("messages not an array", with_fields(CHAT, messages="hi"), 400),
    ("max_tokens not a number", with_fields(CHAT, max_tokens="ten"), 400),
    ("model not a string", with_fields(CHAT, model=42), 400),
    ("body too large", with_fields(CHAT, messages=[{"role": "user", "content": "x" * TOO_LARGE_BYTES}]), 413),
]


@pytest.fixture
def nothing_changes(gw: Gateway):
    """Asserts after the test that nothing was reserved and nothing forwarded."""
    reserved = gw.usage_of([OPENAI_RPM, ANTHROPIC_RPM])
    forwarded = gw.sim_stats()["calls"]
    yield
    assert gw.usage_of([OPENAI_RPM, ANTHROPIC_RPM]) == reserved
    assert gw.sim_stats()["calls"] == forwarded


def post(url: str, body: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
    """httpx, as the SDKs send: it reads a 413 answered before the whole body was
    sent (urllib stops at the broken pipe)."""
    answer = httpx.post(url, content=body, headers=headers, timeout=30)
    return answer.status_code, answer.content


@pytest.mark.parametrize("name,body,status", CASES, ids=[c[0] for c in CASES])
def test_openai_shape(gw: Gateway, nothing_changes: None, name: str, body: bytes, status: int) -> None:
    answer_status, answer = post(f"{gw.base_url}/v1/chat/completions", body, openai_headers(gw))
    assert answer_status == status, answer[:300]
    if status == 413 and not gw.is_gateway:
        return  # the simulator's own body limit answers in plain text
    error = json.loads(answer)["error"]
    assert error["message"], error
    if status == 404:
        assert error["code"] == "model_not_found"


@pytest.mark.parametrize("name,body,status", CASES, ids=[c[0] for c in CASES])
def test_anthropic_shape(gw: Gateway, nothing_changes: None, name: str, body: bytes, status: int) -> None:
    as_message = body.replace(b'"gpt-4o-mini"', b'"claude-haiku-4-5"')
    answer_status, answer = post(f"{gw.base_url}/v1/messages", as_message, anthropic_headers(gw))
    assert answer_status == status, answer[:300]
    if status == 413 and not gw.is_gateway:
        return
    parsed = json.loads(answer)
    assert parsed["type"] == "error" and parsed["error"]["message"], parsed
    if status == 404:
        assert parsed["error"]["type"] == "not_found_error"


def test_the_sdks_see_unknown_models_and_bad_keys_as_their_errors(gw: Gateway, nothing_changes: None) -> None:
    with pytest.raises(openai.NotFoundError):
        openai.OpenAI(base_url=gw.openai_base_url, api_key=gw.api_key, max_retries=0).chat.completions.create(
            model=UNCONFIGURED_MODEL if gw.is_gateway else "gpt-9", messages=[{"role": "user", "content": "hi"}]
        )
    key = "wrong-key-of-the-right-length-0"
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=gw.openai_base_url, api_key=key, max_retries=0).chat.completions.create(
            model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}]
        )
    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(base_url=gw.base_url, api_key=key, max_retries=0).messages.create(
            model="claude-haiku-4-5", max_tokens=5, messages=[{"role": "user", "content": "hi"}]
        )


def test_missing_keys_are_401_in_each_shape(gw: Gateway, nothing_changes: None) -> None:
    status, _, body = http("POST", f"{gw.base_url}/v1/chat/completions", CHAT)
    assert status == 401 and json.loads(body)["error"]["message"]
    status, _, body = http("POST", f"{gw.base_url}/v1/messages", MESSAGE, headers={"anthropic-version": "2023-06-01"})
    assert status == 401 and json.loads(body)["error"]["type"] == "authentication_error"
