"""Learning from a provider's headers (issue 19, item 4): reading them, reporting the
limits configured above the provider's, pausing a model after a 429, in process and
against ratelimiterd; and llm_limits using a provider's profile by default."""

from __future__ import annotations

import asyncio
import json
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Iterator

import pytest
from conftest import serve

from llm_ratelimiter import (
    ArgumentTypeError,
    InvalidArgumentError,
    LimitMismatch,
    Limiter,
    ProviderLimit,
    RemoteLimiter,
    Scheduler,
    llm_limits,
    read_provider_headers,
)

RPM = "global:llm:openai:gpt-4o-headers:rpm"
TPM = "global:llm:openai:gpt-4o-headers:tpm"
#: How long the fake provider asks to wait after its 429, in ms.
PROVIDER_WAIT_MS = 400


class Refusing(BaseHTTPRequestHandler):
    """An OpenAI-shaped provider that refuses its first call with a 429 and its
    headers, then answers."""

    calls = 0

    def do_POST(self) -> None:  # noqa: N802 (the handler's name is http.server's)
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        Refusing.calls += 1
        refused = Refusing.calls == 1
        body = json.dumps({"error": {"type": "requests", "code": "rate_limit_exceeded"}} if refused else
                          {"usage": {"prompt_tokens": 5, "completion_tokens": 5, "total_tokens": 10}}).encode()
        self.send_response(429 if refused else 200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("x-ratelimit-limit-requests", "500")
        self.send_header("x-ratelimit-remaining-requests", "0" if refused else "499")
        self.send_header("x-ratelimit-reset-requests", "6m0s")
        if refused:
            self.send_header("retry-after-ms", str(PROVIDER_WAIT_MS))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture()
def provider_url() -> Iterator[str]:
    Refusing.calls = 0
    server = ThreadingHTTPServer(("127.0.0.1", 0), Refusing)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def call(limiter: Limiter, provider_url: str, timeout_s: float) -> int:
    """One call under llm_call; every answer, a 429 included, goes to observe_response."""
    with limiter.llm_call("openai", "gpt-4o-headers", "acme", "Hello there", 10, prompt_tokens=2,
                          timeout_s=timeout_s) as lease:
        request = urllib.request.Request(f"{provider_url}/v1/chat/completions", data=b"{}", method="POST")
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                limiter.observe_response("openai", "gpt-4o-headers", response.status, response.headers)
                lease.record_usage(json.load(response)["usage"])
                return response.status
        except urllib.error.HTTPError as error:
            limiter.observe_response("openai", "gpt-4o-headers", error.code, error.headers)
            return error.code


def test_headers_are_read_by_the_library() -> None:
    read = read_provider_headers({
        "X-RateLimit-Limit-Requests": "500", "x-ratelimit-remaining-requests": "0",
        "x-ratelimit-reset-requests": "1.5s", "x-ratelimit-limit-tokens": "not a number",
    })
    assert read.limits == (ProviderLimit("rpm", 500, 0, 1_500),)
    assert read.retry_after_ms is None and read.pause_ms == 1_500, "the exhausted limit's reset"
    anthropic = read_provider_headers([("anthropic-ratelimit-output-tokens-limit", "8000"), ("retry-after", "2"),
                                       (b"retry-after-ms", b"250")])
    assert anthropic.limits == (ProviderLimit("otpm", 8_000, None, None),)
    assert anthropic.retry_after_ms == 250 and anthropic.pause_ms == 250
    assert read_provider_headers({}).pause_ms == 1_000, "a 429 that names no time pauses 1 s"
    assert read_provider_headers({"retry-after": "86400"}).pause_ms == 600_000, "at most ten minutes"
    for bad in ("retry-after: 1", 7, [("only-a-name",)], [(1, "2")]):
        with pytest.raises(ArgumentTypeError):
            read_provider_headers(bad)


def test_limits_above_the_providers_are_reported() -> None:
    # 600 RPM under OpenAI's profile is 10 a second, 600 a minute: above the 500 the provider says.
    limiter = Limiter(llm_limits("openai", "gpt-4o-headers", rpm=600, tpm=30_000))
    headers = {"x-ratelimit-limit-requests": "500", "x-ratelimit-limit-tokens": "30000"}
    assert limiter.limits_above_provider("openai", "gpt-4o-headers", headers) == [
        LimitMismatch(key=RPM, configured_per_minute=600, provider_limit=500)
    ]
    assert limiter.limits_above_provider("openai", "gpt-4o-headers", {"x-ratelimit-limit-requests": "600"}) == []
    assert limiter.limits_above_provider("openai", "other-model", headers) == []
    mismatches = limiter.observe_response("openai", "gpt-4o-headers", 200, headers)
    assert [m.key for m in mismatches] == [RPM] and limiter.paused_s("openai", "gpt-4o-headers") == 0


def test_a_429_pauses_the_model_and_a_waiting_call_outlasts_its_timeout(provider_url: str) -> None:
    limiter = Limiter(llm_limits("openai", "gpt-4o-headers", rpm=600, tpm=100_000))
    assert call(limiter, provider_url, timeout_s=1) == 429
    left_s = limiter.paused_s("openai", "gpt-4o-headers")
    assert 0 < left_s <= PROVIDER_WAIT_MS / 1000, "the provider's retry-after-ms, not its 6 min reset"
    rpm, tpm = limiter.limit(RPM), limiter.limit(TPM)
    assert rpm.in_use == rpm.definition.capacity and tpm.in_use == tpm.definition.capacity, "every key is held"
    started = time.monotonic()
    # The pause is longer than this call's timeout: the wait counts its timeout from the pause's end.
    assert call(limiter, provider_url, timeout_s=0.05) == 200
    assert time.monotonic() - started >= left_s - 0.05, "the call waited the pause out"
    assert limiter.paused_s("openai", "gpt-4o-headers") == 0
    deadline = time.monotonic() + 5
    while limiter.limit(TPM).in_use >= 100 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert limiter.limit(TPM).in_use < 100, "the pause's holds are gone; only the two calls' tokens stay"


#: A rolling and concurrency jitter far past any pause of these tests: every hint of a
#: paused key reaches past a short deadline, as a default 50 ms jitter does by chance.
JITTER_MS_LONG = 60_000


@pytest.fixture(scope="module")
def jittery_server_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    policy = (f"retry_policy:\n  rolling:\n    jitter_ms: {JITTER_MS_LONG}\n"
              f"  concurrency:\n    jitter_ms: {JITTER_MS_LONG}\n")
    yield from serve(tmp_path_factory.mktemp("jittery"), policy)


@pytest.mark.parametrize("waiting", ["sync", "async"])
def test_a_wait_on_a_paused_model_outlasts_a_hint_jittered_past_its_deadline(
    jittery_server_url: str, waiting: str
) -> None:
    # The holds of a pause end with it; the backend's hint adds its jitter to their end.
    # A wait counting its timeout from the pause's end tries again at its deadline,
    # when the holds are gone, rather than giving up at a hint past it.
    limiter = RemoteLimiter(jittery_server_url)
    model = f"jittery-{waiting}"
    limiter.define_many(llm_limits("r", model, rpm=50, tpm=1_000, concurrency=5))
    requirements = [(f"global:llm:r:{model}:{dimension}", amount)
                    for dimension, amount in (("rpm", 1), ("tpm", 10), ("concurrency", 1))]
    limiter.pause_model("r", model, duration_s=0.3)
    # A hint is the holds' end plus a jitter of 0..60 s: three in a row all under 0.1 s
    # past the end would take odds of about one in 200 million.
    denials = [limiter.reserve(requirements) for _ in range(3)]
    assert not any(denials), "the pause holds the model"
    hints_ms = [denial.retry_after_ms for denial in denials]
    assert max(hints_ms) > 300 + 100, f"the jitter reaches past the wait's deadline: {hints_ms}"
    started = time.monotonic()
    if waiting == "sync":
        granted = limiter.reserve_wait(requirements, timeout_s=0.1)
    else:
        granted = asyncio.run(limiter.areserve_wait(requirements, timeout_s=0.1))
    assert granted, "granted once the pause's holds ended"
    assert time.monotonic() - started < 1.5, "at the deadline, not at the jittered hint"
    limiter.complete(granted.lease_id, [])


def test_bad_pause_arguments_change_nothing() -> None:
    limiter = Limiter(llm_limits("openai", "gpt-4o-headers", rpm=600, tpm=100_000))
    for kwargs, error in (({}, ArgumentTypeError), ({"duration_s": 0}, InvalidArgumentError),
                          ({"duration_s": 601}, InvalidArgumentError), ({"duration_s": "1"}, ArgumentTypeError)):
        with pytest.raises(error):
            limiter.pause_model("openai", "gpt-4o-headers", **kwargs)
    assert limiter.limit(RPM).in_use == 0 and limiter.paused_s("openai", "gpt-4o-headers") == 0


def test_the_scheduler_waits_a_pause_out() -> None:
    async def main() -> None:
        limiter = Limiter(llm_limits("openai", "sched-headers", rpm=600, tpm=100_000))
        limiter.pause_model("openai", "sched-headers", duration_s=0.3)
        started = time.monotonic()

        async def provider_call() -> int:
            return 4

        async with Scheduler(limiter, workers=2) as scheduler:
            result = await scheduler.submit(provider_call, provider="openai", model="sched-headers",
                                            tenant_id="acme", prompt="Hi", max_tokens=5, prompt_tokens=1)
        assert result.used_tokens == 4
        assert time.monotonic() - started >= 0.25, "the job ran after the pause, not before"

    asyncio.run(main())


def test_a_remote_pause_holds_for_every_client_of_the_server(server_url: str) -> None:
    admin = RemoteLimiter(server_url)
    admin.define_many(llm_limits("r", "paused", rpm=50, tpm=1_000, concurrency=5))
    keys = [f"global:llm:r:paused:{dimension}" for dimension in ("rpm", "tpm", "concurrency")]
    admin.reserve([(keys[0], 1), (keys[1], 100)])
    assert admin.pause_model("r", "paused", duration_s=0.5) == 0.5
    assert [admin.limit(key).in_use for key in keys] == [50, 1_000, 5], "probing held all the free capacity"
    other = RemoteLimiter(server_url)
    denied = other.reserve([(keys[0], 1)])
    assert not denied and 0 < denied.retry_after_ms <= 1_100, "the pause's time, not the minute"
    deadline = time.monotonic() + 6
    while [admin.limit(key).in_use for key in keys] != [1, 100, 0] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [admin.limit(key).in_use for key in keys] == [1, 100, 0], "the pause ended by itself"


def test_llm_limits_uses_the_providers_profile_by_default() -> None:
    assert llm_limits("openai", "m", rpm=500, tpm=200_000) == llm_limits("openai", "m", rpm=500, tpm=200_000,
                                                                         profile=True)
    plain = llm_limits("openai", "m", rpm=500, tpm=200_000, concurrency=5, profile=False)
    assert [d.window_seconds for d in plain] == [60, 60, 0]
    assert [d.window_seconds for d in llm_limits("p", "m", rpm=5, tpm=50, concurrency=1)] == [60, 60, 0]
    with pytest.raises(InvalidArgumentError):
        llm_limits("p", "m", rpm=5, tpm=50, profile=True)
    with pytest.raises(ArgumentTypeError):
        llm_limits("openai", "m", rpm=500, tpm=200_000, profile=False)  # plain windows need concurrency
