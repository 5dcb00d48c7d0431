"""The caller's OpenTelemetry trace context, for the remote client's requests.

When ``opentelemetry-api`` is installed and a span is current, its W3C
``traceparent`` (and ``tracestate``) go with each reserve and complete, so that
``ratelimiterd``'s span of the call joins the caller's trace (docs/observability.md,
"The limiter's API"). The package is never a dependency: without it, or
without a current span, nothing is sent and nothing fails.
"""

from __future__ import annotations

from typing import Any, Dict, Optional

#: The W3C propagator once looked up: ``None`` before, ``False`` when
#: ``opentelemetry-api`` is not installed (looked up once, not on every call).
_propagator: Any = None


def trace_kwargs() -> Dict[str, Optional[str]]:
    """The ``traceparent`` and ``tracestate`` keywords of the current span, if any."""
    global _propagator
    if _propagator is None:
        try:
            from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
        except ImportError:
            _propagator = False
        else:
            _propagator = TraceContextTextMapPropagator()
    if _propagator is False:
        return {}
    carrier: Dict[str, str] = {}
    _propagator.inject(carrier)
    traceparent = carrier.get("traceparent")
    if traceparent is None:
        return {}
    return {"traceparent": traceparent, "tracestate": carrier.get("tracestate")}


def forget() -> None:
    """Looks the propagator up again on the next call (for tests that hide the package)."""
    global _propagator
    _propagator = None
