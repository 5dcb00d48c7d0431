"""The remote client's trace context: the current OpenTelemetry span's
``traceparent`` sent with reserve and complete when ``opentelemetry-api`` is
installed, nothing sent (and nothing failing) without it or without a span."""

from __future__ import annotations

import asyncio
import http.server
import sys
import threading
from typing import Iterator, List, Tuple

import pytest
from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

from llm_ratelimiter import InvalidArgumentError, RemoteLimiter, _native, _tracing

TRACE_ID = 0x4BF92F3577B34DA6A3CE929D0E0E4736
SPAN_ID = 0x00F067AA0BA902B7
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@pytest.fixture
def fake_server() -> Iterator[Tuple[str, List[dict]]]:
    """A stand-in for ratelimiterd answering reserve and complete, recording each request's headers."""
    seen: List[dict] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (the stdlib's name)
            self.rfile.read(int(self.headers.get("content-length", 0)))
            seen.append({k.lower(): v for k, v in self.headers.items()})
            body = b'{"ok":true}' if self.path == "/v1/complete" else (
                b'{"allowed":true,"retry_after_ms":0,"reserved_at_unix_ms":1234}')
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        _tracing.forget()


def _current_span() -> NonRecordingSpan:
    return NonRecordingSpan(SpanContext(TRACE_ID, SPAN_ID, is_remote=False, trace_flags=TraceFlags(1)))


def test_the_current_spans_context_is_sent(fake_server: Tuple[str, List[dict]]) -> None:
    url, seen = fake_server
    limiter = RemoteLimiter(url)
    with trace.use_span(_current_span()):
        reservation = limiter.reserve([("global:rpm", 1)])
        limiter.complete(reservation.lease_id, [("global:rpm", 1)])

        async def twins() -> None:
            reserved = await limiter.areserve([("global:rpm", 1)])
            await limiter.acomplete(reserved.lease_id)

        asyncio.run(twins())
    limiter.reserve([("global:rpm", 1)])  # no current span: nothing sent
    assert [h.get("traceparent") for h in seen] == [TRACEPARENT] * 4 + [None]


def test_without_opentelemetry_nothing_is_sent_and_nothing_fails(
    fake_server: Tuple[str, List[dict]], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, seen = fake_server
    # As if the package were not installed: its import raises ImportError.
    monkeypatch.setitem(sys.modules, "opentelemetry.trace.propagation.tracecontext", None)
    _tracing.forget()
    limiter = RemoteLimiter(url)
    with trace.use_span(_current_span()):
        assert limiter.reserve([("global:rpm", 1)]).allowed
    assert "traceparent" not in seen[0]


def test_a_malformed_traceparent_is_refused_not_sent(fake_server: Tuple[str, List[dict]]) -> None:
    url, seen = fake_server
    native = _native.RemoteLimiter([url])
    with pytest.raises(InvalidArgumentError, match="traceparent"):
        native.reserve([("global:rpm", 1)], traceparent="00-not-a-trace-01")
    assert seen == []
