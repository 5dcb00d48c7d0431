"""Amazon Bedrock: the anthropic SDK's ``AnthropicBedrock`` client (SigV4 signed by
botocore) against the simulator, which checks every signature (it speaks as
Bedrock does), and the plain ``anthropic`` SDK through the gateway to a pool
deployment of kind ``bedrock``, streaming and not, reconciled to the usage
Bedrock reported. One simulator with ``--aws-sigv4`` and one gateway of their
own, the gateway signing with the same keys."""

from __future__ import annotations

import os
from typing import Iterator

import anthropic
import pytest

from conftest import ACME_TENANT, TENANT_KEY, Gateway, http, launch_sim, serve, tokens

#: A cross-region inference profile's id: it holds '.' and ':'.
CLAUDE_ID = "us.anthropic.claude-sonnet-4-5-20250929-v1:0"
#: The id in the limit keys: ':' written '@' (docs/gateway.md, "Amazon Bedrock").
CLAUDE_KEY = "us.anthropic.claude-sonnet-4-5-20250929-v1@0"
#: The pool's Bedrock deployment: a global inference profile's id.
POOL_ID = "global.anthropic.claude-sonnet-4-5-20250929-v1:0"
#: The pool's Anthropic deployment.
ANTHROPIC_MODEL = "claude-sonnet-4-5"
REGION = "us-east-1"
AWS = {
    "AWS_ACCESS_KEY_ID": "ASIASIMULATOR0000001",
    "AWS_SECRET_ACCESS_KEY": "simulated/secret+key0000000000000000000",
    "AWS_SESSION_TOKEN": "simulated-session-token",
}
QUESTION = "Name three rivers of Europe."
INPUT_TPM = f"global:llm:bedrock:{CLAUDE_KEY}:input_tpm"
OUTPUT_TPM = f"global:llm:bedrock:{CLAUDE_KEY}:output_tpm"


def gateway_section(sim_url: str) -> str:
    return f"""  upstreams:
    - {{name: bedrock, kind: bedrock, region: {REGION}, base_url: "{sim_url}"}}
    - {{name: anthropic, kind: anthropic, base_url: "{sim_url}"}}
  models:
    - name: claude-sonnet-4-5
      deployments:
        - {{upstream: bedrock, model: "{CLAUDE_ID}", rpm: 100000, input_tpm: 50000000, output_tpm: 10000000}}
    - name: claude-pool
      deployments:
        - {{upstream: anthropic, model: {ANTHROPIC_MODEL}, rpm: 100000, input_tpm: 50000000, output_tpm: 10000000}}
        - {{upstream: bedrock, model: "{POOL_ID}", rpm: 100000, input_tpm: 50000000, output_tpm: 10000000}}
{ACME_TENANT}"""


