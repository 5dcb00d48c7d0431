"""Type stubs of the Rust extension module ``llm_ratelimiter._native``."""

from typing import Any, Callable, List, Optional, Sequence, Tuple, Union

_Pairs = Sequence[Tuple[str, int]]
_Callback = Callable[[Any, Optional[BaseException]], None]

REQUIREMENTS_MAX: int
PAUSE_MS_MAX: int

def new_lease_id() -> str:
    """A fresh lease id (a ULID)."""

def llm_requirements(
    provider: str, model: str, tenant_id: str, prompt: str, max_tokens: int, *,
    prompt_tokens: Optional[int] = None, daily_budget: bool = False,
) -> List[Tuple[str, int]]:
    """rpm 1, tpm the token upper bound, concurrency 1, and the daily budget when asked."""

def llm_actuals(
    provider: str, model: str, tenant_id: str, used_tokens: int, *, daily_budget: bool = False
) -> List[Tuple[str, int]]:
    """The token limits reconciled to ``used_tokens``."""

def llm_profile(provider: str, model: str, published_json: str) -> str:
    """The definitions of a provider's profile for ``model``, as a JSON array (each
    ``kind`` ``rolling``, ``concurrency`` or ``bucket``: Anthropic's limits are buckets)."""

def profile_requirements(
    provider: str, model: str, published_json: str, prompt: str, max_tokens: int, *,
    prompt_tokens: Optional[int] = None,
) -> List[Tuple[str, int]]:
    """What one call reserves under the profile."""

def profile_actuals(
    provider: str, model: str, published_json: str, prompt: str, max_tokens: int, used_tokens: int, *,
    prompt_tokens: Optional[int] = None,
) -> List[Tuple[str, int]]:
    """What one call that used ``used_tokens`` completes with under the profile."""

def read_provider_headers(headers: List[Tuple[str, str]]) -> str:
    """A response's rate-limit headers as the library reads them, as JSON."""

def limits_above_provider(headers: List[Tuple[str, str]], provider: str, model: str, definitions_json: str) -> str:
    """The definitions configured above the provider's limits, as a JSON array."""

class Denial:
    """Why a reservation was not granted."""

    @property
    def reason(self) -> str:
        """insufficient_capacity, limit_decreasing, exceeds_capacity or lease_already_failed."""
    @property
    def key(self) -> Optional[str]:
        """The limit that denied; None for lease_already_failed."""
    @property
    def retry_after_ms(self) -> int:
        """When to retry with a new lease id; 0 when waiting cannot help (more than a
        limit's capacity, or than a bucket's burst)."""
    @property
    def is_final(self) -> bool:
        """True when this lease id can never be granted (exceeds_capacity, lease_already_failed)."""
    @property
    def error_code(self) -> str:
        """The wire text, ``reason:key``."""

class Reservation:
    """The answer to one reserve; truthy when granted."""

    @property
    def lease_id(self) -> str: ...
    @property
    def allowed(self) -> bool: ...
    @property
    def reserved_at_unix_ms(self) -> int: ...
    @property
    def denial(self) -> Optional[Denial]: ...
    @property
    def retry_after_ms(self) -> int: ...
    def __bool__(self) -> bool: ...

class MemoryLimiter:
    """The library's memory backend."""

    def __init__(
        self, *, leases_max: Optional[int] = None, settled_leases_max: Optional[int] = None,
        failed_leases_max: Optional[int] = None, decrease_retry_ms: Optional[int] = None,
        manual_clock_unix_ms: Optional[int] = None, decrease_check_interval_ms: Optional[int] = None,
    ) -> None: ...
    def reserve(self, requirements: _Pairs, *, lease_id: Optional[str] = None, job_id: Optional[str] = None) -> Reservation: ...
    def complete(self, lease_id: str, actuals: Optional[_Pairs] = None, *, job_id: Optional[str] = None) -> None: ...
    def define(self, definition_json: str) -> str: ...
    def load_limits_file(self, path: str) -> int: ...
    def limits(self) -> str: ...
    def limit(self, key: str) -> Optional[str]: ...
    def apply_pending_decreases(self) -> int: ...
    def advance_clock_ms(self, ms: int) -> None: ...
    def pause(self, keys: List[str], duration_ms: int) -> None: ...

class RemoteLimiter:
    """The library's HTTP client to ratelimiterd."""

    def __init__(
        self, base_urls: Union[str, Sequence[str]], *, token: Optional[str] = None, request_timeout_ms: int = 2000,
        connect_timeout_ms: int = 1000, retries_max: int = 2, retry_wait_ms_max: int = 1000,
    ) -> None: ...
    def reserve(
        self, requirements: _Pairs, *, lease_id: Optional[str] = None, job_id: Optional[str] = None,
        traceparent: Optional[str] = None, tracestate: Optional[str] = None,
    ) -> Reservation: ...
    def complete(
        self, lease_id: str, actuals: Optional[_Pairs] = None, *, job_id: Optional[str] = None,
        traceparent: Optional[str] = None, tracestate: Optional[str] = None,
    ) -> None: ...
    def reserve_async(
        self, requirements: _Pairs, callback: _Callback, *, lease_id: Optional[str] = None, job_id: Optional[str] = None,
        traceparent: Optional[str] = None, tracestate: Optional[str] = None,
    ) -> None: ...
    def complete_async(
        self, lease_id: str, callback: _Callback, actuals: Optional[_Pairs] = None, *, job_id: Optional[str] = None,
        traceparent: Optional[str] = None, tracestate: Optional[str] = None,
    ) -> None: ...
    def define(self, definition_json: str) -> str: ...
    def limits(self) -> str: ...
    def limit(self, key: str) -> Optional[str]: ...
    def pause(self, keys: List[str], duration_ms: int) -> None: ...
