"""Limit definitions and reports: the admin API's JSON as typed Python values.

Validation is the Rust library's: a definition is checked when it is defined,
and a wrong field raises :class:`~llm_ratelimiter.errors.InvalidArgumentError`.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any, Dict, List, Literal, Mapping, NamedTuple, Optional, Tuple, Union

from . import _native

__all__ = ["Requirement", "Actual", "LimitDefinition", "LimitReport", "llm_limits", "DefinitionLike"]

#: What a limit does with usage above its reservation at Complete.
Overage = Literal["none", "debt", "owe"]
#: How a limit replenishes: ``rolling`` (each reservation held for the window),
#: ``concurrency`` (held until Complete) or ``bucket`` (a token bucket refilled over the
#: window, as Anthropic enforces its limits: the repository's docs/bucket-limits.md).
LimitKind = Literal["rolling", "concurrency", "bucket"]

#: The provider's per-minute window, as it documents it: the limiter holds each
#: rolling reservation for the window plus its window margin (by default 50 ms, or 0.4 % of the window when longer),
#: which covers the moment between the grant and the provider receiving the call
#: (BENCHMARKS.md, "Window margin" in the repository).
WINDOW_SECONDS_PER_MINUTE_LIMIT = 60
#: How long a concurrency hold lives when its caller crashed before Complete.
CONCURRENCY_TIMEOUT_SECONDS_DEFAULT = 300


class Requirement(NamedTuple):
    """One limit a call needs, with the units it needs (at least 1)."""

    key: str
    amount: int


class Actual(NamedTuple):
    """What a finished call really used on one rolling limit it reserved."""

    key: str
    actual_amount: int


@dataclass(frozen=True)
class LimitDefinition:
    """A limit: ``capacity`` units per ``window_seconds`` (rolling), at once
    (concurrency, each hold released at Complete or after ``timeout_seconds``), or a
    token bucket of ``capacity`` refilled over ``window_seconds`` (bucket)."""

    key: str
    kind: LimitKind
    capacity: int
    window_seconds: int = 0
    timeout_seconds: int = 0
    unit: str = ""
    description: str = ""
    overage: Overage = "none"
    #: Rolling: ms each reservation is held beyond ``window_seconds`` (the provider's
    #: window starts when the call reaches it); bucket: the same time, taken out of the
    #: burst; ``None``: the limiter's default (50 ms, or 0.4 % of the window when longer).
    window_margin_ms: Optional[int] = None

    @classmethod
    def rolling(
        cls, key: str, capacity: int, window_seconds: int, *, unit: str = "", description: str = "",
        overage: Overage = "none", window_margin_ms: Optional[int] = None,
    ) -> "LimitDefinition":
        """A rolling limit: each reservation holds its amount for ``window_seconds`` plus
        the window margin."""
        return cls(key, "rolling", capacity, window_seconds, 0, unit, description, overage, window_margin_ms)

    @classmethod
    def concurrency(
        cls, key: str, capacity: int, timeout_seconds: int, *, unit: str = "", description: str = "",
    ) -> "LimitDefinition":
        """A concurrency limit: each hold lasts until Complete, or ``timeout_seconds``
        when the caller crashed."""
        return cls(key, "concurrency", capacity, 0, timeout_seconds, unit, description)

    @classmethod
    def bucket(
        cls, key: str, capacity: int, window_seconds: int, *, unit: str = "", description: str = "",
        overage: Overage = "none", window_margin_ms: Optional[int] = None,
    ) -> "LimitDefinition":
        """A token bucket, as Anthropic enforces its limits: full at the start, each
        reservation takes its amount at once, and it refills at ``capacity`` per
        ``window_seconds``. One reservation takes at most its burst, ``capacity`` less a
        sixtieth of the window's refill and the margin's (more is denied for ever); a
        bucket that keeps no burst (such as capacity 1 over 1 s) is an
        :class:`~llm_ratelimiter.errors.InvalidArgumentError` when defined."""
        return cls(key, "bucket", capacity, window_seconds, 0, unit, description, overage, window_margin_ms)

    def to_json(self) -> str:
        """The admin API's JSON body; ``window_margin_ms`` only when given."""
        return json.dumps({name: value for name, value in asdict(self).items() if value is not None})


#: A definition, or its JSON object as a mapping (the registry file's entries).
DefinitionLike = Union[LimitDefinition, Mapping[str, Any]]


def definition_json(definition: DefinitionLike) -> str:
    """The JSON of a definition given as a :class:`LimitDefinition` or a mapping."""
    if isinstance(definition, LimitDefinition):
        return definition.to_json()
    if isinstance(definition, Mapping):
        return json.dumps(dict(definition))
    from .errors import ArgumentTypeError

    raise ArgumentTypeError(
        f"definition must be a LimitDefinition or a mapping, got {type(definition).__name__}", field="definition"
    )


