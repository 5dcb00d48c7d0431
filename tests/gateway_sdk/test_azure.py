"""Azure OpenAI's per-deployment paths: the openai SDK's ``AzureOpenAI`` client
against the simulator (it speaks as Azure does: the deployment in the path, the
``api-version`` required, the ``api-key`` header), and the openai SDK through the
gateway to an upstream of kind ``azure``, reconciled to the provider's usage."""

from __future__ import annotations

import openai
import pytest

from conftest import AZURE_API_VERSION, TENANT_DAILY, UPSTREAM_KEY, Gateway, assert_charged, http, model_key, tokens

QUESTION = "What is the capital of France, and why?"
TPM = model_key("azure", "azure-mini", "tpm")


def azure(gw: Gateway, api_key: str = UPSTREAM_KEY) -> openai.AzureOpenAI:
    return openai.AzureOpenAI(
        azure_endpoint=gw.sim_url, api_key=api_key, api_version=AZURE_API_VERSION, max_retries=0
    )


def test_the_simulator_speaks_azures_deployment_paths(gw: Gateway) -> None:
    client = azure(gw)
    completion = client.chat.completions.create(
        model="azure-mini", messages=[{"role": "user", "content": QUESTION}], max_tokens=20,
        extra_body={"sim_output_tokens": 5},
    )
    assert completion.usage is not None
    assert (completion.usage.prompt_tokens, completion.usage.completion_tokens) == (tokens(QUESTION), 5)
    chunks = list(client.chat.completions.create(
        model="azure-mini", messages=[{"role": "user", "content": QUESTION}], max_tokens=20, stream=True,
        extra_body={"sim_output_tokens": 3},
    ))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "the cat sat "
    embedding = client.embeddings.create(model="azure-mini", input=["one", "two"])
    assert len(embedding.data) == 2
    with pytest.raises(openai.AuthenticationError):
        azure(gw, api_key="not-the-key").chat.completions.create(
            model="azure-mini", messages=[{"role": "user", "content": QUESTION}], max_tokens=5
        )
    # Without api-version, Azure answers 404 "Resource not found".
    status, _, body = http("POST", f"{gw.sim_url}/openai/deployments/azure-mini/chat/completions",
                           {"messages": [{"role": "user", "content": QUESTION}]})
    assert status == 404 and b"Resource not found" in body


def test_the_gateway_calls_an_azure_deployment_by_its_path(gw: Gateway) -> None:
    gw.require_gateway()
    client = openai.OpenAI(base_url=gw.openai_base_url, api_key=gw.api_key, max_retries=0)
    before = gw.usage_of([TPM, TENANT_DAILY])
    completion = client.chat.completions.create(
        model="azure-mini", messages=[{"role": "user", "content": QUESTION}], max_tokens=20,
        extra_body={"sim_output_tokens": 4},
    )
    assert completion.usage is not None and completion.usage.completion_tokens == 4
    chunks = list(client.chat.completions.create(
        model="azure-mini", messages=[{"role": "user", "content": QUESTION}], max_tokens=20, stream=True,
        stream_options={"include_usage": True}, extra_body={"sim_output_tokens": 6},
    ))
    usage = [c.usage for c in chunks if c.usage is not None]
    assert len(usage) == 1 and usage[0].completion_tokens == 6
    prompt = tokens(QUESTION)
    assert_charged(gw, before, {TPM: 2 * prompt + 10, TENANT_DAILY: 2 * prompt + 10})
