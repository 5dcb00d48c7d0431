"""Google Vertex AI: the anthropic SDK's ``AnthropicVertex`` client (its token made
by google-auth from a service account key file whose ``token_uri`` is the
simulator's) against the simulator, which checks the signed assertion and every
token (it speaks as Vertex AI does); and through the gateway to upstreams of kind
``vertex``, the plain ``anthropic`` SDK to a Claude deployment and the ``openai``
SDK to a Gemini one, streaming and not, reconciled to the usage answered. One
simulator with ``--vertex-service-account`` and one gateway of their own, the
gateway signing with the same key."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterator

import anthropic
import openai
import pytest
from anthropic import AnthropicVertex

from conftest import ACME_TENANT, Gateway, http, launch_sim, serve, tokens

ROOT = Path(__file__).resolve().parents[2]
#: The test-only key (tests/fixtures/README.md).
TEST_KEY = (ROOT / "tests/fixtures/vertex-test-only-key.pem").read_text()
OTHER_KEY = (ROOT / "tests/fixtures/vertex-test-only-other-key.pem").read_text()
PROJECT, REGION = "acme-ml", "us-east5"
CLAUDE_ID = "claude-sonnet-4-5@20250929"
GEMINI_ID = "google/gemini-2.5-flash"
QUESTION = "Name three rivers of Europe."
INPUT_TPM = f"global:llm:vertex:{CLAUDE_ID}:input_tpm"
OUTPUT_TPM = f"global:llm:vertex:{CLAUDE_ID}:output_tpm"
GEMINI_TPM = f"global:llm:vertex:{GEMINI_ID}:tpm"


def key_file(path: Path, private_key: str, token_uri: str) -> Path:
    """A service account key file as Google writes one."""
    path.write_text(json.dumps({
        "type": "service_account", "project_id": PROJECT, "private_key_id": "test-only-1",
        "private_key": private_key, "client_email": f"gateway@{PROJECT}.iam.gserviceaccount.com",
        "client_id": "1", "token_uri": token_uri,
    }))
    return path


def gateway_section(sim_url: str, credentials: Path) -> str:
    return f"""  upstreams:
    - {{name: vertex, kind: vertex, project: {PROJECT}, region: {REGION}, base_url: "{sim_url}", credentials_file: "{credentials}"}}
  models:
    - name: claude-sonnet-4-5
      deployments:
        - {{upstream: vertex, model: "{CLAUDE_ID}", rpm: 100000, input_tpm: 50000000, output_tpm: 10000000, concurrency: 64}}
    - name: gemini-2.5-flash
      max_output_tokens_default: 64
      deployments:
        - {{upstream: vertex, model: "{GEMINI_ID}", rpm: 100000, tpm: 50000000, concurrency: 64}}
{ACME_TENANT}"""


@pytest.fixture(scope="module")
def vertex(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    directory = tmp_path_factory.mktemp("vertex")
    # The simulator reads the account and its key; the token_uri is written once its port is known.
    account = key_file(directory / "sim-account.json", TEST_KEY, "http://127.0.0.1/token")
    sim, sim_url = launch_sim(directory, ["--models", f"{CLAUDE_ID},{GEMINI_ID}",
                                          "--vertex-service-account", str(account)])
    credentials = key_file(directory / "service-account.json", TEST_KEY, f"{sim_url}/token")
    # No GOOGLE_APPLICATION_CREDENTIALS: the gateway reads credentials_file.
    env = {k: v for k, v in os.environ.items() if k != "GOOGLE_APPLICATION_CREDENTIALS"}
    with serve(directory, sim, sim_url, "", gateway_section(sim_url, credentials), env) as gateway:
        yield gateway


def anthropic_vertex(vertex: Gateway, monkeypatch: pytest.MonkeyPatch, credentials: Path) -> AnthropicVertex:
    # google-auth finds the key file as it does in production, and exchanges its
    # assertion at the file's token_uri.
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(credentials))
    return AnthropicVertex(region=REGION, project_id=PROJECT, base_url=f"{vertex.sim_url}/v1", max_retries=0)


def test_the_simulator_speaks_vertex_ai_to_anthropic_vertex(
    vertex: Gateway, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    client = anthropic_vertex(vertex, monkeypatch, key_file(tmp_path / "sa.json", TEST_KEY, f"{vertex.sim_url}/token"))
    message = client.messages.create(
        model=CLAUDE_ID, max_tokens=20, messages=[{"role": "user", "content": QUESTION}],
        extra_body={"sim_output_tokens": 5},
    )
    assert (message.usage.input_tokens, message.usage.output_tokens) == (tokens(QUESTION), 5)
    assert message.model == CLAUDE_ID
    with client.messages.stream(
        model=CLAUDE_ID, max_tokens=20, messages=[{"role": "user", "content": QUESTION}],
        extra_body={"sim_output_tokens": 3},
    ) as stream:
        assert "".join(stream.text_stream) == "the cat sat "
        assert stream.get_final_message().usage.output_tokens == 3


def test_the_simulator_refuses_a_foreign_key_and_a_bad_token(
    vertex: Gateway, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import google.auth.exceptions

    foreign = key_file(tmp_path / "foreign.json", OTHER_KEY, f"{vertex.sim_url}/token")
    with pytest.raises(google.auth.exceptions.RefreshError, match="invalid_grant"):
        anthropic_vertex(vertex, monkeypatch, foreign).messages.create(
            model=CLAUDE_ID, max_tokens=5, messages=[{"role": "user", "content": QUESTION}])
    path = f"/v1/projects/{PROJECT}/locations/{REGION}/publishers/anthropic/models/{CLAUDE_ID}:rawPredict"
    body = {"anthropic_version": "vertex-2023-10-16", "max_tokens": 5, "messages": [{"role": "user", "content": "Hi"}]}
    status, _, answer = http("POST", f"{vertex.sim_url}{path}", body, {"authorization": "Bearer ya29.made-up"})
    assert status == 401
    assert json.loads(answer)["error"]["status"] == "UNAUTHENTICATED"


def test_the_gateway_serves_claude_on_vertex_to_the_anthropic_sdk(vertex: Gateway) -> None:
    vertex.require_gateway()
    client = anthropic.Anthropic(base_url=vertex.base_url, api_key=vertex.api_key, max_retries=0)
    before = vertex.usage_of([INPUT_TPM, OUTPUT_TPM])
    raw = client.messages.with_raw_response.create(
        model="claude-sonnet-4-5", max_tokens=20, messages=[{"role": "user", "content": QUESTION}],
        extra_body={"sim_output_tokens": 4},
    )
    message = raw.parse()
    assert raw.headers["x-ratelimit-deployment"].startswith("vertex")
    assert (message.usage.input_tokens, message.usage.output_tokens) == (tokens(QUESTION), 4)
    with client.messages.stream(
        model="claude-sonnet-4-5", max_tokens=20, messages=[{"role": "user", "content": QUESTION}],
        extra_body={"sim_output_tokens": 6},
    ) as stream:
        assert "".join(stream.text_stream) == "the cat sat off her red "
        assert stream.get_final_message().usage.output_tokens == 6
    after = vertex.usage_of([INPUT_TPM, OUTPUT_TPM])
    assert (after[INPUT_TPM] - before[INPUT_TPM], after[OUTPUT_TPM] - before[OUTPUT_TPM]) == (2 * tokens(QUESTION), 10)


def test_the_gateway_serves_gemini_on_vertex_to_the_openai_sdk(vertex: Gateway) -> None:
    vertex.require_gateway()
    client = openai.OpenAI(base_url=vertex.openai_base_url, api_key=vertex.api_key, max_retries=0)
    before = vertex.usage_of([GEMINI_TPM])
    completion = client.chat.completions.create(
        model="gemini-2.5-flash", max_tokens=20, messages=[{"role": "user", "content": QUESTION}],
        extra_body={"sim_output_tokens": 4},
    )
    assert completion.usage is not None and completion.usage.completion_tokens == 4
    chunks = list(client.chat.completions.create(
        model="gemini-2.5-flash", max_tokens=20, stream=True, stream_options={"include_usage": True},
        messages=[{"role": "user", "content": QUESTION}], extra_body={"sim_output_tokens": 3},
    ))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "the cat sat "
    usage = [c.usage for c in chunks if c.usage is not None]
    assert len(usage) == 1 and usage[0].completion_tokens == 3
    after = vertex.usage_of([GEMINI_TPM])
    assert after[GEMINI_TPM] - before[GEMINI_TPM] == 2 * tokens(QUESTION) + 7
