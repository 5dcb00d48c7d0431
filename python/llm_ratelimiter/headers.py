"""Learning from a provider's answer: its rate-limit headers (``x-ratelimit-*`` of
OpenAI and Azure, ``anthropic-ratelimit-*``, ``retry-after``, ``retry-after-ms``)
read by the Rust library, the limits configured above the provider's, and the
pause a 429 asks for (the repository's docs/provider-profiles.md, "Learning from
the headers")."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, List, Mapping, Optional, Tuple, Union

from . import _native
from .errors import ArgumentTypeError

__all__ = ["HeadersLike", "LimitMismatch", "ProviderHeaders", "ProviderLimit", "read_provider_headers"]

#: A response's headers: a mapping (``dict``, ``httpx.Headers``, ``requests``'
#: headers: anything with ``items()``) or a sequence of ``(name, value)`` pairs.
HeadersLike = Union[Mapping[str, str], Any]

#: The most headers read from one response, as the library reads them.
HEADERS_MAX = 256


@dataclass(frozen=True)
class ProviderLimit:
    """What the headers say about one of the provider's limits."""

    #: ``rpm``, ``tpm``, ``itpm`` or ``otpm``, as in the limiter's keys.
    dimension: str
    #: The provider's limit, when sent.
    limit: Optional[int]
    #: What it has left, when sent.
    remaining: Optional[int]
    #: Milliseconds until the limit is back, when sent.
    reset_ms: Optional[int]


@dataclass(frozen=True)
class ProviderHeaders:
    """What a response's rate-limit headers say."""

    #: Each limit the headers named.
    limits: Tuple[ProviderLimit, ...]
    #: ``retry-after-ms``, else ``retry-after``, in ms; ``None`` when not sent.
    retry_after_ms: Optional[int]
    #: How long a 429 with these headers pauses the model, in ms: the retry hint,
    #: else the resets, else 1 s; at most ten minutes.
    pause_ms: int


@dataclass(frozen=True)
class LimitMismatch:
    """A limit configured above the provider's own: expect its 429s."""

    #: The limit's key.
    key: str
    #: Its capacity per minute as configured (a sub-window scaled to the minute).
    configured_per_minute: int
    #: The provider's limit per minute, from its headers.
    provider_limit: int


def header_pairs(headers: HeadersLike) -> List[Tuple[str, str]]:
    """``headers`` as ``(name, value)`` pairs of ``str``; bytes are decoded as Latin-1,
    as HTTP header values are."""
    items = headers.items() if hasattr(headers, "items") else headers
    if isinstance(items, (str, bytes)):
        raise ArgumentTypeError(f"headers must be a mapping or (name, value) pairs, got {type(headers).__name__}",
                                field="headers")
    try:
        pairs = list(items)
    except TypeError:
        raise ArgumentTypeError(f"headers must be a mapping or (name, value) pairs, got {type(headers).__name__}",
                                field="headers") from None
    out = []
    for pair in pairs[:HEADERS_MAX]:
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise ArgumentTypeError(f"headers must hold (name, value) pairs, got {type(pair).__name__}",
                                    field="headers")
        name, value = (part.decode("latin-1") if isinstance(part, bytes) else part for part in pair)
        if not isinstance(name, str) or not isinstance(value, str):
            raise ArgumentTypeError("header names and values must be str or bytes", field="headers")
        out.append((name, value))
    return out


def read_provider_headers(headers: HeadersLike) -> ProviderHeaders:
    """Reads a response's rate-limit headers. Values that are not numbers (durations
    or instants, for resets) are ignored: a provider's header is advice."""
    data = json.loads(_native.read_provider_headers(header_pairs(headers)))
    limits = tuple(ProviderLimit(**limit) for limit in data["limits"])
    return ProviderHeaders(limits=limits, retry_after_ms=data["retry_after_ms"], pause_ms=data["pause_ms"])


def mismatches_from_json(text: str) -> List[LimitMismatch]:
    """The library's answer to a comparison, as :class:`LimitMismatch` values."""
    return [LimitMismatch(**row) for row in json.loads(text)]