@dataclass(frozen=True)
class LimitReport:
    """A limit's definition, admin status and live usage."""

    definition: LimitDefinition
    #: ``active``, or ``decreasing`` while usage is above a lowered capacity.
    status: str
    #: The capacity a decrease is heading to; 0 when none is pending.
    pending_decrease_to: int
    #: Units held now: live rolling reservations or concurrency holds; for a bucket, what
    #: it lacks of its burst (taken and not yet refilled or given back).
    in_use: int
    #: Usage recorded above reservations under ``overage="debt"`` or ``"owe"``.
    debt: int
    #: True while an ``overage="owe"`` limit refuses every reservation: usage it could
    #: not hold belongs to a window or period that has not ended.
    owing: bool = False

    @classmethod
    def from_json(cls, text: str) -> "LimitReport":
        """Reads one report as the limiter answers it."""
        return cls.from_mapping(json.loads(text))

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> "LimitReport":
        """Reads one decoded report."""
        fields = {name: data[name] for name in LimitDefinition.__dataclass_fields__ if name in data}
        return cls(
            definition=LimitDefinition(**fields),
            status=data.get("status", "active"),
            pending_decrease_to=data.get("pending_decrease_to", 0),
            in_use=data.get("in_use", 0),
            debt=data.get("debt", 0),
            owing=data.get("owing", False),
        )


#: The providers whose profile :func:`llm_limits` uses by default (docs/provider-profiles.md).
PROFILE_PROVIDERS = frozenset({"openai", "azure", "anthropic", "gemini", "bedrock"})

#: The provider profiles :func:`llm_limits` defined in this process, by (provider, model):
#: the published limits as JSON. :class:`~llm_ratelimiter.LlmCall` of that provider and model
#: reserves and completes by the profile's rules.
_PROFILES: Dict[Tuple[str, str], str] = {}


def profile_of(provider: str, model: str) -> Optional[str]:
    """The published limits of ``provider``'s ``model`` when :func:`llm_limits` defined its
    profile in this process, as JSON; else ``None``."""
    return _PROFILES.get((provider, model))


def llm_limits(
    provider: str,
    model: str,
    *,
    rpm: Optional[int] = None,
    tpm: Optional[int] = None,
    concurrency: Optional[int] = None,
    window_seconds: int = WINDOW_SECONDS_PER_MINUTE_LIMIT,
    timeout_seconds: int = CONCURRENCY_TIMEOUT_SECONDS_DEFAULT,
    profile: Optional[bool] = None,
    input_tpm: Optional[int] = None,
    output_tpm: Optional[int] = None,
    rpd: Optional[int] = None,
    largest_request_tokens: Optional[int] = None,
) -> List[LimitDefinition]:
    """The limits of one model, keyed as :func:`LlmCall.requirements` reserves them.

    By default a provider with a profile (``"openai"``, ``"azure"``, ``"anthropic"``,
    ``"gemini"``, ``"bedrock"``: :data:`PROFILE_PROVIDERS`) gets its profile, since the
    numbers it publishes, enforced as plain minute windows, meet its 429s; any other
    provider gets plain windows. ``profile=False``: requests and tokens per window
    (``rpm``, ``tpm``) and calls in flight (``concurrency``), all three required.
    ``profile=True`` asks for the profile (an unknown provider is an
    :class:`InvalidArgumentError`). With a profile the numbers are the ones the provider
    publishes (Anthropic: ``rpm``, ``input_tpm``, ``output_tpm``; Gemini may add
    ``rpd``; Azure's ``rpm`` defaults to 6 per 1,000 ``tpm``); the definitions are the
    library's profile, which stays inside the provider's enforcement (OpenAI's
    per-second quantization, Anthropic's separate input and output limits as token buckets: the
    repository's docs/provider-profiles.md), and from then on every ``LlmCall`` of that
    provider and model in this process reserves and completes by the profile's rules."""
    if profile is None:
        profile = provider in PROFILE_PROVIDERS
    if profile:
        published = {
            "rpm": rpm, "tpm": tpm, "input_tpm": input_tpm, "output_tpm": output_tpm, "rpd": rpd,
            "concurrency": concurrency, "largest_request_tokens": largest_request_tokens,
        }
        text = json.dumps({name: value for name, value in published.items() if value is not None})
        definitions = [LimitDefinition(**fields) for fields in json.loads(_native.llm_profile(provider, model, text))]
        _PROFILES[(provider, model)] = text
        return definitions
    for name, value in (("rpm", rpm), ("tpm", tpm), ("concurrency", concurrency)):
        if value is None:
            from .errors import ArgumentTypeError

            raise ArgumentTypeError(f"{name} is required without a profile", field=name)
    # Plain windows replace a profile this model had: the latest definitions decide.
    _PROFILES.pop((provider, model), None)
    keys = [key for key, _ in _native.llm_requirements(provider, model, "any", "", 1)]
    rpm_key, tpm_key, concurrency_key = keys
    return [
        LimitDefinition.rolling(rpm_key, rpm, window_seconds, unit="requests"),
        LimitDefinition.rolling(tpm_key, tpm, window_seconds, unit="tokens"),
        LimitDefinition.concurrency(concurrency_key, concurrency, timeout_seconds, unit="inflight"),
    ]
