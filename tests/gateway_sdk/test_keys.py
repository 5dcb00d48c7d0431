"""Keys made through the admin API (docs/gateway.md, "Tenants and keys"), used
by the real SDKs: the key works as its tenant, ``models.list`` shows its scope,
a model outside it is the SDK's PermissionDeniedError, its own rpm the SDK's
RateLimitError naming the key's limit, a revoked key the SDK's
AuthenticationError."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import openai
import pytest

from conftest import Gateway, http

HAIKU = "claude-haiku-4-5"


def admin(gw: Gateway, method: str, path: str, body: Any = None, expected: int = 200) -> dict[str, Any]:
    """An admin call (the server has no admin token and listens on loopback)."""
    assert gw.admin_url is not None
    status, _, raw = http(method, f"{gw.admin_url}{path}", body)
    assert status == expected, (path, raw)
    return json.loads(raw)


def new_key(gw: Gateway, spec: dict[str, Any]) -> dict[str, Any]:
    return admin(gw, "POST", "/v1/admin/gateway/keys", spec, 201)


@pytest.fixture(scope="module")
def tenant(gw: Gateway) -> str:
    gw.require_gateway()
    admin(gw, "POST", "/v1/admin/gateway/tenants", {"name": "sdk-team", "rpm": 1000}, 201)
    return "sdk-team"


def test_the_openai_sdk_with_a_key_made_through_the_api(gw: Gateway, tenant: str) -> None:
    made = new_key(gw, {"tenant": tenant, "name": "openai-app", "models": ["gpt-4o-mini"], "rpm": 2})
    client = openai.OpenAI(base_url=gw.openai_base_url, api_key=made["key"], max_retries=0)
    assert [m.id for m in client.models.list()] == ["gpt-4o-mini"]
    ask = [{"role": "user", "content": "Hi"}]
    answer = client.chat.completions.create(model="gpt-4o-mini", messages=ask, max_tokens=5)
    assert answer.usage is not None and answer.usage.completion_tokens > 0
    assert gw.in_use(f"key:{made['id']}:llm:rpm") == 1
    assert gw.in_use(f"tenant:{tenant}:llm:rpm") == 1
    with pytest.raises(openai.PermissionDeniedError):
        client.chat.completions.create(model="gpt-4o", messages=ask, max_tokens=5)
    client.chat.completions.create(model="gpt-4o-mini", messages=ask, max_tokens=5)
    with pytest.raises(openai.RateLimitError) as refused:
        client.chat.completions.create(model="gpt-4o-mini", messages=ask, max_tokens=5)
    assert f"key:{made['id']}:llm:rpm" in str(refused.value)
    assert gw.in_use(f"tenant:{tenant}:llm:rpm") == 2, "nothing reserved outside the scope or the key's limit"
    admin(gw, "DELETE", f"/v1/admin/gateway/keys/{made['id']}")
    with pytest.raises(openai.AuthenticationError):
        client.models.list()


def test_the_anthropic_sdk_with_a_key_made_through_the_api(gw: Gateway, tenant: str) -> None:
    made = new_key(gw, {"tenant": tenant, "name": "anthropic-app", "models": [HAIKU]})
    client = anthropic.Anthropic(base_url=gw.base_url, api_key=made["key"], max_retries=0)
    ask = [{"role": "user", "content": "Hi"}]
    answer = client.messages.create(model=HAIKU, messages=ask, max_tokens=5)
    assert answer.usage.output_tokens > 0
    scoped = new_key(gw, {"tenant": tenant, "models": ["gpt-4o-mini"]})
    other = anthropic.Anthropic(base_url=gw.base_url, api_key=scoped["key"], max_retries=0)
    with pytest.raises(anthropic.PermissionDeniedError):
        other.messages.create(model=HAIKU, messages=ask, max_tokens=5)
    admin(gw, "DELETE", f"/v1/admin/gateway/keys/{made['id']}")
    with pytest.raises(anthropic.AuthenticationError):
        client.messages.create(model=HAIKU, messages=ask, max_tokens=5)
