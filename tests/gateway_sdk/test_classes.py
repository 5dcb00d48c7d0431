"""Priority classes with the real openai SDK and two tenant keys (docs/gateway.md,
"Classes"): the batch tenant takes its ceiling and gets the SDK's RateLimitError past
it, the interactive tenant then takes the headroom, a lower class asked by header runs
on the batch ceiling, and a higher one is the SDK's PermissionDeniedError."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Iterator

import openai
import pytest

from conftest import UPSTREAM_KEY, http, start_ratelimiterd, start_sim, stop

#: The two tenants' gateway keys.
WEB_KEY = "gw-web-key-0123456789abcdef"
ETL_KEY = "gw-etl-key-0123456789abcdef"
#: The model's requests per minute; interactive keeps 20 % of them as headroom.
RPM = 10
BATCH_CEILING = "class:batch:global:llm:openai:gpt-4o-mini:rpm"


class Classes:
    """A ratelimiterd whose gateway has two classes, in front of provider-sim."""

    def __init__(self, directory: Path) -> None:
        self.processes: list[subprocess.Popen] = []
        sim, sim_url = start_sim(directory)
        self.processes.append(sim)
        env = {**os.environ, "WEB_GATEWAY_KEY": WEB_KEY, "ETL_GATEWAY_KEY": ETL_KEY,
               "SIM_UPSTREAM_KEY": UPSTREAM_KEY}
        server, base, self.admin_url = start_ratelimiterd(directory, f"""  upstreams:
    - {{name: openai, kind: openai, base_url: "{sim_url}", api_key_env: SIM_UPSTREAM_KEY}}
  models:
    - {{name: gpt-4o-mini, upstream: openai, rpm: {RPM}, tpm: 1000000}}
  classes:
    - {{name: interactive, share: 4, headroom: 0.2}}
    - {{name: batch, share: 1}}
  tenants:
    - {{name: web, api_key_env: WEB_GATEWAY_KEY, class: interactive}}
    - {{name: etl, api_key_env: ETL_GATEWAY_KEY, class: batch}}
""", env)
        self.processes.append(server)
        self.base_url = f"{base}/v1"

    def in_use(self, key: str) -> int:
        status, _, body = http("GET", f"{self.admin_url}/v1/admin/limits/{key}")
        assert status == 200, body
        return json.loads(body)["in_use"]

    def close(self) -> None:
        for process in reversed(self.processes):
            stop(process)


@pytest.fixture
def classes(tmp_path: Path) -> Iterator[Classes]:
    if os.environ.get("GATEWAY_TEST_TARGET", "gateway") == "sim":
        pytest.skip("needs the gateway (GATEWAY_TEST_TARGET=sim)")
    started = Classes(tmp_path)
    try:
        yield started
    finally:
        started.close()


def chat(client: openai.OpenAI, **extra: object) -> None:
    client.chat.completions.create(model="gpt-4o-mini", max_tokens=4,
                                   messages=[{"role": "user", "content": "Hi"}], **extra)


def test_batch_takes_its_ceiling_and_interactive_the_headroom(classes: Classes) -> None:
    web = openai.OpenAI(base_url=classes.base_url, api_key=WEB_KEY, max_retries=0)
    etl = openai.OpenAI(base_url=classes.base_url, api_key=ETL_KEY, max_retries=0)
    for _ in range(RPM * 8 // 10):
        chat(etl)
    with pytest.raises(openai.RateLimitError) as refused:
        chat(etl)
    assert BATCH_CEILING in str(refused.value)
    assert classes.in_use(BATCH_CEILING) == RPM * 8 // 10
    # The headroom is the interactive tenant's, but not when it asks to run as batch.
    with pytest.raises(openai.RateLimitError):
        chat(web, extra_headers={"x-ratelimit-class": "batch"})
    for _ in range(RPM * 2 // 10):
        chat(web)
    # A higher class than the tenant's own is refused, in OpenAI's shape.
    with pytest.raises(openai.PermissionDeniedError):
        chat(etl, extra_headers={"x-ratelimit-class": "interactive"})
    assert classes.in_use("global:llm:openai:gpt-4o-mini:rpm") == RPM
