"""Checks of the Python layer's own arguments, so that every bad argument of
the package raises its typed error (:class:`ArgumentTypeError` for a wrong
type, :class:`InvalidArgumentError` for a wrong value, each naming the
argument) before anything is done, as the Rust core does for the arguments it
reads itself."""

from __future__ import annotations

import math
from typing import Any, Optional, Sequence, Tuple

from .errors import ArgumentTypeError, InvalidArgumentError

#: The largest value of the core's unsigned 64-bit integers.
U64_MAX = 2**64 - 1


def _type_name(value: Any) -> str:
    return type(value).__name__


def uint(name: str, value: Any, *, minimum: int = 0, maximum: int = U64_MAX) -> int:
    """An ``int`` (not a ``bool``) within ``minimum..=maximum``."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise ArgumentTypeError(f"{name} must be an int, got {_type_name(value)}", field=name)
    if not minimum <= value <= maximum:
        raise InvalidArgumentError(f"{name} must be {minimum}..={maximum}, got {value}", field=name)
    return value


def optional_uint(name: str, value: Any, *, minimum: int = 0, maximum: int = U64_MAX) -> Optional[int]:
    """``None`` or :func:`uint`."""
    return None if value is None else uint(name, value, minimum=minimum, maximum=maximum)


def seconds(name: str, value: Any) -> float:
    """A finite, non-negative ``int`` or ``float`` of seconds."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise ArgumentTypeError(f"{name} must be a number of seconds, got {_type_name(value)}", field=name)
    if not math.isfinite(value) or value < 0:
        raise InvalidArgumentError(f"{name} must be a finite number of seconds >= 0, got {value}", field=name)
    return float(value)


def optional_str(name: str, value: Any) -> Optional[str]:
    """``None`` or a ``str``."""
    if value is not None and not isinstance(value, str):
        raise ArgumentTypeError(f"{name} must be a str or None, got {_type_name(value)}", field=name)
    return value


def urls(name: str, value: Any) -> Tuple[str, ...]:
    """One URL (``str``) or a sequence of them (not ``bytes``), as a tuple."""
    if isinstance(value, str):
        return (value,)
    if not isinstance(value, Sequence) or isinstance(value, (bytes, bytearray)):
        raise ArgumentTypeError(f"{name} must be a str or a sequence of str, got {_type_name(value)}", field=name)
    for index, url in enumerate(value):
        if not isinstance(url, str):
            raise ArgumentTypeError(f"{name}[{index}] must be a str, got {_type_name(url)}", field=name)
    return tuple(value)


def pairs(name: str, value: Any) -> list:
    """``(key, amount)`` pairs as a list; the core checks keys and amounts."""
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise ArgumentTypeError(f"{name} must be a sequence of (key, amount) pairs, got {_type_name(value)}",
                                field=name)
    out = []
    for index, pair in enumerate(value):
        if isinstance(pair, (str, bytes)) or not isinstance(pair, Sequence) or len(pair) != 2:
            raise ArgumentTypeError(f"{name}[{index}] must be a (key, amount) pair, got {_type_name(pair)}",
                                    field=f"{name}[{index}]")
        out.append((pair[0], pair[1]))
    return out


def callable_(name: str, value: Any) -> Any:
    """A callable."""
    if not callable(value):
        raise ArgumentTypeError(f"{name} must be callable, got {_type_name(value)}", field=name)
    return value
