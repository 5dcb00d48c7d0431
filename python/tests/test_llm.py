"""The LLM helper, with a local fake provider answering OpenAI-shaped JSON."""

from __future__ import annotations

import json
import threading
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Iterator

import pytest

from llm_ratelimiter import InvalidArgumentError, Limiter, LlmCall, llm_limits, usage_tokens


class FakeOpenAI(BaseHTTPRequestHandler):
    """POST /v1/chat/completions: a canned answer whose usage counts words."""

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        prompt_tokens = len(body["messages"][0]["content"].split())
        answer = {
            "object": "chat.completion",
            "model": body["model"],
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok " * 7}}],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": 7, "total_tokens": prompt_tokens + 7},
        }
        data = json.dumps(answer).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture()
def provider_url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeOpenAI)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


class WordTokenizer:
    """Stands in for a tiktoken Encoding: encode() returns the tokens."""

    def encode(self, text: str) -> list:
        return text.split()


def test_requirements_follow_the_library() -> None:
    call = LlmCall.create("openai", "gpt-4o", "acme", "héllo", 800, daily_budget=True)
    assert call.requirements() == [
        ("global:llm:openai:gpt-4o:rpm", 1),
        ("global:llm:openai:gpt-4o:tpm", 806),  # one token per prompt byte
        ("global:llm:openai:gpt-4o:concurrency", 1),
        ("tenant:acme:llm:daily_tokens", 806),
    ]
    counted = LlmCall.create("openai", "gpt-4o", "acme", "the cat sat", 800, tokenizer=WordTokenizer())
    assert counted.prompt_tokens == 3 and counted.token_upper_bound == 803
    assert counted.actuals(40) == [("global:llm:openai:gpt-4o:tpm", 40)]
    with pytest.raises(InvalidArgumentError):
        LlmCall.create("open:ai", "gpt-4o", "acme", "x", 1)
    with pytest.raises(InvalidArgumentError) as info:
        LlmCall.create("openai", "gpt-4o", "acme", "x", -1)
    assert info.value.field == "max_tokens"


def test_usage_shapes() -> None:
    assert usage_tokens(12) == 12
    assert usage_tokens({"usage": {"total_tokens": 9}}) == 9
    assert usage_tokens({"prompt_tokens": 2, "completion_tokens": 3}) == 5
    assert usage_tokens({"input_tokens": 4, "output_tokens": 1}) == 5
    with pytest.raises(TypeError):
        usage_tokens({"nothing": 1})


def test_a_call_to_the_provider_is_reconciled_to_its_usage(provider_url: str) -> None:
    limiter = Limiter(llm_limits("openai", "gpt-4o", rpm=100, tpm=10_000, concurrency=4, profile=False))
    prompt = "Summarise the design in one line"
    with limiter.llm_call("openai", "gpt-4o", "acme", prompt, 200, tokenizer=WordTokenizer()) as lease:
        assert limiter.limit("global:llm:openai:gpt-4o:tpm").in_use == 6 + 200
        request = urllib.request.Request(
            f"{provider_url}/v1/chat/completions",
            data=json.dumps({"model": "gpt-4o", "max_tokens": 200,
                             "messages": [{"role": "user", "content": prompt}]}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=5) as response:
            assert lease.record_usage(json.load(response)["usage"]) == 13
    assert limiter.limit("global:llm:openai:gpt-4o:tpm").in_use == 13
    assert limiter.limit("global:llm:openai:gpt-4o:concurrency").in_use == 0