@pytest.fixture(scope="module")
def bedrock(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    directory = tmp_path_factory.mktemp("bedrock")
    sim, sim_url = launch_sim(directory, ["--models", f"{CLAUDE_ID},{POOL_ID},{ANTHROPIC_MODEL}", "--aws-sigv4"],
                              {**os.environ, **AWS})
    with serve(directory, sim, sim_url, TENANT_KEY, gateway_section(sim_url), {**os.environ, **AWS}) as gateway:
        yield gateway


def bedrock_client(gw: Gateway, secret: str = AWS["AWS_SECRET_ACCESS_KEY"]) -> anthropic.AnthropicBedrock:
    return anthropic.AnthropicBedrock(
        aws_access_key=AWS["AWS_ACCESS_KEY_ID"], aws_secret_key=secret,
        aws_session_token=AWS["AWS_SESSION_TOKEN"], aws_region=REGION, base_url=gw.sim_url, max_retries=0,
    )


def test_the_simulator_speaks_bedrock_to_anthropic_bedrock(bedrock: Gateway) -> None:
    client = bedrock_client(bedrock)
    message = client.messages.create(
        model=CLAUDE_ID, max_tokens=30, messages=[{"role": "user", "content": QUESTION}],
        extra_body={"sim_output_tokens": 5},
    )
    assert (message.usage.input_tokens, message.usage.output_tokens) == (tokens(QUESTION), 5)
    with client.messages.stream(
        model=CLAUDE_ID, max_tokens=30, messages=[{"role": "user", "content": QUESTION}],
        extra_body={"sim_output_tokens": 3},
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == "the cat sat "
    assert (final.usage.input_tokens, final.usage.output_tokens) == (tokens(QUESTION), 3)
    # Another secret: Bedrock's 403, the signature refused.
    with pytest.raises(anthropic.PermissionDeniedError, match="signature we calculated does not match"):
        bedrock_client(bedrock, secret="not-the-secret").messages.create(
            model=CLAUDE_ID, max_tokens=5, messages=[{"role": "user", "content": QUESTION}]
        )
    # Throttled in Bedrock's shape: the SDK's rate-limit error.
    bedrock.fault(mode="status", status=429, count=1)
    with pytest.raises(anthropic.RateLimitError):
        client.messages.create(model=CLAUDE_ID, max_tokens=5, messages=[{"role": "user", "content": QUESTION}])
    status, headers, _ = http("POST", f"{bedrock.sim_url}/model/{CLAUDE_ID}/invoke",
                              {"anthropic_version": "bedrock-2023-05-31", "max_tokens": 5,
                               "messages": [{"role": "user", "content": QUESTION}]})
    assert status == 403 and headers["x-amzn-errortype"].startswith("MissingAuthenticationTokenException")


def test_the_anthropic_sdk_reaches_a_bedrock_deployment_through_the_gateway(bedrock: Gateway) -> None:
    bedrock.require_gateway()
    client = anthropic.Anthropic(base_url=bedrock.base_url, api_key=bedrock.api_key, max_retries=0)
    before = bedrock.usage_of([INPUT_TPM, OUTPUT_TPM])
    message = client.messages.create(
        model="claude-sonnet-4-5", max_tokens=40, messages=[{"role": "user", "content": QUESTION}],
        extra_body={"sim_output_tokens": 6},
    )
    assert message.model == CLAUDE_ID
    assert (message.usage.input_tokens, message.usage.output_tokens) == (tokens(QUESTION), 6)
    with client.messages.stream(
        model="claude-sonnet-4-5", max_tokens=40, messages=[{"role": "user", "content": QUESTION}],
        extra_body={"sim_output_tokens": 4},
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == "the cat sat off "
    assert final.usage.output_tokens == 4
    # Reconciled to what Bedrock reported, the 40-token bounds given back.
    bedrock.wait_in_use(OUTPUT_TPM, before[OUTPUT_TPM] + 6 + 4)
    bedrock.wait_in_use(INPUT_TPM, before[INPUT_TPM] + 2 * tokens(QUESTION))


def test_throttling_on_one_provider_moves_the_pools_calls_to_the_other(bedrock: Gateway) -> None:
    bedrock.require_gateway()
    client = anthropic.Anthropic(base_url=bedrock.base_url, api_key=bedrock.api_key, max_retries=0)

    def ask(stream: bool) -> str:
        request = {"model": "claude-pool", "max_tokens": 20, "messages": [{"role": "user", "content": QUESTION}],
                   "extra_body": {"sim_output_tokens": 2}}
        if stream:
            with client.messages.stream(**request) as events:
                return events.get_final_message().model
        return client.messages.create(**request).model

    try:
        # Anthropic throttled for a while: every call is served by Bedrock, none fails.
        bedrock.fault(mode="status", status=429, for_ms=30000, model=ANTHROPIC_MODEL)
        assert {ask(stream) for stream in [False, True] * 3} == {POOL_ID}
        # Now Bedrock throttles, in its own shape: Anthropic serves them.
        bedrock.fault(mode="status", status=429, for_ms=30000, model=POOL_ID)
        assert {ask(stream) for stream in [False, True] * 3} == {ANTHROPIC_MODEL}
    finally:
        assert http("DELETE", f"{bedrock.sim_url}/sim/faults")[0] == 204
