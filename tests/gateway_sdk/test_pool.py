"""A pool of deployments with the real openai SDK (docs/gateway.md, "Pools"): every
pool example of docs/gateway.md (its walk through's and its "Pools" section's),
started as written with each upstream replaced by a provider-sim of its own; one
deployment armed to fail, the call succeeds on another, the client none the wiser."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path
from typing import Iterator

import openai
import pytest

from conftest import (START_TIMEOUT_S, TENANT_KEY, UPSTREAM_KEY, binary, free_port, http, stop,
                      wait_http)

ROOT = Path(__file__).resolve().parents[2]
#: The model names the deployments' simulators serve.
SIM_MODELS = "gpt-4o,gpt-4o-ptu"
#: The variables the examples name for their upstream keys.
KEY_VARIABLES = ["AZ_EAST_KEY", "AZ_WEST_KEY", "OPENAI_API_KEY", "EAST_KEY", "WEST_KEY"]


#: The document whose pool examples are started, and how many it shows.
POOL_DOCUMENT, POOL_EXAMPLES = "docs/gateway.md", 2


def pool_examples(document: str) -> list[str]:
    """The YAML blocks of `document` that configure a pool of OpenAI's wire format
    (the openai SDK's; the Anthropic and Bedrock pool of "Amazon Bedrock" is started
    by crates/gateway/tests/doc_examples.rs and tested by tests/bedrock.rs)."""
    blocks = re.findall(r"```yaml\n(.*?)```", (ROOT / document).read_text(), re.S)
    return [b for b in blocks if "deployments:" in b and "kind: bedrock" not in b]


def test_every_pool_example_is_started() -> None:
    # The fixture below is parametrized by number: a pool example added to the
    # document must be added there, one removed must not leave a test that skips.
    assert len(pool_examples(POOL_DOCUMENT)) == POOL_EXAMPLES


def start_sim(directory: Path, name: str) -> tuple[subprocess.Popen, str]:
    log = directory / f"{name}.log"
    process = subprocess.Popen(
        [binary("PROVIDER_SIM_BIN"), "--listen", "127.0.0.1:0", "--rpm", "100000", "--tpm", "100000000",
         "--concurrency", "64", "--models", SIM_MODELS, "--api-key-env", "SIM_UPSTREAM_KEY"],
        env={**os.environ, "SIM_UPSTREAM_KEY": UPSTREAM_KEY},
        stdout=subprocess.DEVNULL,
        stderr=open(log, "wb"),
    )
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        found = re.search(r"serving on (http://\S+)", log.read_text())
        if found:
            return process, found.group(1)
        assert process.poll() is None, log.read_text()
        time.sleep(0.05)
    process.kill()
    raise RuntimeError("provider-sim did not start in time")


class Pool:
    """A ratelimiterd serving one documented pool example, and its deployments' simulators."""

    def __init__(self, directory: Path, example: str) -> None:
        self.processes: list[subprocess.Popen] = []
        urls = re.findall(r'base_url: "([^"]+)"', example)
        #: The upstreams' names, in the order listed.
        self.names: list[str] = re.findall(r"name: ([\w-]+), kind", example)
        self.sims: list[str] = []
        for i, _ in enumerate(urls):
            process, url = start_sim(directory, f"deployment-{i}")
            self.processes.append(process)
            self.sims.append(url)
        replacements = iter(self.sims)
        gateway = re.sub(r'base_url: "[^"]+"', lambda _: f'base_url: "{next(replacements)}"', example)
        api_port, gateway_port = free_port(), free_port()
        gateway = gateway.replace('listen_addr: "127.0.0.1:8081"', f'listen_addr: "127.0.0.1:{gateway_port}"')
        if "tenants:" not in gateway:
            gateway += "  tenants:\n    - {name: acme, api_key_env: ACME_GATEWAY_KEY}\n"
        config = directory / "ratelimiterd.yaml"
        config.write_text(f'server:\n  listen_addr: "127.0.0.1:{api_port}"\nregistry:\n'
                          f'  path: "{directory / "limits.json"}"\n{gateway}')
        log = directory / "ratelimiterd.log"
        env = {**os.environ, "ACME_GATEWAY_KEY": TENANT_KEY, **{v: UPSTREAM_KEY for v in KEY_VARIABLES}}
        server = subprocess.Popen([binary("RATELIMITERD_BIN"), "--config", str(config)], env=env,
                                  stdout=subprocess.DEVNULL, stderr=open(log, "wb"))
        self.processes.append(server)
        wait_http(f"http://127.0.0.1:{api_port}/healthz", server, log)
        self.admin_url = f"http://127.0.0.1:{api_port}"
        self.base_url = f"http://127.0.0.1:{gateway_port}/v1"
        wait_http(f"{self.base_url}/models", server, log)

    def calls(self, deployment: int) -> int:
        status, _, body = http("GET", f"{self.sims[deployment]}/sim/stats")
        assert status == 200
        return json.loads(body)["calls"]

    def fault(self, deployment: int, **fault: object) -> None:
        status, _, body = http("POST", f"{self.sims[deployment]}/sim/faults", fault)
        assert status == 204, body

    def close(self) -> None:
        for process in reversed(self.processes):
            stop(process)


@pytest.fixture(params=range(POOL_EXAMPLES))
def pool(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Pool]:
    if os.environ.get("GATEWAY_TEST_TARGET", "gateway") == "sim":
        pytest.skip("needs the gateway (GATEWAY_TEST_TARGET=sim)")
    started = Pool(tmp_path, pool_examples(POOL_DOCUMENT)[request.param])
    try:
        yield started
    finally:
        started.close()


def test_a_pool_serves_a_call_when_its_first_deployment_fails(pool: Pool) -> None:
    # No retry by the SDK: the one answer it gets is the gateway's.
    client = openai.OpenAI(base_url=pool.base_url, api_key=TENANT_KEY, max_retries=0)
    assert "gpt-4o" in [m.id for m in client.models.list()]
    # The priority-0 deployment is the first listed: arm it to fail.
    pool.fault(0, mode="status", status=500, count=1)
    raw = client.chat.completions.with_raw_response.create(
        model="gpt-4o", max_tokens=8, messages=[{"role": "user", "content": "Hello"}])
    completion = raw.parse()
    assert completion.usage is not None and completion.usage.total_tokens > 0
    served_by = raw.headers["x-ratelimit-deployment"]
    assert served_by in pool.names[1:], served_by
    assert pool.calls(0) == 1, "the failing deployment was tried once"
    assert sum(pool.calls(i) for i in range(1, len(pool.sims))) == 1, "and the call served once elsewhere"
    # The admin API shows the failover.
    status, _, body = http("GET", f"{pool.admin_url}/v1/admin/gateway/deployments")
    assert status == 200
    deployments = json.loads(body)
    assert deployments[0]["failed_over"] == 1, deployments
    # A stream, the first deployment failing again: served whole by another.
    pool.fault(0, mode="status", status=503, count=1)
    stream = client.chat.completions.create(model="gpt-4o", max_tokens=8, stream=True,
                                            messages=[{"role": "user", "content": "Hello"}])
    text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    assert text, "the stream's text arrived"

