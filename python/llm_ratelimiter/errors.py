"""Exceptions raised by the package.

A denial is never an exception: :meth:`Limiter.reserve` returns a
:class:`Reservation` whose ``denial`` says why. Exceptions are for bad input
(``TypeError`` / ``ValueError`` subclasses that name the argument), for
operating failures (an unreachable server: retryable, carrying the lease id),
and for the scheduler and context managers, which turn waiting into a result.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:  # pragma: no cover
    from ._native import Denial

__all__ = [
    "RateLimiterError",
    "InvalidArgumentError",
    "ArgumentTypeError",
    "UnknownLimitKeyError",
    "LimitConflictError",
    "LimiterUnavailableError",
    "BackendError",
    "InternalError",
    "ReservationDeniedError",
    "ReservationTimeoutError",
    "QueueFullError",
    "SchedulerClosedError",
    "JobNotRunError",
]


class RateLimiterError(Exception):
    """Base class of every exception of this package."""

    #: True when the same call may succeed if retried (with the same lease id).
    retryable: bool = False


class InvalidArgumentError(RateLimiterError, ValueError):
    """An argument has the right type but a wrong value; ``field`` names it."""

    def __init__(self, message: str, *, field: str = "") -> None:
        super().__init__(message)
        self.field = field


class ArgumentTypeError(RateLimiterError, TypeError):
    """An argument has the wrong type; ``field`` names it."""

    def __init__(self, message: str, *, field: str = "") -> None:
        super().__init__(message)
        self.field = field


class UnknownLimitKeyError(InvalidArgumentError):
    """A requirement or actual names a limit that is not defined (HTTP 404)."""

    def __init__(self, message: str, *, key: str = "") -> None:
        super().__init__(message, field="requirements")
        self.key = key


class LimitConflictError(InvalidArgumentError):
    """The call conflicts with existing state: a limit's kind cannot change, a
    lease id cannot be reused with other requirements (HTTP 409)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, field="definition")


class LimiterUnavailableError(RateLimiterError):
    """The limiter did not answer (timeout, connection refused, 503 after the
    client's retries): the outcome is unknown.

    Retry with the **same** ``lease_id`` after ``retry_after_ms``: a reserve that
    did happen is then answered with its original outcome and reserves nothing
    twice.
    """

    retryable = True

    def __init__(self, message: str, *, lease_id: Optional[str] = None, retry_after_ms: int = 0) -> None:
        super().__init__(message)
        self.lease_id = lease_id
        self.retry_after_ms = retry_after_ms


class BackendError(RateLimiterError):
    """The limiter answered something unexpected (HTTP 500)."""


class InternalError(RateLimiterError):
    """A bug inside the Rust limiter (a panic), caught at the boundary."""


class ReservationDeniedError(RateLimiterError):
    """A reservation can never be granted (``denial.is_final``), so waiting was
    pointless: the amount exceeds a limit's whole capacity."""

    def __init__(self, message: str, *, denial: "Denial") -> None:
        super().__init__(message)
        self.denial = denial


class ReservationTimeoutError(RateLimiterError, TimeoutError):
    """No reservation was granted before the deadline; ``denial`` is the last answer."""

    def __init__(self, message: str, *, denial: Optional["Denial"]) -> None:
        super().__init__(message)
        self.denial = denial


class QueueFullError(RateLimiterError):
    """The scheduler already holds its maximum of queued jobs; nothing was queued."""


class SchedulerClosedError(RateLimiterError):
    """The scheduler is shutting down or shut down; nothing was queued."""


class JobNotRunError(RateLimiterError):
    """The job never ran: the scheduler shut down before its turn. Nothing was
    reserved for it, so it is safe to submit again elsewhere."""

    def __init__(self, message: str, *, job_id: str = "") -> None:
        super().__init__(message)
        self.job_id = job_id
