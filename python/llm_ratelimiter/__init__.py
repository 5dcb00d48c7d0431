"""Rate limiting for LLM calls, in this process or against ``ratelimiterd``.

Every limiting decision is made by the Rust library ``ratelimiter``: all or
nothing across requests and tokens per minute, calls in flight and tenant
budgets; reserve an upper bound, then reconcile to the usage; holds that end by
themselves when a caller crashes. See the package README for examples.
"""

from ._native import REQUIREMENTS_MAX, Denial, Reservation, new_lease_id
from .errors import (
    ArgumentTypeError,
    BackendError,
    InternalError,
    InvalidArgumentError,
    JobNotRunError,
    LimitConflictError,
    LimiterUnavailableError,
    QueueFullError,
    RateLimiterError,
    ReservationDeniedError,
    ReservationTimeoutError,
    SchedulerClosedError,
    UnknownLimitKeyError,
)
from .headers import LimitMismatch, ProviderHeaders, ProviderLimit, read_provider_headers
from .limiter import PAUSE_MS_MAX, Lease, Limiter, LlmLease, RemoteLimiter
from .limits import PROFILE_PROVIDERS, Actual, LimitDefinition, LimitReport, Requirement, llm_limits
from .llm import LlmCall, usage_tokens
from .scheduler import JobResult, Scheduler, ShutdownReport

__all__ = [
    "PAUSE_MS_MAX",
    "PROFILE_PROVIDERS",
    "REQUIREMENTS_MAX",
    "Actual",
    "ArgumentTypeError",
    "BackendError",
    "Denial",
    "InternalError",
    "InvalidArgumentError",
    "JobNotRunError",
    "JobResult",
    "Lease",
    "LimitConflictError",
    "LimitDefinition",
    "LimitMismatch",
    "LimitReport",
    "Limiter",
    "LimiterUnavailableError",
    "LlmCall",
    "LlmLease",
    "ProviderHeaders",
    "ProviderLimit",
    "QueueFullError",
    "RateLimiterError",
    "RemoteLimiter",
    "Requirement",
    "Reservation",
    "ReservationDeniedError",
    "ReservationTimeoutError",
    "Scheduler",
    "SchedulerClosedError",
    "ShutdownReport",
    "UnknownLimitKeyError",
    "llm_limits",
    "new_lease_id",
    "read_provider_headers",
    "usage_tokens",
]
