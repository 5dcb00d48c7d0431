"""Fixtures of the gateway's SDK tests (docs/testing.md, "Gateway SDK tests").

One provider-sim and one ratelimiterd with a ``gateway:`` section per test module,
on free loopback ports. The real ``openai`` and ``anthropic`` SDKs call the
gateway; the tests read what was reserved back through ratelimiterd's admin API
(``GET /v1/admin/limits/{key}``) and what reached the provider through the
simulator's ``/sim/stats``.

``GATEWAY_TEST_TARGET=sim`` points the SDKs at the simulator itself: it checks the
harness and the simulator's wire formats before a gateway exists; the checks only
a gateway can pass (limits read back, tenants, cooldown, queueing) are skipped then.
"""

from __future__ import annotations

import json
import math
import os
import re
import socket
import subprocess
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import pytest

#: How long a process may take to start listening.
START_TIMEOUT_S = 30.0
#: How long a test waits for a released hold to show (a poll, not a timed assertion).
SETTLE_TIMEOUT_S = 10.0
#: The simulator's bytes per token (crates/replay/src/sim/limits.rs, BYTES_PER_TOKEN).
BYTES_PER_TOKEN = 4
#: The upstream key the gateway sends and the simulator requires.
UPSTREAM_KEY = "sk-sim-upstream-0123456789"
#: The tenant's gateway key: what SDK users hold.
TENANT_KEY = "gw-acme-key-0123456789abcdef"
#: The simulator's time per output token, in ms: streams take time, tests stay fast.
MS_PER_OUTPUT_TOKEN = 2
#: The model whose concurrency the 64-stream test saturates.
NARROW_CONCURRENCY = 8

#: The models the gateway serves, on two upstreams of the one simulator.
MODELS: list[dict[str, Any]] = [
    {"name": "gpt-4o-mini", "upstream": "openai", "rpm": 100000, "tpm": 50000000, "concurrency": 64,
     "max_output_tokens_default": 64, "max_wait_ms": 30000},
    {"name": "gpt-4o", "upstream": "openai", "rpm": 100000, "tpm": 50000000, "concurrency": NARROW_CONCURRENCY,
     "max_output_tokens_default": 64, "max_wait_ms": 60000},
    {"name": "sim-model", "upstream": "openai", "rpm": 100000, "tpm": 50000000, "concurrency": 64,
     "max_output_tokens_default": 64, "max_wait_ms": 0},
    # Neither an embeddings model nor an Anthropic one needs max_output_tokens_default.
    {"name": "text-embedding-3-small", "upstream": "openai", "rpm": 100000, "tpm": 50000000, "max_wait_ms": 0},
    {"name": "claude-haiku-4-5", "upstream": "anthropic", "rpm": 100000, "input_tpm": 50000000,
     "output_tpm": 10000000, "concurrency": 64, "max_wait_ms": 30000},
    # An Azure OpenAI deployment: its name is the deployment's, in the path.
    {"name": "azure-mini", "upstream": "azure", "rpm": 100000, "tpm": 50000000, "concurrency": 64,
     "max_output_tokens_default": 64, "max_wait_ms": 30000, "price": {"input": 0.15, "output": 0.6}},
]
#: The Azure upstream's api-version (https://learn.microsoft.com/en-us/azure/ai-foundry/openai/api-version-lifecycle).
AZURE_API_VERSION = "2024-10-21"
#: Served by the simulator but not configured in the gateway: a 404 there.
UNCONFIGURED_MODEL = "claude-sonnet-4-5"


def tokens(*texts: str) -> int:
    """The simulator's count: each text's UTF-8 bytes over 4, rounded up."""
    return sum(math.ceil(len(t.encode()) / BYTES_PER_TOKEN) for t in texts)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def binary(variable: str) -> str:
    path = os.environ.get(variable, "")
    if not path or not Path(path).is_file():
        pytest.fail(f"{variable} must name a built binary (scripts/gateway-test.sh sets it)")
    return path


def http(method: str, url: str, body: Any = None, headers: dict[str, str] | None = None,
         raw: bytes | None = None) -> tuple[int, dict[str, str], bytes]:
    """One plain HTTP call: status, lower-cased headers, body (errors included)."""
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    request = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    if data is not None and "content-type" not in {k.lower() for k in request.headers}:
        request.add_header("content-type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, {k.lower(): v for k, v in response.headers.items()}, response.read()
    except urllib.error.HTTPError as error:
        return error.code, {k.lower(): v for k, v in error.headers.items()}, error.read()


def stop(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def launch_sim(directory: Path, args: list[str], env: dict[str, str] | None = None) -> tuple[subprocess.Popen, str]:
    """provider-sim on a free port, with limits no test reaches, the tests' pace of
    output tokens and ``args`` (its models, its credentials); waits for the port it
    prints and answers its process and base URL."""
    log = directory / "provider-sim.log"
    process = subprocess.Popen(
        [binary("PROVIDER_SIM_BIN"), "--listen", "127.0.0.1:0", "--rpm", "1000000", "--tpm", "1000000000",
         "--ms-per-output-token", str(MS_PER_OUTPUT_TOKEN), *args],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=open(log, "wb"),
    )
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"provider-sim exited: {log.read_text()}")
        found = re.search(r"serving on (http://\S+)", log.read_text())
        if found:
            return process, found.group(1)
        time.sleep(0.05)
    process.kill()
    raise RuntimeError("provider-sim did not start in time")


def start_sim(directory: Path) -> tuple[subprocess.Popen, str]:
    """provider-sim serving every model of ``MODELS`` (and one the gateway lacks)
    to the upstream key."""
    models = ",".join([m["name"] for m in MODELS] + [UNCONFIGURED_MODEL])
    return launch_sim(directory, ["--concurrency", "256", "--models", models, "--api-key-env", "SIM_UPSTREAM_KEY"],
                      {**os.environ, "SIM_UPSTREAM_KEY": UPSTREAM_KEY})


#: The tenant every gateway of these tests serves: ``TENANT_KEY`` in ``ACME_GATEWAY_KEY``.
ACME_TENANT = "  tenants:\n    - {name: acme, api_key_env: ACME_GATEWAY_KEY, daily_tokens: 100000000}\n"


def gateway_section(sim_url: str) -> str:
    """The ``gateway:`` section's upstreams, models and tenant the issue names."""
    def entry(fields: dict[str, Any]) -> str:
        lines = [f"{k}: {json.dumps(v)}" for k, v in fields.items()]
        return "\n".join(["    - " + lines[0]] + ["      " + line for line in lines[1:]])

    upstreams = [
        {"name": "openai", "kind": "openai", "base_url": sim_url, "api_key_env": "SIM_UPSTREAM_KEY"},
        {"name": "anthropic", "kind": "anthropic", "base_url": sim_url, "api_key_env": "SIM_UPSTREAM_KEY"},
        {"name": "azure", "kind": "azure", "base_url": sim_url, "api_version": AZURE_API_VERSION,
         "api_key_env": "SIM_UPSTREAM_KEY"},
    ]
    return "\n".join([
        "  upstreams:",
        *[entry(u) for u in upstreams],
        "  models:",
        *[entry(m) for m in MODELS],
        ACME_TENANT,
    ])


def wait_http(url: str, process: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"ratelimiterd exited: {log.read_text()}")
        try:
            http("GET", url)
            return
        except OSError:
            time.sleep(0.05)
    process.kill()
    raise RuntimeError(f"{url} did not answer in time")


@dataclass
class Gateway:
    """What a test talks to: the SDKs' base URL, the keys, and both back doors."""

    #: Everything before ``/v1``: the anthropic SDK's base_url; openai's adds ``/v1``.
    base_url: str
    #: The key SDK users send.
    api_key: str
    #: The simulator's base URL (for /sim/stats and /sim/faults).
    sim_url: str
    #: ratelimiterd's limiter API (admin reads); None when the target is the simulator.
    admin_url: str | None
    logs: list[Path] = field(default_factory=list)

    @property
    def is_gateway(self) -> bool:
        return self.admin_url is not None

    @property
    def openai_base_url(self) -> str:
        return f"{self.base_url}/v1"

    def require_gateway(self) -> None:
        if not self.is_gateway:
            pytest.skip("needs the gateway (GATEWAY_TEST_TARGET=sim)")

    def sim_stats(self) -> dict[str, Any]:
        status, _, body = http("GET", f"{self.sim_url}/sim/stats")
        assert status == 200, body
        return json.loads(body)

    def reset_sim_stats(self) -> None:
        assert http("DELETE", f"{self.sim_url}/sim/stats")[0] == 204

    def wait_sim_idle(self) -> None:
        """Polls until the simulator holds no call (its ledger's slots all released)."""
        deadline = time.monotonic() + SETTLE_TIMEOUT_S
        while (stats := self.sim_stats())["in_flight"] != 0:
            assert time.monotonic() < deadline, f"the simulator still holds calls: {stats}"
            time.sleep(0.02)

    def fault(self, **fault: Any) -> None:
        status, _, body = http("POST", f"{self.sim_url}/sim/faults", fault)
        assert status == 204, body

    def limit(self, key: str) -> dict[str, Any]:
        """A limit's report from the admin API (definition, in_use, ...)."""
        assert self.admin_url is not None
        status, _, body = http("GET", f"{self.admin_url}/v1/admin/limits/{key}")
        assert status == 200, (key, body)
        return json.loads(body)

    def in_use(self, key: str) -> int:
        return int(self.limit(key)["in_use"])

    def usage_of(self, keys: list[str]) -> dict[str, int]:
        """``in_use`` of each key; empty when the target is the simulator."""
        return {k: self.in_use(k) for k in keys} if self.is_gateway else {}

    def wait_in_use(self, key: str, expected: int) -> None:
        """Polls until ``key`` holds ``expected`` (a released hold shows at once on
        the memory backend; the poll only absorbs scheduling delays)."""
        deadline = time.monotonic() + SETTLE_TIMEOUT_S
        while (held := self.in_use(key)) != expected:
            assert time.monotonic() < deadline, f"{key} holds {held}, expected {expected}"
            time.sleep(0.02)


def model_key(upstream: str, model: str, dimension: str) -> str:
    return f"global:llm:{upstream}:{model}:{dimension}"


#: The tenant's daily budget key.
TENANT_DAILY = "tenant:acme:llm:daily_tokens"


def assert_charged(gw: Gateway, before: dict[str, int], charged: dict[str, int]) -> None:
    """Each key's ``in_use`` grew by exactly ``charged`` (reconciled to the
    provider's usage, to the token) since ``before``."""
    if not gw.is_gateway:
        return
    after = gw.usage_of(list(charged))
    assert {k: after[k] - before[k] for k in charged} == charged


def start_ratelimiterd(directory: Path, gateway: str, env: dict[str, str]) -> tuple[subprocess.Popen, str, str]:
    """ratelimiterd on two free ports, its registry in ``directory``, ``gateway``
    (YAML indented under ``gateway:``) after its gateway's listen address; answers
    the process, the gateway's base URL and the limiter API's once both answer."""
    api_port, gateway_port = free_port(), free_port()
    config = directory / "ratelimiterd.yaml"
    config.write_text("\n".join([
        "server:",
        f'  listen_addr: "127.0.0.1:{api_port}"',
        "registry:",
        f'  path: "{directory / "limits.json"}"',
        "gateway:",
        f'  listen_addr: "127.0.0.1:{gateway_port}"',
        gateway,
    ]))
    log = directory / "ratelimiterd.log"
    server = subprocess.Popen([binary("RATELIMITERD_BIN"), "--config", str(config)], env=env,
                              stdout=subprocess.DEVNULL, stderr=open(log, "wb"))
    admin_url, base = f"http://127.0.0.1:{api_port}", f"http://127.0.0.1:{gateway_port}"
    try:
        wait_http(f"{admin_url}/healthz", server, log)
        wait_http(f"{base}/v1/models", server, log)
    except BaseException:
        stop(server)
        raise
    return server, base, admin_url


@contextmanager
def serve(directory: Path, sim: subprocess.Popen, sim_url: str, sim_api_key: str, gateway: str,
          env: dict[str, str]) -> Iterator[Gateway]:
    """A module's ``Gateway``: ratelimiterd with ``gateway`` in front of the started
    simulator, the acme tenant's key added to ``env`` (or the simulator itself,
    called with ``sim_api_key``, when ``GATEWAY_TEST_TARGET=sim``); both stopped at
    the end."""
    processes = [sim]
    try:
        if os.environ.get("GATEWAY_TEST_TARGET", "gateway") == "sim":
            yield Gateway(sim_url, sim_api_key, sim_url, None, [directory / "provider-sim.log"])
            return
        server, base, admin_url = start_ratelimiterd(directory, gateway, {**env, "ACME_GATEWAY_KEY": TENANT_KEY})
        processes.append(server)
        yield Gateway(base, TENANT_KEY, sim_url, admin_url, [directory / "ratelimiterd.log"])
    finally:
        for process in reversed(processes):
            stop(process)


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    directory = tmp_path_factory.mktemp("gateway")
    sim, sim_url = start_sim(directory)
    with serve(directory, sim, sim_url, UPSTREAM_KEY, gateway_section(sim_url),
               {**os.environ, "SIM_UPSTREAM_KEY": UPSTREAM_KEY}) as gateway:
        yield gateway
